"""Start a real `python -m kcoral_server` on loopback for tests.

    with ServerProcess(["--cpu-workers", "2"]) as srv:
        Client(srv.url).execute(...)

The server picks a free port itself (--port 0) and logs it; stderr goes to a log file
whose text is available as `srv.log()` (and is printed if startup fails).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parent.parent


class ServerProcess:
    def __init__(self, args: list[str] | None = None, env: dict[str, str] | None = None,
                 startup_timeout: float = 60.0, token: str | None = None) -> None:
        self.args = list(args or [])
        self.extra_env = dict(env or {})
        self.startup_timeout = startup_timeout
        self.token = token if token is not None else self.extra_env.get("KCORAL_SERVER_TOKEN")
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.port = 0
        self.instance_id = ""
        self._logdir = tempfile.mkdtemp(prefix="kcoral-srvlog-")
        self.log_path = Path(self._logdir) / "server.log"
        # The log outlives stop() (tests read it after a crash) and goes with the object.
        weakref.finalize(self, shutil.rmtree, self._logdir, True)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "ServerProcess":
        env = {**os.environ, **self.extra_env}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
        args = [sys.executable, "-m", "kcoral_server", "--host", "127.0.0.1"]
        if "--port" not in self.args:
            args += ["--port", "0"]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args + self.args, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env, cwd=str(REPO_ROOT), start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            for event in self.events():
                if event.get("event") == "listening":
                    self.port = int(event["port"])
                    self.url = f"http://127.0.0.1:{self.port}"
                    self.instance_id = event.get("instance_id", "")
            if self.url and self._healthy():
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"server did not become healthy in {self.startup_timeout}s:\n{self.log()}")

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM (graceful drain), then SIGKILL of the group if it hangs; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------ inspection
    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log().splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out

    def request_logs(self) -> list[dict[str, Any]]:
        return [e for e in self.events() if e.get("event") == "request"]

    def health(self) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return httpx.get(f"{self.url}/health", headers=headers, timeout=5).json()
