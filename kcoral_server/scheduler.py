"""Per-GPU exclusive leases, granted first come first served, with the time each GPU
was held (what /health reports, so a client can tell how busy the GPUs were)."""
from __future__ import annotations

import asyncio
import time


class LeaseScheduler:
    def __init__(self, gpu_ids: list[int]) -> None:
        self._locks = {g: asyncio.Lock() for g in gpu_ids}  # asyncio.Lock wakes waiters in FIFO order
        self._depth = {g: 0 for g in gpu_ids}
        self._held_total = {g: 0.0 for g in gpu_ids}
        self._held_since: dict[int, float] = {}

    @property
    def gpu_ids(self) -> list[int]:
        return list(self._locks)

    def depth(self, gpu_id: int) -> int:
        """Programs holding or waiting for this GPU."""
        return self._depth[gpu_id]

    def held_seconds(self, gpu_id: int) -> float:
        """Seconds this GPU has been leased since the server started, the current lease included."""
        since = self._held_since.get(gpu_id)
        return self._held_total[gpu_id] + (time.monotonic() - since if since is not None else 0.0)

    async def acquire(self, gpu_id: int) -> None:
        self._depth[gpu_id] += 1
        try:
            await self._locks[gpu_id].acquire()
        except BaseException:
            self._depth[gpu_id] -= 1
            raise
        self._held_since[gpu_id] = time.monotonic()

    def release(self, gpu_id: int) -> None:
        since = self._held_since.pop(gpu_id, None)
        if since is not None:
            self._held_total[gpu_id] += time.monotonic() - since
        self._locks[gpu_id].release()
        self._depth[gpu_id] -= 1
