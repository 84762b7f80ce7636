"""Hostile client programs and requests against a real server, each one a hole a red team
found after the sandbox was built (test_sandbox_escapes.py has the earlier ones): a
syscall ABI the seccomp filter let through, a kernel keyring shared by a slot's requests,
descriptors a request with many blobs left open in the server, a malformed reference
answered as the server's fault, a client key that named a job, memfd memory.

The tests need bubblewrap; they run against a real server process over loopback.
"""
from __future__ import annotations

import errno
import os
import platform
import resource
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

from kcoral import Client
from kcoral_server.engine import MAX_BLOBS_PER_PROGRAM
from kcoral_server.workspace import remove_tree
from tests.serverproc import ServerProcess

from .helpers import function_program, needs_request_memory, post_program, sha

REQUEST_MEMORY = 384 << 20


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    # One slot: every request runs as the same uid, as two requests of a busy slot do.
    args = ["--cpu-workers", "1", "--request-memory-bytes", str(REQUEST_MEMORY)]
    with ServerProcess(args, startup_timeout=120) as srv:
        yield srv


def _run(srv: ServerProcess, src: str, args: list[Any] | None = None, timeout: float = 30) -> Any:
    with Client(srv.url) as c:
        return c.execute(function_program(src, args=args or []), timeout_seconds=timeout)


# ---------------------------------------------------------------------- another syscall ABI
# A 64-bit process on x86_64 may still enter the kernel through the i386 ABI (`int 0x80`),
# whose numbers differ: setsid is 66, sched_setaffinity 241. The filter once allowed every
# syscall of an ABI other than the machine's own.
INT80 = r'''
import ctypes, os, struct

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]

def low_page(prot):
    """A private page below 4 GiB (MAP_32BIT): i386 syscalls see 32-bit pointers."""
    return libc.mmap(None, 4096, prot, 0x22 | 0x40, -1, 0)

def int80(nr, ebx=0, ecx=0, edx=0):
    """i386 syscall `nr`; its result, -errno on failure."""
    code = b"\x53\xb8" + struct.pack("<I", nr) + b"\xbb" + struct.pack("<I", ebx)
    code += b"\xb9" + struct.pack("<I", ecx) + b"\xba" + struct.pack("<I", edx) + b"\xcd\x80\x5b\xc3"
    page = low_page(7)
    ctypes.memmove(page, code, len(code))
    return ctypes.CFUNCTYPE(ctypes.c_int)(page)()
'''

ESCAPE = INT80 + r'''
def main():
    mine = sorted(os.sched_getaffinity(0))
    r, w = os.pipe()
    if os.fork() == 0:  # a new session for a child (the worker's own would end the request)
        sid = os.getsid(0)
        got = int80(66)
        os.write(w, f"{got} {sid} {os.getsid(0)}".encode())
        os._exit(0)
    os.close(w)
    os.wait()
    setsid, sid_before, sid_after = map(int, os.read(r, 100).split())
    mask = low_page(3)
    ctypes.memmove(mask, (1 << mine[-1]).to_bytes(128, "little"), 128)  # narrower: seen even on one CPU
    affinity = int80(241, 0, 128, mask)
    return [setsid, sid_before, sid_after, affinity, mine, sorted(os.sched_getaffinity(0))]
'''


def _ia32_emulation() -> bool:
    """Does this kernel take `int 0x80` from a 64-bit process (else it kills it)?"""
    probe = INT80 + "print(int80(20) == os.getpid())\n"  # i386 getpid
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30)
    return done.returncode == 0 and done.stdout.strip() == "True"


def test_the_i386_abi_cannot_leave_the_session_or_the_cpus(server: ServerProcess) -> None:
    # Through int 0x80 a program's child started a session of its own and the worker
    # widened its affinity to the other slot's CPU. Every i386 syscall is EPERM now.
    if platform.machine() != "x86_64":
        pytest.skip("int 0x80 is x86_64's second ABI; this machine is not x86_64")
    if not _ia32_emulation():
        pytest.skip("this kernel has no IA32 emulation: int 0x80 kills the caller")
    setsid, sid_before, sid_after, affinity, mine, after = _run(server, ESCAPE).raise_for_failure().results["out"]
    assert setsid == -errno.EPERM and sid_after == sid_before, f"i386 setsid returned {setsid}"
    assert affinity == -errno.EPERM and after == mine, f"i386 sched_setaffinity returned {affinity}"


# ---------------------------------------------------------------------- kernel keyrings
# (add_key, keyctl): the kernel keeps a uid's user keyring past its processes, and as
# root a slot's requests all run as one uid.
KEYRING_CALLS = {"x86_64": (248, 250), "aarch64": (217, 219)}

