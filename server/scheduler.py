"""Per-GPU exclusive leases, granted first come first served."""
from __future__ import annotations

import asyncio


class LeaseScheduler:
    def __init__(self, gpu_ids: list[int]) -> None:
        self._locks = {g: asyncio.Lock() for g in gpu_ids}  # asyncio.Lock wakes waiters in FIFO order
        self._depth = {g: 0 for g in gpu_ids}

    @property
    def gpu_ids(self) -> list[int]:
        return list(self._locks)

    def depth(self, gpu_id: int) -> int:
        """Programs holding or waiting for this GPU."""
        return self._depth[gpu_id]

    async def acquire(self, gpu_id: int) -> None:
        self._depth[gpu_id] += 1
        try:
            await self._locks[gpu_id].acquire()
        except BaseException:
            self._depth[gpu_id] -= 1
            raise

    def release(self, gpu_id: int) -> None:
        self._locks[gpu_id].release()
        self._depth[gpu_id] -= 1
