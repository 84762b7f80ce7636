"""The official benchmark of one candidate: holdout, probes, stress, scored checks, timing.

Order matters: the holdout runs first and a failure there stops everything (nothing is
timed); any other correctness failure also skips timing. The report is a JSON-ready dict.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .backend import BF16_NAN_BITS, Backend, BackendUnavailable, bits_view, make_backend
from .baseline import make_baseline
from .compare import check_output
from .harness import CandidateError, Prepared, ScopedCandidate, load_solution
from .inputs import holdout_cases, holdout_inputs, regime_inputs
from .reference import chunked_f32, recurrence_f64
from .spec import SpecError, WorkloadSpec, load_spec
from .timing import method_text, summarise, time_trial


@dataclass
class Case:
    name: str
    group: str  # holdout | probe | stress | scored | timing
    status: str = "PASS"  # PASS | FAIL | FLAKY
    detail: str = ""
    calls: list = field(default_factory=list)  # per call: {"ok", "detail", "rms": {...}}

    def as_dict(self) -> dict:
        return {"name": self.name, "group": self.group, "status": self.status, "detail": self.detail,
                "calls": self.calls}


class Stop(Exception):
    """Ends the run early with a failure kind (the report is complete up to here)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message


class CallChecker:
    """Checks calls of one prepared candidate; remembers the last output to catch replays."""

    def __init__(self, be: Backend, spec: WorkloadSpec, prep: Prepared) -> None:
        self.be, self.spec, self.prep = be, spec, prep
        self.last_out = prep.setup_output
        self.last_in = prep.setup_q

    def check(self, fresh: dict, oracle: str, loose: bool) -> dict:
        be, spec, prep, xp = self.be, self.spec, self.prep, self.be.xp
        prep.refill(fresh)
        problems = prep.call()
        out_bits = bits_view(xp, prep.output).copy()
        in_bits = bits_view(xp, prep.inputs["q"]).copy()
        # NaN poison left in place is reported as such, not as a replay.
        if self.last_out is not None and not bool((out_bits == BF16_NAN_BITS).any()) \
                and bool((out_bits == self.last_out).all()) and not bool((in_bits == self.last_in).all()):
            problems.append("output bit-identical to the previous call although the inputs changed "
                            "(a replayed result)")
        self.last_out, self.last_in = out_bits, in_bits
        if oracle == "f64":
            ref_out, ref_state = recurrence_f64(xp, prep.inputs, spec.scale, spec.gate_floor, spec.norm_eps)
        else:
            ref_out, ref_state = chunked_f32(xp, prep.inputs, spec.scale, spec.gate_floor, spec.norm_eps, spec.chunk)
        tol = spec.loose_tolerance if loose else spec.tolerance
        rms = {}
        for name, x, ref in (("output", prep.output, ref_out), ("final_state", prep.final_state, ref_state)):
            v = check_output(xp, name, x, ref, tol)
            rms[name] = v.rms_ratio if math.isfinite(v.rms_ratio) else None
            if not v.ok:
                problems.append(v.detail)
        return {"ok": not problems, "detail": "; ".join(problems), "rms": rms}


def _series_status(calls: list[dict]) -> tuple[str, str]:
    """FAIL if the first failing call has no pass before it, FLAKY if a pass came first."""
    for i, c in enumerate(calls):
        if not c["ok"]:
            status = "FLAKY" if i > 0 else "FAIL"
            return status, f"call {i + 1} of {len(calls)}: {c['detail']}"
    return "PASS", f"{len(calls)} call(s)"


