"""Compile CUDA sources with nvcc for the server's target and read ptxas resource usage.

The sources are the candidate's, so hostile: whatever nvcc reads can end up in its error
log, which the check stage stores (`#include "/home/.../secret"` would print the file).
nvcc (and cicc, ptxas and the host compiler it spawns) therefore runs in a bubblewrap
sandbox that sees the system read-only (/usr, /lib*, the few /etc files the loader reads),
the CUDA toolkit, the candidate's folder read-only at SANDBOX_SOURCE and one private
scratch folder, writable, at SANDBOX_SCRATCH: no home, no database, no host /tmp, no other
process, no network, no capabilities, an environment of its own and a bounded address space.
Without a working bwrap nvcc is not run at all (NvccUnavailable)."""
from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from pydantic import BaseModel, Field

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
# ptxas's performance notes name their kernel: C7512 (wgmma serialised for want of registers:
# each product waits for the one before), C7517 (a warpgroup.wait injected where the code
# touches registers a wgmma may still write). The line may come before the kernel's entry.
_PERF = re.compile(r"\((C\d{4})\) Potential Performance Loss: (.*?)\s+(?:for|in) (?:the )?function '([^']+)'")

# nvcc's address space, and that of everything it spawns (a template blow-up in cicc
# otherwise takes the orchestrator's memory). Real kernels need well under 2 GiB.
MEMORY_LIMIT_BYTES = 8 << 30
FILE_LIMIT_BYTES = 1 << 30    # of any file nvcc writes: a cubin is a few MB, its temporaries more
SANDBOX_SOURCE = "/src"       # the candidate's folder inside the sandbox, read-only
SANDBOX_SCRATCH = "/scratch"  # the output and nvcc's temporaries ($TMPDIR): the one writable folder
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Not /etc as a whole: as root the sandbox could read /etc/shadow or ssh host keys.
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives")
_PROBE_TIMEOUT_S = 30.0
_LOG_CHARS = 16000  # the tail of nvcc's output that is kept
CUBIN_READ_LIMIT = 64 << 20   # a cubin past this is not read for its code sizes

