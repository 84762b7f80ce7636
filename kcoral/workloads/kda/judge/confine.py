"""What a candidate's host may write: its own folders, nothing else (Linux Landlock).

The candidate's host runs under the judge's uid (inside a server's sandbox the judge is
not root, so it cannot hand the host another uid), and file permissions do not keep a
process from files its own uid owns. Without more, a candidate could edit the judge's
package before a later host or a lazy import reads it, or plant compiled kernels in a
cache that trusted code loads. Landlock lets an unprivileged process give up rights for
itself and everything it starts: the host, before it imports the candidate, keeps the
right to write only beneath its working folder and its compile caches (and to the device
files it needs). Where the kernel offers it (ABI 6, Linux 6.12), the host also loses the
right to signal processes outside its domain (the judge and the baseline's host); from
ABI 1 it cannot ptrace them.

Reads stay open: the judge's sources are public, and its secrets live in its memory."""
from __future__ import annotations

import ctypes
import functools
import glob
import os
import platform

# Syscall numbers: one table for every architecture since Linux 5.13.
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

# Filesystem access rights (landlock.h), by the ABI that introduced them.
_WRITE_FILE = 1 << 1
_DIR_WRITES = (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 9) | (1 << 10) | (1 << 11) | (1 << 12)
_REFER = 1 << 13      # ABI 2: renames and links across folders
_TRUNCATE = 1 << 14   # ABI 3
_SCOPE_SIGNAL = 1 << 1  # ABI 6


# prctl options: the other rights a process gives up for itself (the judge, the hosts)
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38


def prctl(option: int, value: int) -> bool:
    """prctl(option, value) on this process; False where it failed or is not Linux."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except Exception:  # noqa: BLE001 - not Linux
        return False


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class ConfineError(OSError):
    """Landlock is there but refused the ruleset."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


@functools.cache
def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where there is none (not Linux, too old, or
    not enabled at boot)."""
    if platform.system() != "Linux":
        return 0
    try:
        libc = _libc()
        libc.syscall.restype = ctypes.c_long
        abi = libc.syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except Exception:  # noqa: BLE001 - no libc to call through
        return 0
    return max(int(abi), 0)


def _rights(abi: int) -> tuple[int, int]:
    """(every write right this ABI knows, the file-level ones among them)."""
    file_rights = _WRITE_FILE | (_TRUNCATE if abi >= 3 else 0)
    return file_rights | _DIR_WRITES | (_REFER if abi >= 2 else 0), file_rights


def device_files() -> list[str]:
    """The character devices a host opens for writing: the basic ones and the GPU's."""
    names = ["/dev/null", "/dev/zero", "/dev/full", "/dev/tty"]
    names += glob.glob("/dev/nvidia*") + glob.glob("/dev/nvidia-caps/*") + glob.glob("/dev/dri/*")
    return sorted(p for p in set(names) if os.path.exists(p) and not os.path.isdir(p))


# /dev/shm is not among a host's folders: the CUDA driver keeps the files behind every
# interprocess handle there (the judge's pre-roll event, which the baseline's host waits on
# too), and a candidate that could write them could disturb another process's event. A
# confined host opens the judge's event before it confines itself (host.main); measured on
# the H200, allocation, IPC memory export, kernels and waits on that event work afterwards
# with /dev/shm closed, and only opening an event after confining fails.


def confine_writes(folders: list[str]) -> str:
    """Restrict this process (and everything it starts) to writing beneath `folders` and
    to the device files. Returns what now holds, for the judge's report; raises
    ConfineError if the kernel has Landlock but the restriction failed. Needs
    no-new-privs set first (the host sets it before anything else)."""
    abi = landlock_abi()
    if abi <= 0:
        return ""
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    handled, file_rights = _rights(abi)
    attr = _RulesetAttr(handled, 0, _SCOPE_SIGNAL if abi >= 6 else 0)
    size = ctypes.sizeof(attr) if abi >= 6 else 8  # older kernels know only the first field
    ruleset = libc.syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise ConfineError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for path, rights in [(f, handled) for f in folders] + [(d, file_rights) for d in device_files()]:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # a device this machine lacks
            try:
                rule = _PathBeneathAttr(rights, fd)
                if libc.syscall(_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                                ctypes.byref(rule), ctypes.c_uint32(0)) < 0:
                    raise ConfineError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
            finally:
                os.close(fd)
        if libc.syscall(_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            raise ConfineError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    scope = ", no signals outside it" if abi >= 6 else ""
    return f"candidate writes only its own folders (Landlock ABI {abi}{scope}; no ptrace outside it)"
