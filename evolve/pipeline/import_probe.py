"""The check stage's import probe, run on the KCoral server, never where evolve runs.

Importing a candidate executes it: a helper module beside `solution.py` once forged rows
in evolve's database and read `$KCORAL_TOKEN` from a local probe. So the probe is a
KCoral program like every other stage: the candidate (without `__pycache__`/`*.pyc`,
as the bench stages it) and a stdlib-only probe script go to the server, which imports
`solution.py` in a worker's fresh workspace with the server's environment. On a
CPU-only server it runs there too; a GPU-only package missing there skips the probe.

The probe is a cheap gate, not a verdict: the candidate shares the probe's interpreter
and could fake the answer line, which only lets it reach gputest, where the judge runs.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kcoral import Client
from kcoral.remote import SendSpec, run_python

from evolve.pipeline.timings import node_metric, outcome_fields

ENTRY = "solution.py"
# Packages that exist only where the GPU is; an import that lacks them is not a failure.
GPU_ONLY_MODULES = {"cupy", "cupyx", "torch", "triton", "cuda", "fla", "pycuda", "cutlass"}
CANDIDATE_SUBDIR = "candidate"
PROBE_SCRIPT = "evolve_import_probe.py"
ANSWER_PREFIX = "EVOLVE-IMPORT-PROBE "
# Not sent: stale bytecode could differ from the sources the static rules read.
NOT_SENT = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo")

_PROBE_SOURCE = r'''
import importlib.util, json, os, sys

def answer(**kv):
    sys.stdout.flush()
    print("%s" + json.dumps(kv), flush=True)

os.chdir(sys.argv[1])
sys.path.insert(0, os.getcwd())
try:
    spec = importlib.util.spec_from_file_location("candidate_solution", "%s")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
except ModuleNotFoundError as exc:
    answer(missing=exc.name, error=f"{type(exc).__name__}: {exc}")
except BaseException as exc:
    answer(error=f"{type(exc).__name__}: {exc}")
else:
    answer(setup=callable(getattr(mod, "setup", None)))
''' % (ANSWER_PREFIX, ENTRY)


@dataclass
class ProbeResult:
    error: str | None                       # why the candidate fails the probe; None: it passed
    metrics: dict[str, Any] = field(default_factory=dict)
    timing: dict[str, Any] = field(default_factory=dict)   # queue_ms, lease_held_ms, server_instance


def _stage(directory: Path, into: Path) -> None:
    shutil.copytree(directory, into / CANDIDATE_SUBDIR, ignore=NOT_SENT, symlinks=True)
    (into / PROBE_SCRIPT).write_text(_PROBE_SOURCE, encoding="utf-8")


def _answer(stdout: str) -> dict[str, Any] | None:
    lines = [ln[len(ANSWER_PREFIX):] for ln in stdout.splitlines() if ln.startswith(ANSWER_PREFIX)]
    try:
        return json.loads(lines[-1]) if lines else None
    except ValueError:
        return None


def probe(client: Client, directory: Path, timeout: float) -> ProbeResult:
    """Import `directory/solution.py` on the server and check that it defines `setup`.
    Transport errors propagate (the stage's retry waits them out)."""
    with tempfile.TemporaryDirectory(prefix="evolve-probe-") as tmp:
        _stage(directory, Path(tmp))
        res = run_python(client, [SendSpec(Path(tmp))], script=PROBE_SCRIPT, args=[CANDIDATE_SUBDIR],
                         env={}, timeout=timeout)
    outcome = res.outcome
    timing = {**outcome_fields(outcome), "server_instance": getattr(outcome, "server_instance", None)}
    if res.timed_out:
        return ProbeResult(f"importing {ENTRY} took longer than {timeout:.0f} s", timing=timing)
    answer = _answer(res.stdout)
    if answer is None:
        return ProbeResult(f"import probe failed (exit {res.exit_code}): {res.stderr[-2000:]}", timing=timing)
    missing = answer.get("missing")
    if missing and str(missing).split(".")[0] in GPU_ONLY_MODULES:
        return ProbeResult(None, {"import": f"skipped on the server: needs {missing}", **node_metric(outcome)}, timing)
    if "error" in answer:
        return ProbeResult(str(answer["error"]), timing=timing)
    if not answer.get("setup"):
        return ProbeResult(f"{ENTRY} defines no callable setup(data, B, T, H)", timing=timing)
    return ProbeResult(None, {"import": "ok", **node_metric(outcome)}, timing)
