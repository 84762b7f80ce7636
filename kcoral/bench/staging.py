"""Finding a workload's parts and staging the files a bench or gputest sends.

Bench archive layout (what the server-side runner expects):
    judge/            the judge package (shared by the KDA workloads), with kcoral's
                      sandbox helpers beside it as judge/sandboxed.py
    workload.json     the workload spec
    candidate/        the candidate directory, whole
    against/          (optional) the candidate timed in the baseline slot
gputest adds `test_small.py` at the root and runs it there.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kcoral.errors import KcoralError
from kcoral import workloads
from kcoral.archive import pack_directory
from kcoral.runners import bench_runner_source, sandboxed_source

IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".git")


class BenchInputError(KcoralError, ValueError):
    """A workload or candidate path that cannot be benchmarked; the message says why."""


@dataclass(frozen=True)
class Workload:
    root: Path
    name: str
    spec: dict
    judge_dir: Path

    @property
    def holdout_count(self) -> int:
        return int(self.spec["holdout"]["count"])

    @property
    def holdout_namespace(self) -> str:
        # Fixed per workload: every bench of it faces the same private holdout.
        return f"kda/{self.name}/holdout"


def load_workload(workload_dir: str | Path) -> Workload:
    """A workload folder, or the name of a built-in one (kcoral.workloads)."""
    try:
        root = workloads.resolve(workload_dir)
    except workloads.WorkloadNotFound as exc:
        raise BenchInputError(str(exc)) from None
    spec_path = root / workloads.SPEC
    try:
        spec = json.loads(spec_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BenchInputError(f"cannot read {spec_path}: {exc}") from None
    if not isinstance(spec, dict) or "holdout" not in spec or "name" not in spec:
        raise BenchInputError(f"{spec_path}: not a workload spec (needs name and holdout)")
    # The judge may live in the workload dir or, shared, in its parent (kcoral/workloads/kda/judge).
    for judge in (root / "judge", root.parent / "judge"):
        if (judge / "__main__.py").is_file() and (judge / "runner.py").is_file():
            return Workload(root=root, name=str(spec["name"]), spec=spec, judge_dir=judge)
    raise BenchInputError(f"no judge found for {root} (looked in {root / 'judge'} and {root.parent / 'judge'})")


def resolve_candidate(workload: Workload, candidate: str | Path) -> Path:
    """CANDIDATE relative to the workload dir (scratch/reference) or a path of its own."""
    cand = Path(candidate)
    options = [cand] if cand.is_absolute() else [workload.root / cand, cand]
    for path in options:
        if (path / "solution.py").is_file():
            return path
    tried = ", ".join(str(p) for p in options)
    raise BenchInputError(f"no candidate at {candidate!r}: no solution.py in {tried}")


def runner_source(workload: Workload) -> str:
    return bench_runner_source((workload.judge_dir / "runner.py").read_text())


def stage(workload: Workload, dest: Path, candidate: Path, against: Path | None = None,
          with_gputest: bool = False) -> Path:
    """Copy what the server needs into dest (a fresh directory); return dest."""
    shutil.copytree(workload.judge_dir, dest / "judge", ignore=IGNORED)
    # A stock server has no kcoral: the judge imports this copy (judge/__init__.py).
    (dest / "judge" / "sandboxed.py").write_text(sandboxed_source(), encoding="utf-8")
    shutil.copyfile(workload.root / "workload.json", dest / "workload.json")
    shutil.copytree(candidate, dest / "candidate", ignore=IGNORED)
    if against is not None:
        shutil.copytree(against, dest / "against", ignore=IGNORED)
    if with_gputest:
        # A workload may carry its own test_small.py; otherwise the judge's generic one,
        # which reads the shapes and rules from workload.json.
        test = workload.root / "test_small.py"
        if not test.is_file():
            test = workload.judge_dir / "test_small.py"
        if not test.is_file():
            raise BenchInputError(f"neither {workload.root} nor {workload.judge_dir} has a test_small.py")
        shutil.copyfile(test, dest / "test_small.py")
    return dest


def bench_archive(workload: Workload, candidate: Path, against: Path | None = None) -> bytes:
    with tempfile.TemporaryDirectory(prefix="kcoral-bench-") as tmp:
        return pack_directory(stage(workload, Path(tmp), candidate, against))
