"""`evolve register PATH`: an agent's scratch candidate joins the population."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kcoral import workloads

from evolve.commands.jsonout import add_json_flag, emit
from evolve.db import DB_HELP, SchemaVersionError, open_database
from evolve.digest import DigestError, source_digest
from evolve.paths import display_path
from evolve.population import NewCandidate, Population
from evolve.safe_text import safe_text
from evolve.vocabulary import Origin

ENTRY_POINT = "solution.py"


class RegisterError(ValueError):
    pass


def infer_workload(path: Path) -> tuple[str, Path] | None:
    """(name, workload dir) from a path like .../<workload>/scratch/<candidate>: agents
    work in the scratch folder of a workload (kcoral/workloads/kda/<workload>/scratch in
    the repository, or a copy of a workload folder anywhere)."""
    parts = path.resolve().parts
    for i in range(len(parts) - 2, 0, -1):
        if parts[i] == "scratch":
            return parts[i - 1], Path(*parts[:i])
    return None


def register_candidate(
    pop: Population,
    path: Path,
    *,
    name: str | None = None,
    author: str | None = None,
    notes: str | None = None,
    workload: str | None = None,
    edit_of: int | None = None,
) -> tuple[int, bool]:
    """Add the folder's sources; a folder that held another candidate's sources (or
    `edit_of`'s) makes the new one that candidate's child, operator "edit"."""
    if not (path / ENTRY_POINT).is_file():
        raise RegisterError(f"{path} has no {ENTRY_POINT}")
    try:
        digest = source_digest(path)
    except DigestError as exc:
        raise RegisterError(str(exc)) from None
    inferred = infer_workload(path)
    if workload is None:
        if inferred is None:
            raise RegisterError(
                f"can't tell the workload of {path} (not under <workload>/scratch/); pass --workload"
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
            builtin = workloads.builtin().get(workload)
            workload_path = display_path(builtin) if builtin is not None else workload
    wid = pop.ensure_workload(name=workload, path=workload_path)
    directory = display_path(path)
    # The folder held other sources before: this is an edit of that candidate, its child.
    before = pop.candidate(edit_of) if edit_of is not None else pop.candidate_by_directory(directory)
    edited = before is not None and before.workload_id == wid and before.digest != digest
    cand, created = pop.add_candidate(
        NewCandidate(
            workload_id=wid,
            origin=Origin.AGENT,
            digest=digest,
            directory=directory,
            name=name or (before.name if edited and before else None) or path.resolve().name,
            author=author,
            notes=notes,
            parents=[before.id] if edited and before else [],
            generation=before.generation + 1 if edited and before else 0,
            operator="edit" if edited else None,
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
        print(safe_text(f"evolve register: {exc}"), file=sys.stderr)   # may name the candidate's files
        return 2
    existing = pop.candidate(cid)
    if args.json:
        emit({"candidate_id": cid, "created": created,
              "candidate": existing.model_dump(mode="json") if existing else None})
    else:
        print(cid)
    if not created:
        where = existing.directory if existing else "?"
        print(safe_text(f"identical sources already registered as candidate {cid} ({where})"), file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("register", help="add an agent's scratch candidate to the population")
    p.add_argument("path", help="candidate directory (holds solution.py)")
    p.add_argument("--name", help="short name (default: the directory name)")
    p.add_argument("--author", help="who wrote it (agent or person)")
    p.add_argument("--notes", help="free text: the idea behind it")
    p.add_argument("--workload", help="workload name (default: from <workload>/scratch/... in the path)")
    p.add_argument("--db", help=DB_HELP)
    add_json_flag(p)
    p.set_defaults(func=_run)