KEYRING = r'''
import ctypes, os

libc = ctypes.CDLL(None, use_errno=True)
USER_KEYRING = ctypes.c_int(-4)

def write(calls, name, data):
    add_key, _ = calls
    kid = libc.syscall(add_key, b"user", name.encode(), data.encode(), len(data), USER_KEYRING)
    return -ctypes.get_errno() if kid < 0 else kid

def read(calls, name):
    _, keyctl = calls
    kid = libc.syscall(keyctl, 10, USER_KEYRING, b"user", name.encode(), 0)  # KEYCTL_SEARCH
    if kid < 0:
        return None
    buf = ctypes.create_string_buffer(4096)
    n = libc.syscall(keyctl, 11, kid, buf, 4096)  # KEYCTL_READ
    return buf.raw[:max(n, 0)].decode()
'''


def test_nothing_carries_over_in_a_uids_keyring(server: ServerProcess) -> None:
    # One request stored data in its uid's user keyring and a later request of the slot
    # read it back, even from another server. The keyring calls are EPERM now.
    calls = KEYRING_CALLS.get(platform.machine())
    if calls is None:
        pytest.skip(f"keyring syscall numbers not known here for {platform.machine()}")
    name, data = f"kcoral-test-{secrets.token_hex(8)}", secrets.token_hex(16)
    with Client(server.url) as c:
        wrote = c.execute(function_program(KEYRING, name="write", args=[list(calls), name, data]),
                          timeout_seconds=30).raise_for_failure().results["out"]
        found = c.execute(function_program(KEYRING, name="read", args=[list(calls), name]),
                          timeout_seconds=30).raise_for_failure().results["out"]
    assert found is None, f"a later request read {found!r} from the keyring"
    assert wrote == -errno.EPERM, f"add_key returned {wrote}"


# ---------------------------------------------------------------------- blobs per program
def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _settled_fds(pid: int, at_most: int, within: float = 15) -> int:
    """The server's descriptor count once it is at most `at_most` (connections close and
    workers start in the background), or as it is after `within` seconds."""
    deadline = time.monotonic() + within
    while (n := _fds(pid)) > at_most and time.monotonic() < deadline:
        time.sleep(0.1)
    return n


def _blobs_program(n: int, tag: str) -> tuple[dict[str, Any], dict[str, bytes]]:
    """A program uploading `n` distinct tiny blobs, and the blobs."""
    blobs = {sha(data): data for data in (f"{tag}-{i:08d}".encode() for i in range(n))}
    ins = [{"op": "upload", "kind": "bytes", "id": f"b{i}", "blob": d} for i, d in enumerate(blobs)]
    return {"instructions": ins, "options": {"timeout_seconds": 30}}, blobs


def test_a_program_with_too_many_blobs_is_refused_and_leaves_no_descriptor_open() -> None:
    # 21,000 tiny distinct blobs in one request left the server holding ~20,000
    # descriptors until it was restarted: the open of each blob ran out partway (EMFILE)
    # and the ones already open were never closed. Here the server may open `headroom`
    # more than it holds at rest.
    headroom, slack = 256, 16  # slack: connections and workers coming and going
    with ServerProcess(["--cpu-workers", "1"], startup_timeout=120) as srv:
        assert srv.proc is not None
        pid = srv.proc.pid
        post_program(srv.url, *_blobs_program(2, "warm")).raise_for_status()
        time.sleep(2)  # the workers started ahead of need are up
        rest = _fds(pid)
        hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)[1]
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (rest + headroom, hard))

        r = post_program(srv.url, *_blobs_program(MAX_BLOBS_PER_PROGRAM + 1, "over"))
        assert r.status_code == 413 and r.json()["error"]["kind"] == "request_too_large", r.text
        assert f"at most {MAX_BLOBS_PER_PROGRAM}" in r.json()["error"]["message"]
        assert _settled_fds(pid, rest + slack) <= rest + slack, "the refused request left descriptors open"

        # Under the cap but past what the server may open: the open fails partway, and
        # closes what it had opened.
        assert 2 * headroom <= MAX_BLOBS_PER_PROGRAM
        post_program(srv.url, *_blobs_program(2 * headroom, "under"))
        assert _settled_fds(pid, rest + slack) <= rest + slack, "a failed open left descriptors open"
        post_program(srv.url, *_blobs_program(2, "after")).raise_for_status()


# ---------------------------------------------------------------------- malformed fn reference
def test_a_malformed_fn_reference_is_a_parse_error(server: ServerProcess) -> None:
    # Answered 500 `engine` (a validation error escaped the parser); the same mistake in
    # `module` was already 400 `parse`.
    prog = {"instructions": [
        {"op": "upload", "kind": "module", "id": "m", "source": "def f():\n    return 1\n"},
        {"op": "get_function", "id": "g", "module": {"$ref": "m"}, "name": "f"},
        {"op": "run", "id": "r", "fn": {"$rof": "g"}}]}
    r = post_program(server.url, prog)
    assert r.status_code == 400 and r.json()["error"]["kind"] == "parse", r.text
    assert "fn.$ref" in r.json()["error"]["message"]


