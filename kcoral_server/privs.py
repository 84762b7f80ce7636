"""Linux process controls the sandbox needs and the stdlib lacks (Python 3.11): setns,
capset, prctl. Thin ctypes wrappers; each raises OSError with the kernel's errno."""
from __future__ import annotations

import ctypes
import enum
import os
import signal
from typing import NamedTuple

_libc = ctypes.CDLL(None, use_errno=True)


class Namespace(enum.IntEnum):
    """CLONE_NEW* flags, in the order a process joins them (user first: it grants the
    capabilities the others need; pid last: it only affects children)."""

    USER = 0x10000000
    IPC = 0x08000000
    UTS = 0x04000000
    NET = 0x40000000
    MNT = 0x00020000
    PID = 0x20000000

    @property
    def proc_name(self) -> str:
        return self.name.lower()


_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def _check(ret: int) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def setns(fd: int, ns: Namespace) -> None:
    _check(_libc.setns(fd, int(ns)))


def prctl(option: int, arg: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)))


def set_name(name: str) -> None:
    """The process name ps, top and perf show (15 bytes at most)."""
    _check(_libc.prctl(15, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0))  # PR_SET_NAME


def set_dumpable(dumpable: bool) -> None:
    """Non-dumpable: same-uid processes can no longer read our /proc/<pid>/mem, environ
    or ptrace us (the kernel makes those files root-owned)."""
    prctl(_PR_SET_DUMPABLE, 1 if dumpable else 0)


def set_no_new_privs() -> None:
    prctl(_PR_SET_NO_NEW_PRIVS, 1)


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    prctl(_PR_SET_PDEATHSIG, sig)


def become_subreaper() -> None:
    prctl(_PR_SET_CHILD_SUBREAPER, 1)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """Empty effective, permitted and inheritable sets (and so the ambient set).

    Needed after joining a user namespace: setns grants every capability inside it,
    whatever the uid."""
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data))


# ---------------------------------------------------------------------- seccomp
class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_RET_ALLOW = 0x7FFF0000
_RET_EPERM = 0x00050000 | 1
_LD_ABS_W, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06


class _Abi(NamedTuple):
    """What the filter denies on one architecture: its audit arch (a syscall made through
    any other ABI, such as i386's `int 0x80` on x86_64, is denied outright), the first
    number of a second ABI that shares it (x86_64's x32: numbers with bit 30 set; denied
    outright too) and the confined calls' numbers."""

    audit: int
    numbers: tuple[int, ...]
    second_abi: int | None = None


# setsid, sched_setaffinity, add_key, request_key, keyctl.
_ABIS = {"x86_64": _Abi(0xC000003E, (112, 203, 248, 249, 250), second_abi=0x40000000),
         "aarch64": _Abi(0xC00000B7, (157, 122, 217, 218, 219))}


def _filter(abi: _Abi) -> list[_SockFilter]:
    """The BPF program: EPERM for a foreign ABI, the second ABI and the confined numbers."""
    checks = [(_JGE_K, abi.second_abi)] if abi.second_abi is not None else []
    checks += [(_JEQ_K, nr) for nr in abi.numbers]
    n = len(checks)
    # Jumps are relative to the next instruction: [0] load arch, [1] foreign arch -> deny,
    # [2] load syscall number, [3..2+n] a denied number -> deny, [3+n] allow, [4+n] deny.
    prog = [_SockFilter(_LD_ABS_W, 0, 0, 4), _SockFilter(_JEQ_K, 0, n + 2, abi.audit), _SockFilter(_LD_ABS_W, 0, 0, 0)]
    prog += [_SockFilter(op, n - i, 0, k) for i, (op, k) in enumerate(checks)]
    return prog + [_SockFilter(_RET_K, 0, 0, _RET_ALLOW), _SockFilter(_RET_K, 0, 0, _RET_EPERM)]


def confine_syscalls() -> bool:
    """From now on, in this process and its descendants, these fail with EPERM:

    - setsid() and sched_setaffinity(). Two things bound a request's CPU share however
      many processes it forks: its worker's session (the scheduler shares CPU fairly
      between sessions, autogroups, where the server runs in the root cgroup) and its
      slot's CPUs (everywhere else: in a container's cgroup autogroups do nothing).
      Neither may be left.
    - add_key(), request_key() and keyctl(): a uid's user keyring is the kernel's, not the
      sandbox's, and outlives every request of the slot's fixed uid (and the server).
    - every syscall through another ABI (i386's `int 0x80`, x32): each numbers the calls
      anew, and a program here never needs one.

    Needs no-new-privs first. False where the architecture is not known here."""
    abi = _ABIS.get(os.uname().machine)
    if abi is None:
        return False
    prog = _filter(abi)
    filters = (_SockFilter * len(prog))(*prog)
    fprog = _SockFprog(len(prog), filters)
    _check(_libc.prctl(_PR_SET_SECCOMP, ctypes.c_ulong(_SECCOMP_MODE_FILTER), ctypes.byref(fprog),
                       ctypes.c_ulong(0), ctypes.c_ulong(0)))
    return True


