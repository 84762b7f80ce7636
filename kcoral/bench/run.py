"""`run_bench` and `run_gputest`: the library calls behind `kcoral bench` (and the
pipeline's gputest and bench stages)."""
from __future__ import annotations

import math
import re
import secrets
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kcoral.capabilities import HOLDOUT_SEEDS, capabilities_of
from kcoral.errors import OutcomeUnknown, RemoteError
from kcoral.protocol.error_kind import ErrorKind
from kcoral.remote import server_max_timeout

from .program import bench_program
from .report import BenchReport, GputestReport
from .staging import bench_archive, load_workload, resolve_candidate, runner_source, stage

# The judge subprocess stops this long before the program's own limit, so its partial
# report and log still come back.
RUNNER_MARGIN_S = 30.0
BAD_LINE = re.compile(r"^regime=(?P<name>[A-Za-z0-9_]+) bad=(?P<frac>\S+)\s*$", re.M)
QUICK_LINE = re.compile(r"^quick_ms=(?P<ms>\S+) calls=\d+\s*$", re.M)
QUICK_MARK = "# quick timing"   # test_small.py's line before it times the scored shape


def _candidate_label(workload_root: Path, cand: Path) -> str:
    try:
        return cand.resolve().relative_to(workload_root.resolve()).as_posix()
    except ValueError:
        return cand.name


def run_bench(client: Any, workload_dir: str | Path, candidate_dir: str | Path,
              timeout: float = 1500, against: str | Path | None = None) -> BenchReport:
    """The official benchmark of one candidate. Raises BenchInputError for bad local paths;
    every remote problem is a failed BenchReport (failure_kind transport/timeout/...)."""
    wl = load_workload(workload_dir)
    cand = resolve_candidate(wl, candidate_dir)
    other = resolve_candidate(wl, against) if against is not None else None
    archive = bench_archive(wl, cand, other)
    # A stock server clamps larger limits to its own ceiling: plan the judge's margin on it.
    timeout = min(float(timeout), server_max_timeout(client))
    needs_gpu = gpu_missing(client, wl.spec)
    if needs_gpu:
        return BenchReport.failure(ErrorKind.UNAVAILABLE, needs_gpu, candidate=_candidate_label(wl.root, cand),
                                   workload=wl.name)
    server_seeds = holdout_on_server(client)
    options = {
        "timeout_s": max(10.0, timeout - RUNNER_MARGIN_S),
        "candidate_name": _candidate_label(wl.root, cand),
        "against_name": _candidate_label(wl.root, other) if other is not None else None,
        "holdout_source": "server" if server_seeds else "client",
    }
    source = runner_source(wl)
    seeds = None if server_seeds else client_seeds(wl.holdout_count)
    program, seeds_reg = bench_program(source, archive, wl.holdout_namespace, wl.holdout_count, options, seeds)
    try:
        outcome = client.execute(program, timeout_seconds=timeout)
        if (outcome.status == "FAILED" and outcome.error is not None and seeds_reg is not None
                and outcome.error.instruction_id == seeds_reg.id and outcome.error.kind == ErrorKind.UNAVAILABLE):
            # A server that announced the builtin but cannot serve it: draw seeds here and say so.
            options["holdout_source"] = "client"
            program, _ = bench_program(source, archive, wl.holdout_namespace, wl.holdout_count, options,
                                       client_seeds(wl.holdout_count))
            outcome = client.execute(program, timeout_seconds=timeout)
    except OutcomeUnknown:
        raise   # not a verdict on the candidate: the caller decides whether to run it again
    except RemoteError as exc:
        kind = ErrorKind.TIMEOUT if exc.kind == ErrorKind.TIMEOUT else ErrorKind.TRANSPORT
        return BenchReport.failure(kind, f"{exc.kind}: {exc.message}", candidate=options["candidate_name"],
                                   workload=wl.name, request_id=exc.request_id or "")
    meta = dict(request_id=outcome.request_id, server_instance=outcome.server_instance, gpu=outcome.gpu,
                node_id=outcome.node_id,
                queue_ms=outcome.queue_ms, lease_held_ms=outcome.lease_held_ms)
    if outcome.status == "FAILED":
        err = outcome.error
        kind = err.kind if err is not None and err.kind in (ErrorKind.TIMEOUT, ErrorKind.UNAVAILABLE) else ErrorKind.RUNTIME
        return BenchReport.failure(kind, f"{err.kind if err else 'engine'}: {err.message if err else ''}",
                                   candidate=options["candidate_name"], workload=wl.name, **meta)
    result = outcome.results.get("bench")
    if not isinstance(result, dict):
        return BenchReport.failure(ErrorKind.TRANSPORT, f"the runner returned {type(result).__name__}, not a dict",
                                   candidate=options["candidate_name"], workload=wl.name, **meta)
    log = str(result.get("log") or "")
    raw = result.get("report")
    if raw is None:
        if result.get("timed_out"):
            kind, msg = ErrorKind.TIMEOUT, f"the judge ran past {options['timeout_s']:.0f} s and was stopped"
        else:
            kind, msg = ErrorKind.RUNTIME, str(result.get("runner_error") or "the judge produced no report")
        return BenchReport.failure(kind, msg, candidate=options["candidate_name"], workload=wl.name,
                                   log=log, **meta)
    rep = BenchReport.from_judge(raw, log=log, **meta)
    if result.get("timed_out") and rep.passed:
        rep = rep.model_copy(update={"passed": False, "failure_kind": ErrorKind.TIMEOUT})
    return rep


