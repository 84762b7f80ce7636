"""Server-side runner of `kcoral bench` (uploaded as a module; standard library only).

Uploaded after the sandbox module it imports (`kcoral.runners.bench_runner_source`): its
unpacker, path rules and process-tree kill are those of every remote runner.

`bench(archive, seeds, options)` unpacks the bench archive (judge/, workload.json,
candidate/, optional against/) into a fresh directory under the request's workspace and
runs `python -m judge` there in a subprocess: a crash or a hang of the candidate cannot
take the worker down, and the holdout seeds travel on the subprocess's stdin only.
"""
from __future__ import annotations

import ctypes
import hashlib
import hmac
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from typing import Any

try:  # inside the uploaded bundle the prelude injects the sandbox module
    _sandboxed = _KCORAL_EMBEDDED["sandboxed"]  # type: ignore[name-defined]
except NameError:  # imported as a normal module (tests, local use)
    from kcoral.runners import sandboxed as _sandboxed

LOG_LIMIT = 64 * 1024  # bytes of the judge's stderr (candidate prints included) kept
MAX_ARCHIVE_BYTES = 1 << 30  # of the archive, and of the file contents it unpacks to
MAX_MEMBERS = 100_000
# Environment variables the judge's subprocess never gets, whatever the worker has.
PRIVATE_ENV_PREFIXES = ("KCORAL_HOLDOUT", "KCORAL_TOKEN", "KCORAL_SALT")


def unpack(archive: bytes, dest: str) -> list[str]:
    """Extract regular files and directories only (`sandboxed.safe_unpack`), within this
    runner's limits on the archive and on what it unpacks to."""
    if len(archive) > MAX_ARCHIVE_BYTES:
        raise _sandboxed.ArchiveError("archive too large")
    return _sandboxed.safe_unpack(archive, dest, max_total_bytes=MAX_ARCHIVE_BYTES,
                                  max_members=MAX_MEMBERS)


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(PRIVATE_ENV_PREFIXES)}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _not_dumpable() -> None:
    """No same-uid process (a candidate's host) may read this worker's memory or reopen its
    descriptors (the judge's report pipe) through /proc."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    except Exception:  # noqa: BLE001 - not Linux
        pass


def _verified(out: bytes, key: str) -> tuple[dict | None, str]:
    """The judge's report if it carries the one-time key's signature."""
    try:
        doc = json.loads(out)
        report, mac = doc["report"], doc["mac"]
        body = json.dumps(report, sort_keys=True).encode()
    except (ValueError, KeyError, TypeError) as exc:
        return None, f"judge wrote an unreadable report: {exc}"
    want = hmac.new(key.encode(), body, hashlib.sha256).hexdigest()
    if not isinstance(mac, str) or not hmac.compare_digest(mac, want):
        return None, "the report on the judge's pipe is not signed by the judge (forged): refused"
    return report, ""


def bench(archive: bytes, seeds: Any, options: dict) -> dict:
    _not_dumpable()
    options = dict(options or {})
    timeout = float(options.get("timeout_s", 1500))
    root = tempfile.mkdtemp(prefix="bench-", dir=os.getcwd())
    try:  # removed in every case: a stock server may reuse its working directory
        return _bench_in(root, archive, seeds, options, timeout)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _bench_in(root: str, archive: bytes, seeds: Any, options: dict, timeout: float) -> dict:
    try:
        unpack(bytes(archive), root)
    except (_sandboxed.ArchiveError, OSError) as exc:
        return {"report": None, "exit_code": None, "timed_out": False, "log": "",
                "runner_error": f"bad bench archive: {exc}"}
    for needed in ("judge/__main__.py", "workload.json", "candidate"):
        if not os.path.exists(os.path.join(root, needed)):
            return {"report": None, "exit_code": None, "timed_out": False, "log": "",
                    "runner_error": f"bench archive lacks {needed}"}
    request = {
        "holdout_seeds": [int(s) for s in (seeds or [])],
        "holdout_source": options.get("holdout_source", "server"),
        "candidate_name": options.get("candidate_name", "candidate"),
        "against_name": options.get("against_name"),
        "report_key": secrets.token_hex(32),
        "timeout_s": timeout,   # the judge re-measures a refused trial only when time is left
    }
    # The judge stays in the worker's process group: when the server kills a timed-out
    # worker's group, the judge and everything the candidate started die with it.
    proc = subprocess.Popen(
        [sys.executable, "-m", "judge", root], cwd=root, env=_env(),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    timed_out = False
    try:
        out, err = proc.communicate(json.dumps(request).encode(), timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _sandboxed.kill_tree(proc)  # the judge and anything the candidate started
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # an escaped grandchild still holds the pipes
            proc.kill()
            out, err = b"", b""
    report = None
    runner_error = ""
    if out.strip():
        report, runner_error = _verified(out, request["report_key"])
    elif not timed_out:
        runner_error = f"judge exited with status {proc.returncode} and no report (crash?)"
    log = err[-LOG_LIMIT:].decode("utf-8", "replace")
    return {"report": report, "exit_code": proc.returncode, "timed_out": timed_out, "log": log,
            "runner_error": runner_error}