# ---------------------------------------------------------------------- idempotency keys
def test_an_idempotency_key_cannot_name_a_job(server: ServerProcess) -> None:
    # Jobs are kept under `job:<id>`, and a client key was kept as sent: `job:<hex>` made
    # its answer readable at GET /jobs/<hex>, as if the server had run a job.
    job_id = secrets.token_hex(16)
    prog = function_program("def main():\n    return 7\n").to_dict()
    r = post_program(server.url, prog, headers={"Idempotency-Key": f"job:{job_id}"})
    assert r.status_code == 200, r.text
    got = httpx.get(f"{server.url}/jobs/{job_id}", timeout=10)
    assert got.status_code == 404 and got.json()["error"]["kind"] == "not_found", got.text
    again = post_program(server.url, prog, headers={"Idempotency-Key": f"job:{job_id}"})
    assert again.content == r.content  # still a key: its retry gets the first answer


# ---------------------------------------------------------------------- memfd memory
def test_memfd_memory_counts_against_the_request(server: ServerProcess) -> None:
    # 3 GiB of memfds were held under a 2 GiB address-space limit (their pages are mapped
    # nowhere). The request's memory cgroup counts them: 512 MiB against 384 MiB.
    needs_request_memory(server)
    hold = ("import os\n"
            "def main():\n"
            "    fd = os.memfd_create('hold')\n"
            "    chunk = b'\\x01' * (64 << 20)\n"
            "    for _ in range(8):\n"
            "        os.write(fd, chunk)\n"
            "    return os.fstat(fd).st_size\n")
    res = _run(server, hold, timeout=60)
    assert res.status == "FAILED", f"512 MiB of memfd was accepted: {res.results}"
    assert "memory limit" in res.error.message, res.error.message


# ---------------------------------------------------------------------- removing request folders
def _leave_and_remove(root: Path) -> str:
    """Leave what a program may leave in its folder, folders of mode 0 (one inside
    another) and a file in a read-only folder, then remove_tree: "" or what went wrong."""
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f").write_bytes(b"x")
    (root / "ro").mkdir()
    (root / "ro" / "g").write_bytes(b"y")
    for folder, mode in ((root / "ro", 0o500), (root / "a" / "b", 0), (root / "a", 0)):
        os.chmod(folder, mode)
    try:
        remove_tree(str(root))
    except Exception as exc:  # noqa: BLE001 - the test reports it
        return f"{type(exc).__name__}: {exc}"
    return "left in place" if root.exists() else ""


def _as_uid(uid: int, fn: Callable[[], str]) -> str:
    """fn() in a forked child running as `uid`: what it returned."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        said = "the child failed"
        try:
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            said = fn()
        finally:
            os.write(w, said.encode() or b"ok")
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    with os.fdopen(r, "rb") as f:
        said = f.read().decode()
    return "" if said == "ok" else said


def test_a_request_folder_the_program_made_unlistable_is_removed() -> None:
    # rmtree reports a folder it cannot list with os.open, and the handler called
    # os.open(path) again: a TypeError that left the whole request folder (on /dev/shm).
    # Root lists every folder: as root, the folder is made and removed by another uid.
    parent = Path(tempfile.mkdtemp(prefix="kcoral-rmtree-"))
    try:
        root = parent / "request"
        if os.geteuid() != 0:
            assert _leave_and_remove(root) == ""
            return
        os.chown(parent, 65534, 65534)
        assert _as_uid(65534, lambda: _leave_and_remove(root)) == ""
    finally:
        shutil.rmtree(parent, ignore_errors=True)


# ---------------------------------------------------------------------- uid ranges
def test_two_servers_on_a_host_never_share_sandbox_uids(server: ServerProcess) -> None:
    # RLIMIT_NPROC counts a uid's processes host-wide: with one range for every server, a
    # request that forked 250 processes on one server left the same slot of another unable
    # to start any. Each server now holds a range of its own.
    if os.geteuid() != 0:
        pytest.skip("sandbox uids are set only when the server runs as root")
    first = server.health()["sandbox"]["uid_base"]
    with ServerProcess(["--cpu-workers", "1"]) as other:
        second = other.health()["sandbox"]["uid_base"]
    assert first is not None and second is not None and abs(first - second) >= 1024
    taken = ServerProcess(["--cpu-workers", "1", "--sandbox-uid", str(first)], startup_timeout=30)
    with pytest.raises(RuntimeError, match="used by another kcoral-server"):
        taken.start()
    taken.stop()
