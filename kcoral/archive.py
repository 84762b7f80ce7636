"""Tar archives of directories: packing that refuses links and special files, and an
unpacker that refuses anything that could write outside its destination.

Standard library only: the remote tool runner ships this very file to the server (see
``kcoral.runners``), so the client and the server share one implementation.
"""
from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile

# Defaults sized for candidate directories plus their inputs; callers may lower them.
DEFAULT_MAX_TOTAL_BYTES = 1 << 30  # 1 GiB of file contents
DEFAULT_MAX_MEMBERS = 100_000


class ArchiveError(ValueError):
    """An archive, or a directory to pack, that is refused; the message says why."""


def normalize_member_path(name: str) -> str:
    """Return the canonical relative POSIX form of an archive path, or raise ArchiveError.

    Rules (those of the protocol's file uploads): relative, POSIX ``/``, no ``..``
    component, no backslash or NUL; ``.`` components and repeated ``/`` are dropped.
    """
    if not isinstance(name, str) or name == "":
        raise ArchiveError("empty path in archive")
    if "\x00" in name:
        raise ArchiveError(f"path with a NUL byte in archive: {name!r}")
    if "\\" in name:
        raise ArchiveError(f"path with a backslash in archive: {name!r}")
    if name.startswith("/"):
        raise ArchiveError(f"absolute path in archive: {name!r}")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise ArchiveError(f"path with a '..' component in archive: {name!r}")
    return "/".join(parts)


def _join_prefix(prefix: str, rel: str) -> str:
    return "/".join(p for p in (prefix, rel) if p)


def list_directory(root: str | os.PathLike[str]) -> tuple[list[str], list[str]]:
    """Walk ``root`` and return (files, directories) as sorted relative POSIX paths.

    Raises ArchiveError for symbolic links, hard-linked files, devices, FIFOs and sockets:
    what is sent must be plain files, so the remote side sees exactly what is here.
    """
    root = os.fspath(root)
    st = os.lstat(root)  # FileNotFoundError propagates: a clear message already
    if stat.S_ISLNK(st.st_mode):
        raise ArchiveError(f"refusing to send {root}: it is a symbolic link")
    if not stat.S_ISDIR(st.st_mode):
        raise ArchiveError(f"refusing to send {root}: not a directory")
    files: list[str] = []
    dirs: list[str] = []
    for current, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = os.path.relpath(current, root)
        rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/")
        for name in list(dirnames) + list(filenames):
            full = os.path.join(current, name)
            rel = _join_prefix(rel_dir, name)
            mode = os.lstat(full)
            if stat.S_ISLNK(mode.st_mode):
                raise ArchiveError(f"refusing to send {full}: symbolic links are not sent "
                                   "(copy the target into the directory instead)")
            if stat.S_ISDIR(mode.st_mode):
                dirs.append(rel)
            elif stat.S_ISREG(mode.st_mode):
                if mode.st_nlink > 1:
                    raise ArchiveError(f"refusing to send {full}: it is a hard link "
                                       f"({mode.st_nlink} names); copy it instead")
                files.append(rel)
            else:
                raise ArchiveError(f"refusing to send {full}: not a regular file or directory")
    return sorted(files), sorted(dirs)


def _tarinfo(name: str, st: os.stat_result, is_dir: bool) -> tarfile.TarInfo:
    # Owner and group are dropped so that the same tree packs to the same bytes anywhere.
    info = tarfile.TarInfo(name)
    info.mtime = int(st.st_mtime)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if is_dir:
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
    else:
        info.type = tarfile.REGTYPE
        info.mode = 0o755 if st.st_mode & 0o111 else 0o644
        info.size = st.st_size
    return info


