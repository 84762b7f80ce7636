"""An embedded benchmark server for runs with no --remote: `python -m kcoral_server` on loopback
with a free port (CPU workers when this machine has no GPU), stopped at the end."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from kcoral.remote import is_private_env


class EmbeddedServerError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child: ask Linux to SIGTERM the server if evolve dies (even by SIGKILL)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the server outlives a killed evolve; stop() still covers normal exits


def server_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """evolve's environment minus its credentials and settings: the server hands its own
    environment to the workers that import candidates, so `$EVOLVE_DB` or the token there
    would be the candidate's too. A value holding the token goes with it."""
    environ = dict(os.environ if environ is None else environ)
    secrets = [environ[k] for k in environ if k.upper().startswith(("KCORAL_TOKEN", "KCORAL_SERVER_TOKEN"))
               and environ[k]]
    return {k: v for k, v in environ.items()
            if not is_private_env(k) and not any(secret in v for secret in secrets)}


def has_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def baseline_cache_dir(environ: dict[str, str] | None = None) -> Path:
    """Where the embedded server's baseline compile cache lives: this user's own cache."""
    environ = dict(os.environ if environ is None else environ)
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kcoral-evolve" / "baseline"


def trusted_baseline_cache(workload: str | Path, cache: Path | None = None) -> Path | None:
    """A GPU workload timed against fla: compile its baseline once into this user's cache
    (`kcoral baseline-cache`, about 90 s the first time on an H200, seconds after) and
    return the folder for the embedded server's --trusted-cache; each bench then starts
    from it instead of compiling fla again. None (benches compile as before) for other
    workloads, or when the compile fails, which is said."""
    from kcoral.bench.staging import BenchInputError, load_workload

    try:
        spec = load_workload(workload).spec
    except BenchInputError:
        return None  # the run's own checks report a bad workload
    if spec.get("device") != "cuda" or spec.get("baseline", "fla") != "fla":
        return None
    cache = cache or baseline_cache_dir()
    print(f"evolve: compiling the {spec.get('name')} baseline for this machine's benches into {cache} "
          "(about 90 s the first time)", file=sys.stderr)
    # Its progress and errors go to our stderr as they come (a first compile takes minutes).
    proc = subprocess.run([sys.executable, "-m", "kcoral", "baseline-cache", str(cache), str(workload)],
                          stdout=subprocess.DEVNULL, env=server_environment())
    if proc.returncode != 0:
        print(f"evolve: the baseline cache could not be made (exit status {proc.returncode}, above), "
              "so each bench compiles fla itself", file=sys.stderr)
        return None
    return cache


class EmbeddedServer:
    """Context manager: `with EmbeddedServer() as url: ...`. With a `workload` on a GPU
    machine, its baseline's compile cache is made first and served (trusted_baseline_cache)."""

    def __init__(self, cpu_workers: int = 2, startup_timeout_s: float = 60.0, extra_args: list[str] | None = None,
                 workload: str | Path | None = None):
        self.cpu_workers = cpu_workers
        self.startup_timeout_s = startup_timeout_s
        self.extra_args = extra_args or []
        self.workload = workload
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self._logdir: str | None = None

    def start(self) -> str:
        port = free_port()
        cmd = [sys.executable, "-m", "kcoral_server", "--host", "127.0.0.1", "--port", str(port), *self.extra_args]
        if not has_gpu():
            cmd += ["--cpu-workers", str(self.cpu_workers)]
        elif self.workload is not None and "--trusted-cache" not in self.extra_args:
            cache = trusted_baseline_cache(self.workload)
            if cache is not None:
                cmd += ["--trusted-cache", str(cache)]
        self._logdir = tempfile.mkdtemp(prefix="evolve-server-")
        log = open(Path(self._logdir) / "server.log", "wb")  # kept open for the child
        # Its own process group, so a terminal's Ctrl-C reaches us first and we stop it in order.
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env=server_environment(), preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        log.close()
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EmbeddedServerError(f"embedded server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return self.url
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise EmbeddedServerError(f"embedded server did not answer within {self.startup_timeout_s:.0f} s")

    def log_tail(self, n: int = 4000) -> str:
        if not self._logdir:
            return ""
        path = Path(self._logdir) / "server.log"
        return path.read_bytes()[-n:].decode(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)  # drains in-flight work
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self._logdir:
            shutil.rmtree(self._logdir, ignore_errors=True)
