"""One real sandbox's lifecycle: started, killed, reaped once however many wait for it."""
from __future__ import annotations

import asyncio
import os

import pytest

from kcoral_server.sandbox import SandboxLimits, SandboxMode, SandboxPolicy
from kcoral_server.sandboxproc import SandboxProcess


@pytest.fixture(scope="module")
def policy() -> SandboxPolicy:
    p = SandboxPolicy(SandboxMode.BWRAP, SandboxLimits())
    why = p.probe()
    if why is not None:
        pytest.skip(f"no sandbox here: {why}")
    return p


def test_waiters_share_one_reaping_and_close_the_pidfd_once(policy, tmp_path) -> None:
    # A worker's sandbox is waited for by whoever disposes of it, sometimes twice at once
    # (its release and a kill). Each wait closed the pidfd: the second close took the
    # number another request's descriptor had been given meanwhile (EBADF there).
    async def main() -> None:
        box = await SandboxProcess.start(policy, gpu=False)
        box.kill()
        first = asyncio.ensure_future(box.wait())
        second = asyncio.ensure_future(box.wait())
        await first
        # The pidfd's number is free again: an unrelated descriptor may take it now.
        reused = os.open(tmp_path / "bystander", os.O_RDWR | os.O_CREAT)
        await asyncio.wait_for(second, 15)
        await box.wait()  # a late caller returns at once
        try:
            os.fstat(reused)  # still open: nobody closed it behind our back
        finally:
            os.close(reused)

    asyncio.run(main())
