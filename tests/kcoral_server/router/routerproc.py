"""The released KCoral router (`kcoral-router` from the pinned kcoral 0.1.1 wheel), run on
loopback for tests, and the nodes that join it.

The binary comes out of the wheel tests/kcoral/compat/upstream.py installs (cached), copied into
a temporary folder; without the package index the router tests skip, saying why.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

import httpx

from tests.kcoral.compat.stock_for_client import StockServer
from tests.kcoral.compat.upstream import Release, UpstreamUnavailable, install
from tests.serverproc import ServerProcess

RELEASE = Release.V0_1_1   # the router's wire protocol is pinned to this release
NODE_TOKEN = "router-test-node-token-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def extract_router(cache_root: Path, dest: Path) -> Path:
    """Copy `kcoral-router` out of the cached upstream install into `dest`; raises
    UpstreamUnavailable when the wheel cannot be had."""
    target = install(RELEASE, cache_root)
    binary = target / "bin" / "kcoral-router"
    if not binary.is_file():
        raise UpstreamUnavailable(f"kcoral=={RELEASE.value} installed without bin/kcoral-router "
                                  "(not a manylinux x86_64 wheel?)")
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / "kcoral-router"
    shutil.copy2(binary, out)
    out.chmod(0o755)
    return out


class RouterProcess:
    """`kcoral-router` on 127.0.0.1:port; `kill()` is a crash, `start()` again reuses the port."""

    def __init__(self, binary: Path, port: int | None = None, token: str = NODE_TOKEN) -> None:
        self.binary = binary
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = token
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = Path(tempfile.mkdtemp(prefix="kcoral-router-")) / "router.log"
        weakref.finalize(self, shutil.rmtree, self.log_path.parent, True)   # the log goes with the object

    def start(self, timeout: float = 20.0) -> "RouterProcess":
        env = {k: v for k, v in os.environ.items() if not k.startswith("KCORAL")}
        env["KCORAL_NODE_TOKEN"] = self.token
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([str(self.binary), "--host", "127.0.0.1", "--port", str(self.port)],
                                     stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kcoral-router exited {self.proc.returncode}:\n{self.log()}")
            try:
                httpx.get(f"{self.url}/health", timeout=1)   # 503 until a node joins
                return self
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError(f"kcoral-router did not listen in {timeout:.0f} s:\n{self.log()}")

    def kill(self) -> None:
        """SIGKILL: a crash. (Its SIGTERM drain waits for the nodes' streams, which never end.)"""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    stop = kill

    def health(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/health", timeout=5).json()

    def wait_capacity(self, slots: int, timeout: float = 60.0) -> dict[str, Any]:
        """The router's health once its nodes hold exactly `slots` slots."""
        deadline = time.monotonic() + timeout
        health: dict[str, Any] = {}
        while time.monotonic() < deadline:
            try:
                health = self.health()
            except httpx.HTTPError:
                health = {}
            if (health.get("load") or {}).get("request_capacity") == slots and health.get("status") == "ok":
                return health
            time.sleep(0.1)
        raise AssertionError(f"router capacity never reached {slots}: {health}\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""


def our_node(router: RouterProcess, node_id: str, workers: int = 1, extra: list[str] | None = None) -> ServerProcess:
    """Our CPU server joined to `router` as `node_id` (started; the caller stops it)."""
    return ServerProcess(["--cpu-workers", str(workers), "--router", router.url, "--node-id", node_id,
                          *(extra or [])], env={"KCORAL_NODE_TOKEN": router.token}).start()


def kill_server(srv: ServerProcess) -> None:
    """SIGKILL a server's whole process group (workers included): a crashed host."""
    assert srv.proc is not None
    os.killpg(srv.proc.pid, signal.SIGKILL)
    srv.proc.wait(10)


class StockNode(StockServer):
    """A released server joined as a node the released way: `kcoral server --router URL
    --node-id ID` (the wheel's `kcoral-node` supervises it and reports for it)."""

    def __init__(self, paths: list[Path], router: RouterProcess, node_id: str) -> None:
        super().__init__(RELEASE.value, paths)
        self.router, self.node_id = router, node_id
        bindir = paths[0] / "bin"
        self.env["PATH"] = os.pathsep.join([str(bindir), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        self.env["KCORAL_NODE_TOKEN"] = router.token

    workers = 1

    def extra_args(self) -> list[str]:
        return ["--router", self.router.url, "--node-id", self.node_id]

    def name(self) -> str:
        return "stock node"

    def start(self, timeout: float = 90.0) -> "StockNode":
        super().start(timeout)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        shutil.rmtree(self.workdir, ignore_errors=True)
