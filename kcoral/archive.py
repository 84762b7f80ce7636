"""Tar archives of directories: packing that refuses links and special files, so the
remote side sees exactly what is here. The other side, unpacking, runs inside the sandbox
and lives with the path rules in ``kcoral.runners.sandboxed``.
"""
from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile

from kcoral.runners.sandboxed import ArchiveError, PathError, normalize_path, read_regular


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
        try:
            prefix = normalize_path(prefix, allow_root=True) if prefix else ""
        except PathError as exc:
            raise ArchiveError(f"bad destination of a send: {exc}") from None
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
                    try:
                        data = read_regular(path)
                    except OSError as exc:  # swapped for a link or a FIFO since the walk
                        raise ArchiveError(f"refusing to send {path}: {exc}") from None
                    # The file may have changed between stat and read; send what was read.
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def pack_directory(local_dir: str | os.PathLike[str], prefix: str = "") -> bytes:
    """Pack one directory (see pack_directories)."""
    return pack_directories([(local_dir, prefix)])