# Files the static include check reads: whatever nvcc may preprocess.
INCLUDE_SUFFIXES = frozenset({".cu", ".cuh", ".h", ".hh", ".hpp", ".hxx", ".inc", ".inl", ".ipp", ".tcc",
                              ".c", ".cc", ".cpp", ".cxx"})
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*(?:include|include_next|import|embed)[ \t]*([<"])([^>"\n]*)[>"]', re.M)
# A sandbox mount point at the start of a path (not inside one: /usr/src stays).
_SANDBOX_PREFIX = re.compile(rf"(?<![\w.~/-])(?:{re.escape(SANDBOX_SOURCE)}|{re.escape(SANDBOX_SCRATCH)})/")


class NvccRefused(Exception):
    """nvcc was not run: the sources include what they may not (the candidate's doing)."""


class NvccUnavailable(Exception):
    """nvcc was not run: this machine cannot confine it (the machine's doing, not the candidate's)."""


class KernelResources(BaseModel):
    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack_bytes: int = 0
    smem_bytes: int = 0
    code_bytes: int = 0   # machine code (its `.text` section): what the SMs fetch as instructions
    performance_notes: list[str] = Field(default_factory=list)   # "C7512: wgmma.mma_async instructions are serialized ..."


class CompileReport(BaseModel):
    ok: bool
    arch: str
    command: list[str] = Field(default_factory=list)
    log: str = ""
    kernels: dict[str, KernelResources] = Field(default_factory=dict)

    @property
    def max_registers(self) -> int | None:
        return max((k.registers for k in self.kernels.values()), default=None)

    @property
    def total_spills(self) -> int | None:
        return sum(k.spill_stores + k.spill_loads for k in self.kernels.values()) if self.kernels else None


def nvcc_path() -> str | None:
    return shutil.which("nvcc")


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def parse_ptxas(log: str) -> dict[str, KernelResources]:
    kernels: dict[str, KernelResources] = {}
    current: KernelResources | None = None
    for line in log.splitlines():
        m = _PERF.search(line)
        if m:
            code, text, name = m.groups()
            kernels.setdefault(name, KernelResources()).performance_notes.append(f"{code}: {text}"[:300])
            continue
        m = _ENTRY.search(line)
        if m:
            current = kernels.setdefault(m.group(1), KernelResources())
            continue
        if current is None:
            continue
        m = _SPILL.search(line)
        if m:
            current.stack_bytes, current.spill_stores, current.spill_loads = (int(g) for g in m.groups())
        m = _USED.search(line)
        if m:
            current.registers = int(m.group(1))
            s = _SMEM.search(line)
            current.smem_bytes = int(s.group(1)) if s else 0
    return kernels


def code_sizes(cubin: bytes) -> dict[str, int]:
    """Bytes of machine code per kernel (its `.text.<kernel>` section) in an ELF64 cubin; {}
    for anything else. nvcc wrote it from a candidate's sources, so every offset and count is
    checked against the file before it is followed."""
    if len(cubin) < 64 or cubin[:4] != b"\x7fELF" or cubin[4] != 2 or cubin[5] != 1:   # ELF64, little-endian
        return {}
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    if shentsize < 64 or shstrndx >= shnum or shoff + shnum * shentsize > len(cubin):
        return {}
    headers = [struct.unpack_from("<IIQQQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_at, names_size = headers[shstrndx][4], headers[shstrndx][5]
    if names_at + names_size > len(cubin):
        return {}
    names = cubin[names_at:names_at + names_size]
    sizes: dict[str, int] = {}
    for name_off, *_, size in headers:
        end = names.find(b"\0", name_off)
        if name_off >= len(names) or end < 0:
            continue
        name = names[name_off:end].decode("ascii", "replace")
        if name.startswith(".text.") and len(name) > 6:
            sizes[name[6:]] = size
    return sizes


def gencode(arch: str) -> str:
    """`sm_90a` -> `-gencode=arch=compute_90a,code=sm_90a`."""
    if not re.fullmatch(r"sm_\d+[a-z]?", arch):
        raise ValueError(f"unexpected GPU arch {arch!r}")
    return f"-gencode=arch=compute_{arch[3:]},code={arch}"


# ---------------------------------------------------------------- the static include check
def _source_files(directory: Path) -> Iterator[Path]:
    for path in sorted(directory.rglob("*")):
        if path.suffix.lower() in INCLUDE_SUFFIXES and path.is_file() and not path.is_symlink():
            yield path


def _bad_include(target: str) -> str | None:
    if target.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", target):
        return "an absolute path"
    if ".." in re.split(r"[/\\]", target):
        return "a path with '..'"
    return None


def include_problems(directory: Path) -> list[str]:
    """`#include`s of an absolute path or through `..` in the candidate's C/C++/CUDA files.
    Defence in depth only (a macro such as `#include P` hides the path): the sandbox is what
    keeps nvcc inside the folder. The path itself is not repeated (it names a host file)."""
    found: list[str] = []
    for path in _source_files(directory):
        text = path.read_bytes().decode("utf-8", errors="replace")
        for m in _INCLUDE.finditer(text):
            why = _bad_include(m.group(2))
            if why:
                line = text.count("\n", 0, m.start()) + 1
                found.append(f"{path.relative_to(directory)}:{line}: #include of {why} is not allowed "
                             "(include the candidate's own files by their relative name)")
    return found


# ---------------------------------------------------------------- the sandbox
def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def toolkit_root(exe: str) -> str | None:
    """The CUDA toolkit nvcc belongs to (`<root>/bin/nvcc`, with `<root>/nvvm`), when the
    system directories do not already hold it. Nothing else of nvcc's surroundings is bound:
    a folder that merely has a `bin/nvcc` (a home's ~/.local) is not shown."""
    root = Path(exe).resolve().parents[1]
    if str(root) == "/" or not (root / "nvvm").is_dir():
        return None
    if any(_inside(str(root), d) for d in _SYSTEM_DIRS if not os.path.islink(d)):
        return None
    return str(root)


def _system_binds() -> list[str]:
    a: list[str] = []
    for d in _SYSTEM_DIRS:
        if os.path.islink(d):  # /bin -> usr/bin on a merged-/usr system
            a += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            a += ["--ro-bind", d, d]
    for f in _ETC_FILES:
        if os.path.exists(f):
            a += ["--ro-bind", f, f]
    return a


def _base_argv(bwrap: str) -> list[str]:
    """Namespaces, the system read-only, an own /proc (its pid namespace only), /dev and /tmp."""
    return [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            *_system_binds(), "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]


def sandbox_argv(bwrap: str, source_dir: Path, scratch: Path, toolkit: str | None) -> list[str]:
    """bwrap's command line up to `--`: later mounts go over earlier ones (the toolkit after
    /tmp's tmpfs, so one under /tmp is still seen)."""
    tk = ["--ro-bind", toolkit, toolkit] if toolkit else []
    return [*_base_argv(bwrap), *tk, "--ro-bind", str(source_dir), SANDBOX_SOURCE,
            "--bind", str(scratch), SANDBOX_SCRATCH, "--chdir", SANDBOX_SOURCE, "--"]


def limited(argv: list[str], memory_bytes: int) -> list[str]:
    """`argv` under an address-space limit and a file-size limit (the scratch folder is on
    the host's disk) inherited by all it spawns; set by a shell in the sandbox rather than a
    preexec_fn, which is unsafe in evolve's threaded stage pool. `ulimit -f` counts 512-byte
    blocks in a POSIX shell (1 KiB in bash's own mode): at most twice FILE_LIMIT_BYTES."""
    return ["/bin/sh", "-c", 'ulimit -v "$1" && ulimit -f "$2" && shift 2 && exec "$@"', "nvcc-limit",
            str(max(memory_bytes // 1024, 1)), str(FILE_LIMIT_BYTES // 512), *argv]


def sandbox_env(toolkit: str | None) -> dict[str, str]:
    """bwrap's and so nvcc's whole environment: nothing of evolve's (tokens, database URL,
    NVCC_*_FLAGS); bwrap itself gets it too, as PID 1's environ is readable inside."""
    path = ([f"{toolkit}/bin"] if toolkit else []) + ["/usr/local/cuda/bin", "/usr/local/bin", "/usr/bin", "/bin"]
    return {"PATH": ":".join(path), "LANG": "C", "LC_ALL": "C", "TMPDIR": SANDBOX_SCRATCH,
            "HOME": SANDBOX_SCRATCH}


_WORKS: set[str] = set()  # bwraps that built a sandbox here (a failure is checked again next time)


def _probe(bwrap: str) -> str | None:
    """None if bwrap can build the sandbox here, else why not."""
    if bwrap in _WORKS:
        return None
    argv = [*_base_argv(bwrap), "--", *limited(["/bin/sh", "-c", ":"], MEMORY_LIMIT_BYTES)]
    try:
        out = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                             env=sandbox_env(None), timeout=_PROBE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bwrap could not run: {exc}"
    if out.returncode != 0:
        return f"bwrap cannot build a sandbox here: {(out.stderr or out.stdout).strip()[-300:]}"
    _WORKS.add(bwrap)
    return None


def sandbox_problem() -> str | None:
    """None if nvcc can be run confined, else what the user must fix."""
    bwrap = bwrap_path()
    if bwrap is None:
        return ("nvcc compiles the candidate's sources only inside a bubblewrap sandbox, and `bwrap` is "
                "not on PATH: install bubblewrap (apt install bubblewrap / dnf install bubblewrap)")
    problem = _probe(bwrap)
    if problem:
        return (f"nvcc compiles the candidate's sources only inside a bubblewrap sandbox: {problem} "
                "(bwrap needs user namespaces, or root: e.g. sysctl kernel.unprivileged_userns_clone=1 or "
                "user.max_user_namespaces; or run evolve where bwrap works)")
    return None


def _relative(log: str, host_dirs: list[Path]) -> str:
    """The log without the host's candidate and scratch folders, nor the sandbox's mount
    points: file names relative to the candidate's folder."""
    prefixes = sorted({str(p).rstrip("/") + "/" for d in host_dirs for p in (d, d.resolve())}, key=len, reverse=True)
    for prefix in prefixes:
        log = log.replace(prefix, "")
    return _SANDBOX_PREFIX.sub("", log)


def _tail(f: BinaryIO, chars: int) -> str:
    """The last `chars` characters or so of the file `f` (room left for the paths cut later)."""
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - 4 * chars))
    return f.read().decode("utf-8", errors="replace")


def compile_cuda(source: Path, arch: str, extra_flags: list[str], timeout: float,
                 memory_bytes: int = MEMORY_LIMIT_BYTES) -> CompileReport:
    """nvcc -cubin -Xptxas -v, confined (see the module's doc); the include path is the
    source's folder. NvccRefused: a source includes by an absolute or `..` path;
    NvccUnavailable: no sandbox can be built here."""
    exe = nvcc_path()
    if exe is None:
        raise FileNotFoundError("nvcc not found")
    source = source.absolute()
    problems = include_problems(source.parent)
    if problems:
        raise NvccRefused("; ".join(problems))
    problem = sandbox_problem()
    if problem:
        raise NvccUnavailable(problem)
    toolkit = toolkit_root(exe)
    nv = [str(Path(exe).resolve()), gencode(arch), "-cubin", "-Xptxas", "-v", *extra_flags,
          "-I", ".", "-o", f"{SANDBOX_SCRATCH}/out.cubin", source.name]
    with tempfile.TemporaryDirectory(prefix="evolve-nvcc-") as tmp, tempfile.TemporaryFile() as out:
        argv = sandbox_argv(bwrap_path() or "bwrap", source.parent, Path(tmp), toolkit) + limited(nv, memory_bytes)
        # Output to a file, not a pipe: a flood of template errors must not fill evolve's memory.
        # No stdin: `#include "/dev/stdin"` would read evolve's terminal.
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                              timeout=timeout, env=sandbox_env(toolkit))
        log = _relative(_tail(out, _LOG_CHARS), [source.parent, Path(tmp)])[-_LOG_CHARS:]
        kernels = parse_ptxas(log) if proc.returncode == 0 else {}
        cubin = Path(tmp) / "out.cubin"
        if kernels and cubin.is_file() and not cubin.is_symlink() and cubin.stat().st_size <= CUBIN_READ_LIMIT:
            for name, size in code_sizes(cubin.read_bytes()).items():
                if name in kernels:
                    kernels[name].code_bytes = size
    return CompileReport(ok=proc.returncode == 0, arch=arch, command=nv[1:], log=log, kernels=kernels)
