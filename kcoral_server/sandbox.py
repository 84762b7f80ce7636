"""The per-request sandbox: what bubblewrap builds, with which limits, under which uid.

One sandbox per request: bwrap creates fresh PID, mount, IPC, UTS and network namespaces
whose root holds the system directories and the Python installation read-only, a
size-limited tmpfs at /kcoral (the workspace, $TMPDIR and /dev/shm live in it) and one of
the same size at /tmp (where an installation under the host's /tmp is bound), and
nothing of the server's state (state directory, journal, salt, token, blob cache, other
requests). bwrap's own command is a placeholder that waits; a preloaded worker forked by
the zygote then joins those namespaces (see zygote.py). Killing the namespace's init
kills every process of the request.

When the server runs as root, bwrap runs privileged (no user namespace) and each worker
slot's programs run as their own unprivileged uid, so RLIMIT_NPROC counts one request's
processes. Otherwise bwrap maps the server's uid into a user namespace (RLIMIT_NPROC is
then counted per namespace by the kernel) and the worker drops every capability.
"""
from __future__ import annotations

import enum
import glob
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

# Paths inside the sandbox. Everything writable is under ROOT, one tmpfs.
ROOT = "/kcoral"
WORK = f"{ROOT}/work"        # the program's working directory (its workspace)
TMP = f"{ROOT}/tmp"          # /tmp and $TMPDIR
SHM = f"{ROOT}/shm"          # /dev/shm
HOME = f"{ROOT}/home"        # $HOME (CUDA's compute cache, tools' dotfiles)
TOOLS = "/run/kcoral/path"   # server PATH directories that cannot appear at their own path
TRUSTED_CACHE = "/run/kcoral/trusted-cache"  # --trusted-cache, read-only
TRUSTED_CACHE_ENV = "KCORAL_TRUSTED_CACHE"   # where a program finds it
CACHE = f"{ROOT}/cache"      # $XDG_CACHE_HOME
CUPY_CACHE = f"{CACHE}/cupy"  # $CUPY_CACHE_DIR: CuPy writes there without creating it
WRITABLE_DIRS = (WORK, TMP, SHM, HOME, CACHE, CUPY_CACHE)

READY = b"ready\n"  # what the sandbox's placeholder command echoes once the sandbox is built
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
_BASIC_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")


class SandboxMode(str, enum.Enum):
    BWRAP = "bwrap"  # a bubblewrap sandbox per request
    NONE = "none"    # workers run as the server's uid, in the server's namespaces


@dataclass(frozen=True)
class SandboxLimits:
    """Per-request bounds (0 = no limit)."""

    memory_bytes: int = 2 << 30      # RLIMIT_AS (not applied on GPU workers: CUDA reserves huge address ranges)
    processes: int = 256             # RLIMIT_NPROC
    file_bytes: int = 1 << 30        # RLIMIT_FSIZE
    # RLIMIT_NOFILE, soft and hard: the server raises its own to the hard limit for its
    # connections, and every descriptor a request holds comes from the host's one file table
    open_files: int = 4096
    workspace_bytes: int = 2 << 30   # size of the /kcoral tmpfs (bwrap mode)


def _exists(path: str) -> bool:
    return os.path.lexists(path)


def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def python_paths() -> list[str]:
    """Directories the worker's Python needs: the installation, the virtual environment,
    its site-packages and this project's sources (an editable install points there).
    Not sys.path as a whole: its first entry is often just the directory the server was
    started from."""
    import site

    import kcoral
    import kcoral_server

    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))}
    for pkg in (kcoral, kcoral_server):
        paths.add(os.path.dirname(os.path.dirname(os.path.abspath(pkg.__file__ or ""))))
    paths.update(site.getsitepackages() + [site.getusersitepackages()])
    # The sandbox's own mount points. /tmp is not among them: an installation under /tmp (a
    # clone and its venv there, as CI may have) is bound over the sandbox's /tmp tmpfs.
    own = (ROOT, "/dev", "/proc")
    return sorted(p for p in paths if p and p != "/" and os.path.isdir(p) and not any(_inside(p, o) for o in own))