def holdout_on_server(client: Any) -> bool:
    """Whether the server draws the holdout seeds from its private salt (our extension);
    otherwise the client draws them and the report says `holdout_source: client`."""
    info = capabilities_of(client)
    return info is None or info.has(HOLDOUT_SEEDS)


def gpu_missing(client: Any, spec: dict[str, Any]) -> str:
    """Why a GPU workload cannot run on a stock CPU server ("" when nothing stops it);
    our CPU servers answer for themselves."""
    info = capabilities_of(client)
    if spec.get("device", "cuda") == "cpu" or info is None or not info.stock_cpu:
        return ""
    return (f"the workload runs on a GPU (device {spec.get('device', 'cuda')!r}) and this server "
            f"({info.describe()}) has none; a CPU twin such as forward_cpu_small runs there")


def client_seeds(count: int) -> list[int]:
    return [secrets.randbits(64) for _ in range(count)]


def bad_line_values(stdout: str) -> Iterator[tuple[str, float | None]]:
    """Every `regime=NAME bad=X` line's name and value, None where X is not a finite number."""
    for m in BAD_LINE.finditer(stdout):
        try:
            frac = float(m.group("frac"))
        except ValueError:
            frac = math.nan
        yield m.group("name"), frac if math.isfinite(frac) else None


def parse_bad_lines(stdout: str) -> dict[str, float]:
    """{regime: bad fraction} from `regime=NAME bad=X` lines. The candidate shares stdout, so
    a regime printed twice keeps its worst value (a later `bad=0` cannot hide a bad line), and
    a value that is not a finite number counts as 1.0, all bad (no NaN, which PostgreSQL's json
    refuses; the evolve gputest stage names such regimes)."""
    out: dict[str, float] = {}
    for name, frac in bad_line_values(stdout):
        worst = 1.0 if frac is None else frac
        out[name] = max(worst, out.get(name, worst))
    return out


def parse_quick_ms(stdout: str) -> float | None:
    """The last `quick_ms=MS calls=N` line's MS, if it is a positive finite number."""
    found = QUICK_LINE.findall(stdout)
    try:
        ms = float(found[-1]) if found else None
    except ValueError:
        return None
    return ms if ms is not None and math.isfinite(ms) and ms > 0 else None


def stage_gputest(workload_dir: str | Path, candidate_dir: str | Path, dest: str | Path) -> Path:
    """Put the judge, workload.json, test_small.py and the candidate (as candidate/) in dest."""
    wl = load_workload(workload_dir)
    cand = resolve_candidate(wl, candidate_dir)
    return stage(wl, Path(dest), cand, with_gputest=True)


def run_gputest(client: Any, workload_dir: str | Path, candidate_dir: str | Path, cases: str = "all",
                timeout: float = 600, env: dict[str, str] | None = None, quick_calls: int = 0) -> GputestReport:
    """test_small.py on the server: small shapes, one `regime=NAME bad=FRACTION` line per
    regime; passes iff it exits 0 and every fraction is 0. With `quick_calls`, a passing
    candidate is also timed at the scored shape (`quick_ms`: in the candidate's process, so
    only ever a reason to skip its bench, never a result)."""
    from kcoral.remote import SendSpec, run_python

    if quick_calls < 0:
        raise ValueError(f"quick_calls must be 0 or more, not {quick_calls}")
    run_env = {"CANDIDATE": "candidate", "CASES": cases, "QUICK_CALLS": str(quick_calls)}
    run_env.update(env or {})
    with tempfile.TemporaryDirectory(prefix="kcoral-gputest-") as tmp:
        staged = stage_gputest(workload_dir, candidate_dir, Path(tmp) / "gputest")
        try:
            res = run_python(client, [SendSpec(staged)], script="test_small.py", args=[], env=run_env,
                             timeout=timeout)
        except OutcomeUnknown:
            raise
        except RemoteError as exc:
            return GputestReport(passed=False, message=f"{exc.kind}: {exc.message}")
    regimes = parse_bad_lines(res.stdout)
    clean = bool(regimes) and all(v == 0 for v in regimes.values())
    passed = res.exit_code == 0 and not res.timed_out and clean
    quick = parse_quick_ms(res.stdout)
    message = "" if passed else "test_small.py reported bad elements or failed"
    if res.timed_out and clean and QUICK_MARK in res.stdout and quick is None:
        # Every regime passed; only the quick timing at the scored shape ran out of time. The
        # candidate is correct: it passes without a quick time (and so is never screened).
        passed, message = True, "the quick timing ran past the timeout: no quick time"
    return GputestReport(passed=passed, regimes=regimes, quick_ms=quick if passed else None, exit_code=res.exit_code,
                         timed_out=res.timed_out, stdout=res.stdout, stderr=res.stderr, message=message)
