"""`evolve register PATH`: an agent's scratch candidate joins the population."""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

from evolve.db import DB_HELP, SchemaVersionError, open_database
from evolve.paths import display_path
from evolve.population import NewCandidate, Population

IGNORED_DIRS = {"__pycache__"}
ENTRY_POINT = "solution.py"


class RegisterError(ValueError):
    pass


def directory_digest(root: Path) -> str:
    """sha256 over the directory's files: sorted relative paths and contents, each framed
    by its length so that no two different trees hash alike. Links are refused (they
    would not travel with the candidate); __pycache__ folders are ignored."""
    if root.is_symlink() or not root.is_dir():
        raise RegisterError(f"{root} is not a directory")
    files: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        for name in dirnames:
            if (here / name).is_symlink():
                raise RegisterError(f"{here / name} is a symbolic link; copy the files instead")
        dirnames[:] = sorted(d for d in dirnames if d not in IGNORED_DIRS)
        for name in filenames:
            path = here / name
            if path.is_symlink():
                raise RegisterError(f"{path} is a symbolic link; copy the file instead")
            if not path.is_file():
                raise RegisterError(f"{path} is not a regular file")
            files.append((path.relative_to(root).as_posix(), path))
    digest = hashlib.sha256()
    for rel, path in sorted(files):
        data = path.read_bytes()
        name = rel.encode()
        digest.update(len(name).to_bytes(8, "big") + name + len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


def infer_workload(path: Path) -> tuple[str, Path] | None:
    """(name, workload dir) from a path like .../candidates/kda/<workload>/scratch/x."""
    parts = path.resolve().parts
    for i in range(len(parts) - 3):
        if parts[i] == "candidates" and parts[i + 1] == "kda":
            return parts[i + 2], Path(*parts[: i + 3])
    return None


def register_candidate(
    pop: Population,
    path: Path,
    *,
    name: str | None = None,
    author: str | None = None,
    notes: str | None = None,
    workload: str | None = None,
) -> tuple[int, bool]:
    if not (path / ENTRY_POINT).is_file():
        raise RegisterError(f"{path} has no {ENTRY_POINT}")
    digest = directory_digest(path)
    inferred = infer_workload(path)
    if workload is None:
        if inferred is None:
            raise RegisterError(
                f"can't tell the workload of {path} (not under candidates/kda/<workload>/); pass --workload"
            )
        workload, wdir = inferred
        workload_path = display_path(wdir)
    else:
        known = pop.workload(workload)
        if known is not None:
            workload_path = known.path
        elif inferred is not None and inferred[0] == workload:
            workload_path = display_path(inferred[1])
        else:
            workload_path = f"candidates/kda/{workload}"
    wid = pop.ensure_workload(name=workload, path=workload_path)
    cand, created = pop.add_candidate(
        NewCandidate(
            workload_id=wid,
            origin="agent",
            digest=digest,
            directory=display_path(path),
            name=name or path.resolve().name,
            author=author,
            notes=notes,
        )
    )
    return cand.id, created


def _run(args: argparse.Namespace) -> int:
    try:
        pop = Population(open_database(args.db))
        cid, created = register_candidate(
            pop, Path(args.path), name=args.name, author=args.author, notes=args.notes, workload=args.workload
        )
    except (RegisterError, SchemaVersionError, KeyError) as exc:
        print(f"evolve register: {exc}", file=sys.stderr)
        return 2
    print(cid)
    if not created:
        existing = pop.candidate(cid)
        where = existing.directory if existing else "?"
        print(f"identical sources already registered as candidate {cid} ({where})", file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("register", help="add an agent's scratch candidate to the population")
    p.add_argument("path", help="candidate directory (holds solution.py)")
    p.add_argument("--name", help="short name (default: the directory name)")
    p.add_argument("--author", help="who wrote it (agent or person)")
    p.add_argument("--notes", help="free text: the idea behind it")
    p.add_argument("--workload", help="workload name (default: from candidates/kda/<workload>/...)")
    p.add_argument("--db", help=DB_HELP)
    p.set_defaults(func=_run)
