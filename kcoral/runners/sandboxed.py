"""What runs inside a request's sandbox, for every remote runner: the protocol's path
rules, opens that never follow a symbolic link, an unpacker for hostile tar archives, and
one way to kill a process tree.

Standard library only, because only the standard library is certain inside a sandbox (a
stock KCoral server has no ``kcoral``). It reaches each runner the way the runner itself
travels: the tool runner's and the bench runner's uploaded bundles carry it as a part
(``kcoral.runners.bundle``), and every bench archive carries a copy inside the judge
package (``kcoral.bench.staging``). The client and the server import it as it is.
"""
from __future__ import annotations

import errno
import io
import os
import signal
import stat
import subprocess
import tarfile
import time
from collections.abc import Collection, Iterable

# --------------------------------------------------------------------------- paths


class PathError(ValueError):
    """A path the protocol's rules refuse; the message says why."""


def normalize_path(path: str, *, allow_root: bool = False,
                   error: type[ValueError] = PathError) -> str:
    """Apply the protocol's path rules; return the normalised relative POSIX path.

    Rules: POSIX separators, relative, no ``..`` component, no backslash or NUL; ``.``
    components and repeated ``/`` are dropped. The result names a file unless
    ``allow_root``, which also admits a directory (``"a/"``) and the root itself (``"."``,
    returned as ``""``). ``error`` is the exception raised, so each layer keeps speaking its
    own (the wire's, an archive's, a workspace's).
    """
    if not isinstance(path, str):
        raise error("path must be a string")
    if "\\" in path or "\x00" in path:
        raise error(f"path {path!r} contains a backslash or NUL")
    if path.startswith("/"):
        raise error(f"path {path!r} is absolute")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise error(f"path {path!r} has a '..' component")
    if not parts:
        if allow_root and path.strip("/.") == "" and path != "":
            return ""
        raise error(f"path {path!r} names no file")
    if path.endswith("/") and not allow_root:
        raise error(f"path {path!r} names a directory, not a file")
    return "/".join(parts)


# --------------------------------------------------------------------------- no-follow opens
# Every open walks a path one component at a time from a directory descriptor, never
# through a link: a program (or what it left running) may swap a checked path for a link
# at any moment, so nothing is checked first and opened later.
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
CLOEXEC = getattr(os, "O_CLOEXEC", 0)
DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | NOFOLLOW | CLOEXEC
# O_NONBLOCK: a FIFO or a device planted where a file was expected must not block the open.
READ_FLAGS = os.O_RDONLY | NOFOLLOW | CLOEXEC | getattr(os, "O_NONBLOCK", 0)
WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | NOFOLLOW | CLOEXEC | getattr(os, "O_NONBLOCK", 0)


class NotRegularFile(OSError):
    """An open that found something other than a regular file (a directory, FIFO, device)."""


