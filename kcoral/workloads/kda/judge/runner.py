"""Server-side runner of `kcoral bench` (uploaded as a module; standard library only).

`bench(archive, seeds, options)` unpacks the bench archive (judge/, workload.json,
candidate/, optional against/) into a fresh directory under the request's workspace and
runs `python -m judge` there in a subprocess: a crash or a hang of the candidate cannot
take the worker down, and the holdout seeds travel on the subprocess's stdin only.
"""
from __future__ import annotations

import ctypes
import hashlib
import hmac
import io
import json
import os
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile

LOG_LIMIT = 64 * 1024  # bytes of the judge's stderr (candidate prints included) kept
MAX_ARCHIVE_BYTES = 1 << 30  # of the archive, and of the file contents it unpacks to
MAX_MEMBERS = 100_000
# Environment variables the judge's subprocess never gets, whatever the worker has.
PRIVATE_ENV_PREFIXES = ("KCORAL_HOLDOUT", "KCORAL_TOKEN", "KCORAL_SALT")


class UnpackError(ValueError):
    pass


def _member_path(name: str) -> str:
    if not name or "\x00" in name or "\\" in name or name.startswith("/"):
        raise UnpackError(f"refused archive path {name!r}")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise UnpackError(f"refused archive path with '..': {name!r}")
    return "/".join(parts)


def unpack(archive: bytes, dest: str) -> list[str]:
    """Extract regular files and directories only; refuse links, devices, absolute paths,
    '..' and anything that would pass through an existing symbolic link."""
    if len(archive) > MAX_ARCHIVE_BYTES:
        raise UnpackError("archive too large")
    written = []
    total = count = 0
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tar:
        for member in tar:
            count += 1
            if count > MAX_MEMBERS:
                raise UnpackError(f"archive has more than {MAX_MEMBERS} entries")
            rel = _member_path(member.name)
            if member.issym() or member.islnk():
                raise UnpackError(f"refused link in archive: {member.name!r}")
            if not (member.isreg() or member.isdir()):
                raise UnpackError(f"refused special entry in archive: {member.name!r}")
            if rel == "":
                continue
            if member.isreg():
                total += member.size  # a small compressed archive can unpack to a huge tree
                if total > MAX_ARCHIVE_BYTES:
                    raise UnpackError("archive too large once unpacked")
            target = os.path.join(dest, *rel.split("/"))
            # Every existing component must be a real directory, never a link.
            probe = dest
            for part in rel.split("/")[:-1]:
                probe = os.path.join(probe, part)
                if os.path.islink(probe) or (os.path.exists(probe) and not os.path.isdir(probe)):
                    raise UnpackError(f"refused path through a link or file: {member.name!r}")
            if member.isdir():
                os.makedirs(target, mode=0o700, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
            if os.path.lexists(target):
                raise UnpackError(f"duplicate archive entry: {member.name!r}")
            src = tar.extractfile(member)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(src.read())
            written.append(rel)
    return written


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(PRIVATE_ENV_PREFIXES)}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def children_by_parent() -> dict:
    """{parent pid: [child pids]} of every live process (Linux /proc; empty elsewhere)."""
    children: dict = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return children
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    return children


def _descendants(root: int) -> list:
    """Every live descendant of `root`."""
    children = children_by_parent()
    out, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def _kill_tree(proc) -> None:
    for pid in [proc.pid] + _descendants(proc.pid):
        try:
            os.kill(pid, 9)
        except (ProcessLookupError, PermissionError):
            pass


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


def bench(archive: bytes, seeds, options: dict) -> dict:
    _not_dumpable()
    options = dict(options or {})
    timeout = float(options.get("timeout_s", 1500))
    root = tempfile.mkdtemp(prefix="bench-", dir=os.getcwd())
    try:  # removed in every case: a stock server may reuse its working directory
        return _bench_in(root, archive, seeds, options, timeout)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _bench_in(root: str, archive: bytes, seeds, options: dict, timeout: float) -> dict:
    try:
        unpack(bytes(archive), root)
    except (UnpackError, tarfile.TarError, OSError) as exc:
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
        _kill_tree(proc)  # the judge and anything the candidate started
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