class Judge:
    def __init__(self, root: Path, seeds: list[int], holdout_source: str, options: dict) -> None:
        self.root = root
        self.seeds = [int(s) for s in seeds]
        self.holdout_source = holdout_source
        self.options = options
        self.cases: list[Case] = []
        self.against = None
        self.report: dict = {
            "workload": "", "candidate": options.get("candidate_name", "candidate"),
            "passed": False, "failure_kind": None, "message": "",
            "holdout_pass": None, "holdout_source": holdout_source, "holdout_detail": "",
            "baseline_name": None, "baseline_note": "", "method": None, "device": None,
            "baseline_ms": None, "kernel_ms": None, "speedup": None, "spread": None,
            "trials": [], "timing_flags": [], "baseline_check": None, "cases": [], "elapsed_s": 0.0,
        }

    def log(self, text: str) -> None:
        """Progress on stderr (it reaches the report's log, even when the run is cut short)."""
        print(f"[judge {time.monotonic() - self.t0:7.1f}s] {text}", file=sys.stderr, flush=True)

    # ---- phases
    def run(self) -> dict:
        t0 = self.t0 = time.monotonic()
        try:
            self._run()
            self.report["passed"] = True
        except Stop as stop:
            self.report["failure_kind"] = stop.kind
            self.report["message"] = stop.message
        except Exception:  # noqa: BLE001 - a judge fault still yields a report, never a pass
            import traceback

            self.report["failure_kind"] = "runtime"
            self.report["message"] = "judge error:\n" + traceback.format_exc()[-4000:]
        self.report["cases"] = [c.as_dict() for c in self.cases]
        self.report["elapsed_s"] = round(time.monotonic() - t0, 3)
        return _finite(self.report)

    def _run(self) -> None:
        try:
            self.spec = spec = load_spec(self.root / "workload.json")
        except SpecError as exc:
            raise Stop("check", str(exc)) from None
        self.report["workload"] = spec.name
        try:
            self.be = be = make_backend(spec.device)
        except BackendUnavailable as exc:
            raise Stop("unavailable", str(exc)) from None
        self.report["device"] = be.name
        try:
            if (self.root / "against").is_dir():
                # Two candidates in one process: each keeps its own helper modules.
                module = ScopedCandidate(self.root / "candidate", "kda_candidate")
                self.against = ScopedCandidate(self.root / "against", "kda_against")
            else:
                module = load_solution(self.root / "candidate", "kda_candidate")
        except CandidateError as exc:
            self.report["holdout_pass"] = False
            self.report["holdout_detail"] = f"{exc.kind}: {exc.message.splitlines()[0]}"
            raise Stop(exc.kind, exc.message) from None
        self.module = module
        self.log(f"device {be.name}; holdout")
        self._holdout()
        self.log("probes")
        self._probes()
        self.log("stress and scored calls")
        prep = self._scored_and_stress()
        self.log("timing")
        self._timing(prep)
        self.log("done")

    def _fail(self, case: Case, kind: str) -> None:
        raise Stop(kind, f"{case.name}: {case.detail}")

    def _holdout(self) -> None:
        spec, be = self.spec, self.be
        case = Case("holdout", "holdout")
        self.cases.append(case)
        hc = holdout_cases(self.seeds, spec)
        for i, h in enumerate(hc):
            try:
                # Set up on other values than those checked: work done in setup cannot help.
                prep = Prepared(be, spec, self.module, regime_inputs(be, spec, h.T, h.seed + 11), h.T)
                res = CallChecker(be, spec, prep).check(holdout_inputs(be, spec, h), "f64", h.loose)
            except CandidateError as exc:
                res = {"ok": False, "detail": f"{exc.kind}: {exc.message}", "rms": {}}
            # What each case drew stays private: only its index is reported.
            case.calls.append({"ok": res["ok"], "rms": res["rms"]})
            if not res["ok"]:
                case.status = "FAIL"
                case.detail = f"case {i + 1} of {len(hc)}: {res['detail']}"
                self.report["holdout_pass"] = False
                self.report["holdout_detail"] = case.detail
                raise Stop("holdout", f"holdout correctness: FAIL {case.detail}")
        case.detail = f"{len(hc)} case(s), seeds from the {self.holdout_source}"
        self.report["holdout_pass"] = True

    def _probes(self) -> None:
        spec, be = self.spec, self.be
        for j, T in enumerate(spec.probe_lengths):
            case = Case(f"probe_T{T}", "probe")
            self.cases.append(case)
            try:
                prep = Prepared(be, spec, self.module, regime_inputs(be, spec, T, spec.seed + 100 + j), T)
                res = CallChecker(be, spec, prep).check(
                    regime_inputs(be, spec, T, spec.seed + 200 + j, "mixed_depth"), "f64", False)
            except CandidateError as exc:
                case.status, case.detail = "FAIL", f"{exc.kind}: {exc.message}"
                raise Stop(exc.kind, f"{case.name}: {case.detail}") from None
            case.calls.append(res)
            case.status, case.detail = ("PASS", "vs float64 recurrence") if res["ok"] else ("FAIL", res["detail"])
            if not res["ok"]:
                self._fail(case, "correctness")

    def _scored_and_stress(self) -> Prepared:
        spec, be = self.spec, self.be
        T = spec.T
        try:
            prep = Prepared(be, spec, self.module, regime_inputs(be, spec, T, spec.seed), T)
        except CandidateError as exc:
            raise Stop(exc.kind, exc.message) from None
        checker = CallChecker(be, spec, prep)
        for r, regime in enumerate(spec.regimes):
            case = Case(regime, "stress")
            self.cases.append(case)
            try:
                res = checker.check(regime_inputs(be, spec, T, spec.seed + 300 + r, regime), "f32",
                                    regime == "correlated")
            except CandidateError as exc:
                case.status, case.detail = "FAIL", f"{exc.kind}: {exc.message}"
                raise Stop(exc.kind, f"{case.name}: {case.detail}") from None
            case.calls.append(res)
            case.status, case.detail = ("PASS", "vs fp32 reference") if res["ok"] else ("FAIL", res["detail"])
            if not res["ok"]:
                self._fail(case, "correctness")
        self.scored = Case("scored", "scored")
        self.cases.append(self.scored)
        self._scored_calls(checker, spec.calls_before_timing, 400)
        return prep

    def _scored_calls(self, checker: CallChecker, n: int, seed_offset: int) -> None:
        spec, be, case = self.spec, self.be, self.scored
        for i in range(n):
            try:
                res = checker.check(regime_inputs(be, spec, spec.T, spec.seed + seed_offset + i), "f32", False)
            except CandidateError as exc:
                res = {"ok": False, "detail": f"{exc.kind}: {exc.message}", "rms": {}}
            case.calls.append(res)
        case.status, case.detail = _series_status(case.calls)
        if case.status != "PASS":
            self._fail(case, "flaky" if case.status == "FLAKY" else "correctness")

    def _timing(self, prep: Prepared) -> None:
        spec, be = self.spec, self.be
        if self.against is not None:
            baseline, name = self.against, f"against {self.options.get('against_name') or 'candidate'}"
            note = ""
        else:
            baseline, note = make_baseline(be, spec)
            name = baseline.name
        if hasattr(baseline, "chunk_kda"):
            try:
                self.log("fla baseline check")
                self._check_fla(baseline)
            except Exception as exc:  # noqa: BLE001 - fla present but failing: time the reference
                from .baseline import ReferenceBaseline

                note = f"fla failed ({type(exc).__name__}: {str(exc)[:300]}); timed the reference instead"
                baseline = ReferenceBaseline(be, spec)
                name = baseline.name
        self.report.update(baseline_name=name, baseline_note=note, method=method_text(be, spec.timing))
        trials = []
        last = prep
        for trial in range(spec.timing.trials):
            self.log(f"timing trial {trial + 1} of {spec.timing.trials} ({name})")
            inputs = regime_inputs(be, spec, spec.T, spec.seed + 500 + trial)
            try:
                base_prep = Prepared(be, spec, baseline, dict(inputs), spec.T)
                last = Prepared(be, spec, self.module, inputs, spec.T)
                trials.append(time_trial(be, spec.timing, base_prep.fn, last.fn))
            except CandidateError as exc:
                raise Stop(exc.kind, f"timing trial {trial + 1}: {exc.message}") from None
            except Exception as exc:  # noqa: BLE001 - a call that raises while timed
                raise Stop("runtime", f"timing trial {trial + 1}: {type(exc).__name__}: {exc}") from None
        self.report.update(summarise(trials))
        flags = [f"trial {i + 1}: {t.flag}" for i, t in enumerate(trials) if t.flag]
        self.report["timing_flags"] = flags
        if flags:
            case = Case("timing_integrity", "timing", "FAIL", "; ".join(flags))
            self.cases.append(case)
            self._fail(case, "correctness")
        # Poisoned, fresh-input calls after timing, on the last trial's setup.
        self._scored_calls(CallChecker(be, spec, last), spec.calls_after_timing, 600)

    def _check_fla(self, baseline) -> None:
        """fla must agree with our reference, or its timing is of something else."""
        spec, be = self.spec, self.be
        inputs = regime_inputs(be, spec, spec.T, spec.seed + 700, "mixed_depth")
        xp = be.xp
        out = xp.empty((spec.B, spec.T, spec.H, spec.V), dtype=inputs["q"].dtype)
        state = xp.empty((spec.B, spec.H, spec.V, spec.K), dtype=xp.float32)
        data = dict(inputs, output=out, final_state=state, scale=spec.scale)
        baseline.setup(data, spec.B, spec.T, spec.H, write_outputs=True)()
        be.sync()
        ref_out, ref_state = chunked_f32(xp, inputs, spec.scale, spec.gate_floor, spec.norm_eps, spec.chunk)
        vo = check_output(xp, "output", out, ref_out, spec.tolerance)
        vs = check_output(xp, "final_state", state, ref_state, spec.tolerance)
        self.report["baseline_check"] = {
            "ok": vo.ok and vs.ok, "output_rms_ratio": vo.rms_ratio, "final_state_rms_ratio": vs.rms_ratio,
            "detail": "; ".join(d for d in (vo.detail, vs.detail) if d),
        }


def _finite(obj):
    """The wire format has no NaN/Infinity: non-finite floats become None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