def open_dir(root: str | int, parts: Iterable[str] = (), *, create: bool = False,
             mode: int = 0o700) -> int:
    """A descriptor of the directory ``root/parts...`` (``root`` a path, or a directory
    descriptor that stays open), walked without following links (OSError ELOOP or ENOTDIR
    at a link or a file); missing components are made with ``mode`` when ``create``. The
    caller closes it."""
    fd = os.dup(root) if isinstance(root, int) else os.open(root, DIR_FLAGS)
    try:
        for name in parts:
            if create:
                try:
                    os.mkdir(name, mode, dir_fd=fd)
                except FileExistsError:
                    pass
            nfd = os.open(name, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def _regular(fd: int, shown: str) -> int:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegularFile(errno.EINVAL, "not a regular file", shown)
    return fd


def open_read(name: str, *, dir_fd: int | None = None) -> int:
    """A read descriptor of the regular file ``name`` (relative to ``dir_fd``, if given),
    never through a link in its last component (ELOOP) and never of a non-regular file
    (NotRegularFile)."""
    return _regular(os.open(name, READ_FLAGS, dir_fd=dir_fd), name)


def open_write(name: str, *, dir_fd: int | None = None, mode: int = 0o600,
               exclusive: bool = True) -> int:
    """A write descriptor of the regular file ``name``: created, and refused if it exists
    (FileExistsError) when ``exclusive``, else truncated. Never through a link (ELOOP), never
    of a non-regular file (NotRegularFile)."""
    flags = WRITE_FLAGS | (os.O_EXCL if exclusive else os.O_TRUNC)
    return _regular(os.open(name, flags, mode, dir_fd=dir_fd), name)


def open_read_under(root: str, rel: str) -> int:
    """A read descriptor of the regular file ``root/rel`` (``rel`` normalised), no component
    of which may be a link."""
    parts = rel.split("/")
    dfd = open_dir(root, parts[:-1])
    try:
        return open_read(parts[-1], dir_fd=dfd)
    finally:
        os.close(dfd)


def read_regular(path: str, limit: int | None = None) -> bytes:
    """The bytes (at most ``limit``) of the regular file ``path``, not read through a link
    in its last component."""
    with os.fdopen(open_read(path), "rb") as fh:
        return fh.read() if limit is None else fh.read(limit)


# --------------------------------------------------------------------------- tar archives
# Sized for candidate directories plus their inputs; callers may lower them.
DEFAULT_MAX_TOTAL_BYTES = 1 << 30  # 1 GiB of file contents
DEFAULT_MAX_MEMBERS = 100_000


class ArchiveError(ValueError):
    """An archive, or a directory to pack, that is refused; the message says why."""


def check_archive(data: bytes, *, max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
                  max_members: int = DEFAULT_MAX_MEMBERS) -> list[str]:
    """Validate an archive without writing anything; return its normalised entry names."""
    with _open_tar(data) as tar:
        return [name for name, _ in _checked_members(tar, max_total_bytes, max_members)]


def _open_tar(data: bytes) -> tarfile.TarFile:
    try:
        return tarfile.open(fileobj=io.BytesIO(data), mode="r:*")
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ArchiveError(f"not a readable tar archive: {exc}") from None


def _checked_members(tar: tarfile.TarFile, max_total_bytes: int,
                     max_members: int) -> list[tuple[str, tarfile.TarInfo]]:
    out: list[tuple[str, tarfile.TarInfo]] = []
    seen: dict[str, bool] = {}  # normalised path -> is_dir
    parents: set[str] = set()  # every directory some entry lives under
    total = 0
    count = 0  # every header, "./" ones included: tarfile keeps them all in memory
    try:
        for member in tar:
            count += 1
            if count > max_members:
                raise ArchiveError(f"archive has more than {max_members} entries")
            try:
                name = normalize_path(member.name, allow_root=True)
            except PathError as exc:  # "refused archive path '/x' is absolute"
                raise ArchiveError(f"refused archive {exc}") from None
            if member.issym() or member.islnk():
                raise ArchiveError(f"link in archive refused: {member.name!r}")
            if member.ischr() or member.isblk() or member.isfifo():
                raise ArchiveError(f"device or FIFO in archive refused: {member.name!r}")
            if not (member.isreg() or member.isdir()):
                raise ArchiveError(f"special entry in archive refused: {member.name!r}")
            if name == "":
                if member.isdir():
                    continue  # "./" names the destination itself
                raise ArchiveError(f"file entry naming the archive root: {member.name!r}")
            if name in seen:
                raise ArchiveError(f"duplicate entry in archive: {name!r}")
            if not member.isdir() and name in parents:
                raise ArchiveError(f"archive has both a file and a directory at {name!r}")
            parts = name.split("/")
            for i in range(1, len(parts)):
                parent = "/".join(parts[:i])
                if seen.get(parent) is False:
                    raise ArchiveError(f"archive puts {name!r} under the file {parent!r}")
                parents.add(parent)
            seen[name] = member.isdir()
            if member.isreg():
                total += member.size  # a small compressed archive can unpack to a huge tree
                if total > max_total_bytes:
                    raise ArchiveError(f"archive too large once unpacked: its contents exceed "
                                       f"the limit of {max_total_bytes} bytes")
            out.append((name, member))
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ArchiveError(f"corrupt tar archive: {exc}") from None
    return out


def safe_unpack(data: bytes, dest: str | os.PathLike[str], *,
                max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
                max_members: int = DEFAULT_MAX_MEMBERS) -> list[str]:
    """Unpack a (possibly compressed) tar into the existing directory ``dest``.

    Refuses ``..``, absolute paths, links, devices, FIFOs, duplicate entries and contents
    over ``max_total_bytes``. Every header is validated first, so a refused archive
    writes nothing. Files are created exclusively and nothing is created through a link.
    Returns the files written, as relative POSIX paths.
    """
    dest = os.fspath(dest)
    written: list[str] = []
    with _open_tar(data) as tar:
        for name, member in _checked_members(tar, max_total_bytes, max_members):
            parts = name.split("/")
            try:
                dfd = open_dir(dest, parts[:-1], create=True, mode=0o755)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise ArchiveError(f"refusing to write {name!r}: a symbolic link or a file "
                                       "is in its way") from None
                raise
            try:
                if member.isdir():
                    _make_dir(dfd, parts[-1], name)
                else:
                    _write_member(tar, member, dfd, parts[-1], name)
                    written.append(name)
            finally:
                os.close(dfd)
    return written


def _make_dir(dfd: int, leaf: str, name: str) -> None:
    try:
        os.mkdir(leaf, 0o755, dir_fd=dfd)
    except FileExistsError:
        try:
            os.close(os.open(leaf, DIR_FLAGS, dir_fd=dfd))
        except OSError:
            raise ArchiveError(f"cannot create directory {name!r}: a file or a symbolic link "
                               "is there") from None


def _write_member(tar: tarfile.TarFile, member: tarfile.TarInfo, dfd: int, leaf: str,
                  name: str) -> None:
    try:
        source = tar.extractfile(member)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ArchiveError(f"corrupt data for {name!r}: {exc}") from None
    if source is None:  # pragma: no cover - regular files always have data
        raise ArchiveError(f"no data for {name!r}")
    try:
        fd = open_write(leaf, dir_fd=dfd, mode=0o755 if member.mode & 0o111 else 0o644)
    except FileExistsError:
        raise ArchiveError(f"{name!r} already exists in the destination") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ArchiveError(f"refusing to write {name!r}: a symbolic link is there") from None
        raise
    with os.fdopen(fd, "wb") as out, source:
        remaining = member.size
        while remaining > 0:
            try:
                chunk = source.read(min(remaining, 1 << 20))
            except (tarfile.TarError, EOFError, OSError) as exc:
                raise ArchiveError(f"corrupt data for {name!r}: {exc}") from None
            if not chunk:
                raise ArchiveError(f"truncated data for {name!r}")
            out.write(chunk)
            remaining -= len(chunk)


# --------------------------------------------------------------------------- processes
KILL_GRACE_S = 3.0
_KILL_ROUNDS = 50


def children_by_parent() -> dict[int, list[int]]:
    """{parent pid: [child pids]} of every live process (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
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


def descendants(roots: int | Iterable[int], skip: Collection[int] = ()) -> list[int]:
    """Every live descendant of ``roots``, leaving out the processes in ``skip`` and all
    that lives under them."""
    children = children_by_parent()
    out: list[int] = []
    stack = [roots] if isinstance(roots, int) else list(roots)
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in skip:
                out.append(child)
                stack.append(child)
    return out


def _signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except OSError:
        return False


def kill_tree(proc: subprocess.Popen, grace_s: float = KILL_GRACE_S) -> int:
    """End ``proc`` and everything it started; return its exit status.

    SIGTERM first, to the process, its descendants and its process group (when it leads
    one), so a well-behaved tool can clean up after itself (a profiler, what it profiles);
    then, once the process has exited or ``grace_s`` has passed, SIGKILL to every
    process seen in any round and to the group, again until a round finds no new one. The
    KILL is unconditional: a child that ignores SIGTERM, or one forked while the tree was
    being killed, does not outlive its parent. Children re-parented away are caught by the
    group, or swept by a subreaper (``kill_orphans``); the request's sandbox ends the rest.
    ``grace_s`` 0 skips the SIGTERM, for a process already asked to stop in its own way.
    """
    group = _leads_group(proc.pid)
    victims: set[int] = set()
    if grace_s > 0:
        victims.update([proc.pid, *descendants(proc.pid)])
        _signal_all(victims, signal.SIGTERM)
        if group:
            _signal_all([-proc.pid], signal.SIGTERM)  # kill(-pgid) signals the group
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    if proc.returncode is not None:  # reaped during the grace: its pid may be reused now
        victims.discard(proc.pid)
    for _ in range(_KILL_ROUNDS):
        roots = victims | ({proc.pid} if proc.returncode is None else set())
        seen = roots | set(descendants(roots))
        fresh = seen - victims
        victims |= seen
        _signal_all(victims, signal.SIGKILL)
        if group:
            _signal_all([-proc.pid], signal.SIGKILL)
        if not fresh:
            break
    return proc.wait()


def kill_orphans(keep: Collection[int] = (), reap_s: float | None = 5.0) -> None:
    """SIGKILL every descendant of this process except ``keep`` and what lives under
    them, and reap those that are its children, for up to ``reap_s`` seconds in all
    (``None``: until every one is gone; ``0``: kill once and leave the reaping to the caller).

    For a subreaper: what a finished process left behind (double forks, setsid daemons)
    is re-parented to it, and so is each killed process's own children, hence the rounds."""
    deadline = time.monotonic() + (float("inf") if reap_s is None else reap_s)
    while True:
        doomed = descendants(os.getpid(), skip=keep)
        if not doomed:
            return
        _signal_all(doomed, signal.SIGKILL)
        while doomed and time.monotonic() < deadline:
            for pid in list(doomed):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:  # not ours to reap (its parent was a doomed process)
                    done = pid
                if done:
                    doomed.remove(pid)
            if doomed:
                time.sleep(0.01)
        if time.monotonic() >= deadline:
            return
        time.sleep(0.01)  # a zombie not ours to reap: let its new parent reap it