def pack_directories(entries: list[tuple[str | os.PathLike[str], str]]) -> bytes:
    """Pack several directories into one gzip tar; each (local_dir, prefix) is placed under
    ``prefix`` ("" = the archive root). Raises ArchiveError on links, special files and on
    two entries that would write the same path (or a file where the other has a directory).
    """
    plan: list[tuple[str, str, bool]] = []  # (archive name, local path, is_dir)
    owner: dict[str, tuple[str, bool]] = {}  # archive name -> (local dir, is_dir)
    for local_dir, prefix in entries:
        local_dir = os.fspath(local_dir)
        prefix = normalize_member_path(prefix) if prefix else ""
        files, dirs = list_directory(local_dir)
        # The prefix's own directories are implied; record them so conflicts show up.
        prefix_parts = prefix.split("/") if prefix else []
        implied = ["/".join(prefix_parts[: i + 1]) for i in range(len(prefix_parts))]
        named = ([(p, None, True) for p in implied]
                 + [(_join_prefix(prefix, d), os.path.join(local_dir, d), True) for d in dirs]
                 + [(_join_prefix(prefix, f), os.path.join(local_dir, f), False) for f in files])
        for name, path, is_dir in named:
            seen = owner.get(name)
            if seen is not None:
                if is_dir and seen[1]:
                    continue  # two sends sharing a directory is fine
                raise ArchiveError(f"sends collide at {name!r}: both {seen[0]} and {local_dir} "
                                   "would write it")
            owner[name] = (local_dir, is_dir)
            if path is not None or is_dir:
                plan.append((name, path or local_dir, is_dir))
    buf = io.BytesIO()
    # mtime=0 in the gzip header keeps the bytes (and so the blob digest) reproducible;
    # level 1: sends are mostly small and the network is fast, so speed beats ratio.
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=1, mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name, path, is_dir in sorted(plan):
                st = os.stat(path, follow_symlinks=False)
                info = _tarinfo(name, st, is_dir)
                if is_dir:
                    tar.addfile(info)
                else:
                    with open(path, "rb") as fh:
                        data = fh.read()
                    # The file may have changed between stat and read; send what was read.
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def pack_directory(local_dir: str | os.PathLike[str], prefix: str = "") -> bytes:
    """Pack one directory (see pack_directories)."""
    return pack_directories([(local_dir, prefix)])


def check_archive(
    data: bytes,
    *,
    max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
    max_members: int = DEFAULT_MAX_MEMBERS,
) -> list[str]:
    """Validate an archive without writing anything; return its normalised entry names."""
    with _open_tar(data) as tar:
        return [name for name, _ in _checked_members(tar, max_total_bytes, max_members)]


def _open_tar(data: bytes) -> tarfile.TarFile:
    try:
        return tarfile.open(fileobj=io.BytesIO(data), mode="r:*")
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ArchiveError(f"not a readable tar archive: {exc}") from None


def _checked_members(
    tar: tarfile.TarFile, max_total_bytes: int, max_members: int
) -> list[tuple[str, tarfile.TarInfo]]:
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
            name = normalize_member_path(member.name)
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
                total += member.size
                if total > max_total_bytes:
                    raise ArchiveError(
                        f"archive contents exceed the limit of {max_total_bytes} bytes")
            out.append((name, member))
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ArchiveError(f"corrupt tar archive: {exc}") from None
    return out


def safe_unpack(
    data: bytes,
    dest: str | os.PathLike[str],
    *,
    max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
    max_members: int = DEFAULT_MAX_MEMBERS,
) -> list[str]:
    """Unpack a (possibly compressed) tar into the existing directory ``dest``.

    Refuses ``..``, absolute paths, links, devices, FIFOs, duplicate entries and contents
    over ``max_total_bytes``. Every header is validated first, so a refused archive
    writes nothing. Files are created exclusively and never through a link. Returns the
    files written, as relative POSIX paths.
    """
    dest = os.fspath(dest)
    written: list[str] = []
    with _open_tar(data) as tar:
        members = _checked_members(tar, max_total_bytes, max_members)
        for name, member in members:
            target = os.path.join(dest, *name.split("/"))
            _make_parents(dest, name)
            if member.isdir():
                if os.path.lexists(target):
                    if os.path.islink(target) or not os.path.isdir(target):
                        raise ArchiveError(f"cannot create directory {name!r}: a file is there")
                else:
                    os.mkdir(target, 0o755)
                continue
            try:
                source = tar.extractfile(member)
            except (tarfile.TarError, EOFError, OSError) as exc:
                raise ArchiveError(f"corrupt data for {name!r}: {exc}") from None
            if source is None:  # pragma: no cover - regular files always have data
                raise ArchiveError(f"no data for {name!r}")
            mode = 0o755 if member.mode & 0o111 else 0o644
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
            try:
                fd = os.open(target, flags, mode)
            except FileExistsError:
                raise ArchiveError(f"{name!r} already exists in the destination") from None
            with os.fdopen(fd, "wb") as out, source:
                remaining = member.size
                while remaining > 0:
                    chunk = source.read(min(remaining, 1 << 20))
                    if not chunk:
                        raise ArchiveError(f"truncated data for {name!r}")
                    out.write(chunk)
                    remaining -= len(chunk)
            written.append(name)
    return written


def _make_parents(dest: str, name: str) -> None:
    # Create parents one level at a time, refusing any that is a link: nothing is ever
    # written through a symbolic link that was already in the destination.
    current = dest
    for part in name.split("/")[:-1]:
        current = os.path.join(current, part)
        if os.path.islink(current):
            raise ArchiveError(f"refusing to write under the symbolic link {current}")
        if not os.path.isdir(current):
            if os.path.lexists(current):
                raise ArchiveError(f"refusing to write under the file {current}")
            os.mkdir(current, 0o755)