def gpu_paths() -> tuple[list[str], list[str]]:
    """(device nodes, read-only paths) a GPU request needs, as far as they exist here."""
    devices = sorted(set(glob.glob("/dev/nvidia*")) | set(glob.glob("/dev/nvidia-caps/*")))
    devices = [d for d in devices if not os.path.isdir(d)]
    ro = [p for p in ("/sys", "/run/nvidia-persistenced", "/usr/local/cuda", "/opt") if os.path.exists(p)]
    return devices, ro


@dataclass
class SandboxPolicy:
    mode: SandboxMode
    limits: SandboxLimits
    uid_base: int = 2_000_000_000       # root only: slot i runs as uid_base + i (the engine claims one: uidrange.py)
    hidden: list[str] = field(default_factory=list)  # server paths no request may see
    privileged: bool = field(default_factory=lambda: os.geteuid() == 0)
    bwrap: str = "bwrap"
    identity: tuple[str, str] | None = None  # (passwd, group) files shown at /etc/passwd and /etc/group
    # Compile caches only the operator wrote, which trusted code in a request (a bench's
    # baseline host) copies from: read-only inside, so no program can plant kernels there.
    trusted_cache: str | None = None
    _ro: list[str] = field(default_factory=list)
    _argv: dict[bool, list[str]] = field(default_factory=dict)
    _path: list[tuple[str, str]] = field(default_factory=list)  # (host dir, sandbox dir) of $PATH

    @property
    def bwrap_path(self) -> str:
        return shutil.which(self.bwrap) or self.bwrap

    def __post_init__(self) -> None:
        ro = [p for p in _SYSTEM_DIRS if _exists(p)] + python_paths()
        # Parents first; a path already covered by a bound parent is not bound again.
        kept: list[str] = []
        for p in sorted(set(ro), key=lambda s: (s.count("/"), s)):
            if not any(_inside(p, k) and not os.path.islink(k) for k in kept):
                kept.append(p)
        self._ro = kept
        self._path = self._tool_dirs()
        self.hidden = sorted({os.path.realpath(h) for h in self.hidden if h} | {os.path.abspath(h) for h in self.hidden if h})

    def _tool_dirs(self) -> list[tuple[str, str]]:
        """The server's $PATH directories, so the tools it offers (ncu, compute-sanitizer,
        nvcc, ...) are there for programs too: read-only, at their own path, or under TOOLS
        where that path is one of the sandbox's own (/tmp, /kcoral, /dev, /proc)."""
        out: list[tuple[str, str]] = []
        own = (ROOT, "/tmp", "/dev", "/proc", "/run")
        for d in os.environ.get("PATH", "").split(os.pathsep):
            if not d.startswith("/") or not os.path.isdir(d):
                continue
            d = os.path.normpath(d)
            if any(_inside(d, k) for k in self._ro) or any(h == d for h, _ in out):
                out.append((d, d))
            elif any(_inside(d, o) for o in own):
                out.append((d, f"{TOOLS}/{len(out)}"))
            else:
                out.append((d, d))
        return out

    def sandbox_env(self, base: dict[str, str]) -> dict[str, str]:
        """A sandboxed worker's environment: the worker environment with home, temp and
        cache folders pointed into the request's tmpfs, and $PATH as the sandbox shows it."""
        env = dict(base)
        env.update(HOME=HOME, TMPDIR=TMP, CUPY_CACHE_DIR=CUPY_CACHE, XDG_CACHE_HOME=CACHE)
        if self.trusted_cache:
            env[TRUSTED_CACHE_ENV] = TRUSTED_CACHE
        if self._path:
            env["PATH"] = os.pathsep.join(dict.fromkeys(inside for _, inside in self._path))
        return env

    # ------------------------------------------------------------------ identity
    def uid_for(self, slot: int) -> int | None:
        """The uid a slot's programs run as (None: the server's own uid)."""
        if self.mode is SandboxMode.BWRAP and self.privileged:
            return self.uid_base + slot
        return None

    def write_identity(self, directory: str, slots: int) -> None:
        """Name the slots' uids: /etc/passwd and /etc/group as the host has them, plus one
        entry per slot, written under `directory` and shown over the sandbox's own. Without
        a name, libraries that look the user up (getpass.getuser(), hence torch and triton's
        caches) fail with "getpwuid(): uid not found"."""
        if self.uid_for(0) is None:
            return
        files = []
        for name, line in (("passwd", "kcoral{i}:x:{uid}:{uid}:kcoral request slot {i}:" + HOME + ":/usr/sbin/nologin"),
                           ("group", "kcoral{i}:x:{uid}:")):
            try:
                with open(f"/etc/{name}", encoding="utf-8", errors="replace") as f:
                    text = f.read()
            except OSError:
                text = ""
            if text and not text.endswith("\n"):
                text += "\n"
            text += "".join(line.format(i=i, uid=self.uid_for(i)) + "\n" for i in range(slots))
            path = os.path.join(directory, name)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(path, 0o644)
            files.append(path)
        self.identity = (files[0], files[1])
        self._argv.clear()

    @property
    def uses_userns(self) -> bool:
        return self.mode is SandboxMode.BWRAP and not self.privileged

    def describe(self) -> dict[str, object]:
        """For /health."""
        return {
            "mode": self.mode.value,
            "user_namespace": self.uses_userns,
            "separate_uid": self.mode is SandboxMode.BWRAP and self.privileged,
            "uid_base": self.uid_for(0),
            "trusted_cache": bool(self.trusted_cache),
            "limits": {"memory_bytes": self.limits.memory_bytes, "processes": self.limits.processes,
                       "file_bytes": self.limits.file_bytes, "open_files": self.limits.open_files,
                       "workspace_bytes": self.limits.workspace_bytes if self.mode is SandboxMode.BWRAP else None},
        }

    # ------------------------------------------------------------------ bwrap
    def bwrap_argv(self, gpu: bool, info_fd: int | None = None) -> list[str]:
        """bwrap's command line; its command echoes one line once the sandbox is built and
        then waits for stdin to close. `info_fd` receives bwrap's JSON (the init's pid)."""
        if gpu not in self._argv:  # the same for every request (the paths were resolved at start)
            self._argv[gpu] = self._build_argv(gpu)
        info = ["--info-fd", str(info_fd)] if info_fd is not None else []
        # The placeholder command holds the sandbox open until its stdin closes; it echoes
        # the line the server writes first, which tells the server the sandbox is built. As
        # PID 1 it ignores every signal a program can send it.
        return self._argv[gpu] + info + ["--as-pid-1", "--chdir", "/", "--", "/bin/cat"]

    def _build_argv(self, gpu: bool) -> list[str]:
        """bwrap's options, in the order they must come: later mounts go over earlier ones."""
        tools = [(h, i) for h, i in dict.fromkeys(self._path) if not any(_inside(h, k) for k in self._ro)]
        parents = self._bind_parents(self._ro + [i for _, i in tools] + ([TRUSTED_CACHE] if self.trusted_cache else []))
        under_tmp = [p for p in self._ro if _inside(p, "/tmp")]
        return [self.bwrap_path, *self._namespaces(), *self._host_binds(tools, parents, under_tmp),
                *self._devices(gpu), *self._workspace(), *self._own_tmp(parents, under_tmp), *self._hiding()]

    def _namespaces(self) -> list[str]:
        a = ["--unshare-pid", "--unshare-ipc", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
             "--die-with-parent"]
        if self.uses_userns:
            a.append("--unshare-user")
        return a

    def _bind_parents(self, dests: list[str]) -> list[str]:
        """Parents of nested binds (e.g. /home/ci for /home/ci/python3.11), which bwrap would
        make 0700, to be created traversable first; shallowest first."""
        parents = sorted({os.path.dirname(p[:i]) for p in dests for i in range(len(p) + 1)
                          if p[i:i + 1] in ("/", "") and os.path.dirname(p[:i]) not in ("", "/")}
                         - set(dests), key=lambda s: (s.count("/"), s))
        return [d for d in parents if not any(_inside(d, k) for k in self._ro)]

    def _host_binds(self, tools: list[tuple[str, str]], parents: list[str], under_tmp: list[str]) -> list[str]:
        """The system, the Python installation and the $PATH tools, read-only (what lies
        under /tmp is bound once /tmp is the sandbox's own, in _own_tmp)."""
        a: list[str] = []
        for d in parents:
            if not _inside(d, "/tmp"):
                a += ["--perms", "0755", "--dir", d]
        for p in self._ro:
            if p in under_tmp:
                continue
            if os.path.islink(p):
                a += ["--symlink", os.readlink(p), p]
            else:
                a += ["--ro-bind", p, p]
        for host, inside in tools:
            a += ["--ro-bind", host, inside]
        if self.identity is not None:
            a += ["--ro-bind", self.identity[0], "/etc/passwd", "--ro-bind", self.identity[1], "/etc/group"]
        if self.trusted_cache:
            a += ["--ro-bind", self.trusted_cache, TRUSTED_CACHE]
        return a

    def _devices(self, gpu: bool) -> list[str]:
        a = ["--proc", "/proc", "--tmpfs", "/dev"]
        for d in _BASIC_DEVICES:
            if _exists(d):
                a += ["--dev-bind", d, d]
        a += ["--symlink", "/proc/self/fd", "/dev/fd", "--symlink", "/proc/self/fd/0", "/dev/stdin",
              "--symlink", "/proc/self/fd/1", "/dev/stdout", "--symlink", "/proc/self/fd/2", "/dev/stderr"]
        if gpu:
            devices, ro = gpu_paths()
            for d in devices:
                a += ["--dev-bind", d, d]
            for p in ro:
                if not any(_inside(p, k) for k in self._ro):
                    a += ["--ro-bind", p, p]
        return a

    def _tmpfs_size(self) -> list[str]:
        return ["--size", str(self.limits.workspace_bytes)] if self.limits.workspace_bytes else []

    def _workspace(self) -> list[str]:
        a = [*self._tmpfs_size(), "--tmpfs", ROOT]
        for d in WRITABLE_DIRS:
            a += ["--dir", d]
        return a

    def _own_tmp(self, parents: list[str], under_tmp: list[str]) -> list[str]:
        """/tmp is a tmpfs of its own, as large as the workspace (TMPDIR points into the
        workspace; /tmp is for programs that ignore it), so that an installation under /tmp
        can be bound into it read-only."""
        a = [*self._tmpfs_size(), "--tmpfs", "/tmp", "--symlink", SHM, "/dev/shm"]
        # Those parents again inside the new /tmp (made before it, they are hidden by it): a
        # venv under /tmp whose project is not bound (a wheel install) needs /tmp/<clone>.
        for d in parents:
            if _inside(d, "/tmp") and d != "/tmp":
                a += ["--perms", "0755", "--dir", d]
        for p in under_tmp:
            a += ["--symlink", os.readlink(p), p] if os.path.islink(p) else ["--ro-bind", p, p]
        return a

    def _hiding(self) -> list[str]:
        """Server state that happens to lie inside a bound directory: hidden behind an empty,
        read-only tmpfs (a directory) or /dev/null (a file)."""
        a: list[str] = []
        for h in self.hidden:
            if not any(_inside(h, k) for k in self._ro) or not os.path.exists(h):
                continue
            if os.path.isdir(h):
                a += ["--tmpfs", h, "--remount-ro", h]
            else:
                a += ["--ro-bind", "/dev/null", h]
        return a

    def bwrap_env(self) -> dict[str, str]:
        """bwrap's own environment: nothing of the server's."""
        return {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}

    def probe(self) -> str | None:
        """None if a sandbox can be built here, else why not."""
        if shutil.which(self.bwrap) is None:
            return f"{self.bwrap} (bubblewrap) is not installed (not on PATH)"
        try:
            out = subprocess.run(self.bwrap_argv(gpu=False), input=READY, capture_output=True,
                                 env=self.bwrap_env(), timeout=30)
        except FileNotFoundError:
            return f"{self.bwrap} (bubblewrap) is not installed"
        except (OSError, subprocess.SubprocessError) as exc:
            return f"{self.bwrap} could not run: {exc}"
        if out.returncode != 0 or out.stdout != READY:
            err = out.stderr.decode(errors="replace").strip()
            return f"{self.bwrap} failed (status {out.returncode}): {err or 'no message'}"
        return None

