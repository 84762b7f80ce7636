"""A stock (released) KCoral server from PyPI, for testing our client against it.

Both distributions install a package named `kcoral`, so the released wheel never enters
the project's environment: each version goes into a directory of its own
(`pip install --no-deps --target`), the server's runtime dependencies into another, and
the server runs as `python -P` with only those directories on PYTHONPATH, from a working
directory outside the repository. Installs are cached under ~/.cache (XDG_CACHE_HOME).
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.kcoral.compat.cachelock import install_lock

STOCK_VERSIONS = ("0.1.0", "0.1.1")
# What the stock server needs beyond what our environment has (fastapi; uvicorn for a
# version the released server was built against). Pinned so a run is reproducible.
SERVER_DEPS = ("fastapi==0.165.0", "uvicorn==0.55.0")


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kcoral-evolve-tests" / "stock"


def _pip_target(dest: Path, requirements: list[str], no_deps: bool) -> None:
    """Install into `dest` once (built in a scratch directory, renamed when complete)."""
    if (dest / ".complete").is_file():
        return
    with install_lock(dest):
        if (dest / ".complete").is_file():   # another worker installed it while this one waited
            return
        scratch = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
               "--no-input", "--target", str(scratch), *(["--no-deps"] if no_deps else []), *requirements]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            shutil.rmtree(scratch, ignore_errors=True)
            raise RuntimeError(f"cannot install {' '.join(requirements)} from PyPI (is it reachable?):\n"
                               f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        (scratch / ".complete").write_text("\n".join(requirements) + "\n")
        shutil.rmtree(dest, ignore_errors=True)   # an incomplete leftover of a killed run
        scratch.rename(dest)


def install(version: str) -> list[Path]:
    """The PYTHONPATH entries of stock `kcoral==version` and its server's dependencies."""
    root = cache_root()
    package = root / f"kcoral-{version}"
    deps = root / "server-deps"
    _pip_target(package, [f"kcoral=={version}"], no_deps=True)
    _pip_target(deps, list(SERVER_DEPS), no_deps=False)
    return [package, deps]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class StockServer:
    """`python -P -m kcoral server --device cpu --sandbox none` on loopback."""

    def __init__(self, version: str, paths: list[Path]) -> None:
        self.version = version
        self.paths = paths
        self.workdir = Path(tempfile.mkdtemp(prefix=f"kcoral-stock-{version}-"))
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "KCORAL"))}
        self.env.update(PYTHONPATH=os.pathsep.join(str(p) for p in paths), HOME=str(self.workdir),
                        XDG_CACHE_HOME=str(self.workdir / "xdg-cache"), PYTHONDONTWRITEBYTECODE="1")
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def python(self, code: str) -> str:
        """Run `code` with the server's interpreter and path (to check what it imports)."""
        out = subprocess.run([sys.executable, "-P", "-c", code], env=self.env, cwd=self.workdir,
                             capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(out.stderr)
        return out.stdout.strip()

    workers = 2

    def extra_args(self) -> list[str]:
        """Flags a subclass adds to the stock server's command line."""
        return []

    def name(self) -> str:
        return f"stock server {self.version}"

    def start(self, timeout: float = 60.0) -> "StockServer":
        args = [sys.executable, "-P", "-m", "kcoral", "server", "--device", "cpu", "--num-workers", str(self.workers),
                "--sandbox", "none", "--host", "127.0.0.1", "--port", str(self.port), *self.extra_args(),
                "--log-dir", str(self.workdir / "logs"), "--disk-cache-dir", str(self.workdir / "cache")]
        log = open(self.workdir / "server.log", "wb")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                     cwd=self.workdir, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name()} exited:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.name()} did not start in {timeout:.0f} s:\n{self.log()}")

    def log(self) -> str:
        try:
            return (self.workdir / "server.log").read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(5)
        shutil.rmtree(self.workdir, ignore_errors=True)
