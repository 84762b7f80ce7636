"""The official benchmark of one candidate: holdout, probes, stress, scored checks, timing.

This process is the trusted side: it makes every input, lends it to the host process that
runs the candidate (host.py), verifies every call's outputs from its own copies, keeps the
clock and writes the report. It never imports candidate code. The baseline runs in another
host with no candidate code in it; each timing trial sets the candidate (and, in a
confirmation run, the incumbent) up in a fresh host that is killed, with everything it
started, before anything else is timed.

Order matters: the holdout runs first and a failure there stops everything (nothing is
timed); any other correctness failure also skips timing. The report is a JSON-ready dict.
"""
from __future__ import annotations

import hashlib
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .backend import BackendUnavailable, make_backend
from .calls import Batch, MakeInputs, Session, verify
from .harness import CandidateError
from .hostproc import (UNPRIVILEGED, HostProcess, Scheduling, Snapshot, confines_candidates, drops_uid, isolation_text,
                       protect_judge)
from .inputs import LOOSE_REGIMES, holdout_cases, holdout_inputs, regime_inputs
from .memory import Arena
from .spec import SpecError, Timing, WorkloadSpec, load_spec
from .timing import Figure, Pair, clock_figure, method_text, refused, settle, summarise

PACKAGE = Path(__file__).resolve().parent
# A folder of compile caches only trusted code wrote (the baseline's Triton kernels), which a
# server may offer read-only to its requests: the trusted host starts from a copy of it. The
# name is the server's (kcoral_server.sandbox), spelled again: the judge ships alone.
TRUSTED_CACHE_ENV = "KCORAL_TRUSTED_CACHE"
TRUSTED_CACHE_MAX_BYTES = 1 << 30  # fla's is 50 MB; the request's tmpfs holds 2 GiB in all
# A refused trial is measured again only if twice its time and this margin are left: a
# re-measure must not turn a pass into the runner's timeout.
REMEASURE_MARGIN_S = 20.0


@dataclass
class Case:
    name: str
    group: str  # holdout | probe | stress | scored | timing
    status: str = "PASS"  # PASS | FAIL | FLAKY
    detail: str = ""
    calls: list = field(default_factory=list)  # per call: {"ok", "detail", "rms": {...}}

    def as_dict(self) -> dict:
        return {"name": self.name, "group": self.group, "status": self.status, "detail": self.detail,
                "rms_max": self.rms_max(), "calls": self.calls}

    def rms_max(self) -> dict:
        """The worst RMS error ratio of each output over this case's calls."""
        out: dict = {}
        for call in self.calls:
            for name, v in (call.get("rms") or {}).items():
                if v is not None:
                    out[name] = max(out.get(name, 0.0), v)
        return out


class Stop(Exception):
    """Ends the run early with a failure kind (the report is complete up to here)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message


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
        # Every input but the holdout's comes from this key, drawn now: no candidate can
        # know a call's inputs before the judge writes them. It is reported afterwards so
        # that any call can be replayed.
        self.key = os.urandom(16)
        self.caches: dict[str, Path] = {}
        self.scheduling = Scheduling()
        self.scheduling.seen(os.getpid())  # before any candidate runs
        # Taken now, before any candidate runs (see Snapshot).
        self.sources = {label: Snapshot(root / label) for label in ("candidate", "against") if (root / label).is_dir()}
        self.sources["judge"] = Snapshot(PACKAGE)
        self.report: dict = {
            "workload": "", "candidate": options.get("candidate_name", "candidate"),
            "passed": False, "failure_kind": None, "message": "",
            "holdout_pass": None, "holdout_source": holdout_source, "holdout_detail": "",
            "baseline_name": None, "baseline_note": "", "method": None, "device": None,
            "baseline_ms": None, "kernel_ms": None, "speedup": None, "spread": None,
            "trials": [], "timing_flags": [], "clock": None, "baseline_check": None, "cases": [],
            "isolation": "", "trusted_cache": None, "tolerance": "", "input_key": self.key.hex(), "elapsed_s": 0.0,
        }

    def log(self, text: str) -> None:
        """Progress on stderr (it reaches the report's log, even when the run is cut short)."""
        print(f"[judge {time.monotonic() - self.t0:7.1f}s] {text}", file=sys.stderr, flush=True)

    def seed(self, purpose: str, i: int = 0) -> int:
        digest = hashlib.blake2b(f"{purpose}:{i}".encode(), key=self.key, digest_size=8).digest()
        return int.from_bytes(digest, "big") >> 1

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
        finally:
            for cache in self.caches.values():
                shutil.rmtree(cache, ignore_errors=True)
        self.report["cases"] = [c.as_dict() for c in self.cases]
        self.report["elapsed_s"] = round(time.monotonic() - t0, 3)
        return _finite(self.report)

    def _run(self) -> None:
        try:
            self.spec = spec = load_spec(self.root / "workload.json")
        except SpecError as exc:
            raise Stop("check", str(exc)) from None
        self.raw_spec = __import__("json").loads((self.root / "workload.json").read_text())
        self.report["workload"] = spec.name
        self.report["tolerance"] = _tolerance_text(spec)
        self.report["isolation"] = isolation_text(protect_judge())
        try:
            self.be = be = make_backend(spec.device)
        except BackendUnavailable as exc:
            raise Stop("unavailable", str(exc)) from None
        self.report["device"] = be.name
        self.arena = Arena(be)
        self.logs = self.root / "host-logs"
        self.logs.mkdir(exist_ok=True)
        self.log(f"device {be.name}; {self.report['isolation']}")
        host = self._candidate("candidate", first=True)
        try:
            self.log("holdout")
            self._holdout(host)
            self.log("probes")
            self._probes(host)
            self.log("stress and scored calls")
            self._scored_and_stress(host)
        finally:
            self._close(host)
        self.log("timing")
        self._timing()
        self.log("done")

    # ---- hosts
    def _cache(self, label: str) -> Path:
        if label not in self.caches:
            self.caches[label] = Path(tempfile.mkdtemp(prefix=f"kda-cache-{label}-"))
            if drops_uid():
                os.chown(self.caches[label], UNPRIVILEGED, UNPRIVILEGED)
        return self.caches[label]

    def _host_cache(self, label: str) -> Path:
        """A candidate's hosts share one compile cache (it compiles once per run). The
        incumbent's do too where the challenger cannot write it; unconfined, each incumbent
        host compiles into a fresh one, made while no challenger process exists."""
        if label == "against" and not confines_candidates():
            return self._cache(f"against-{len(self.caches)}")
        return self._cache(label)

    def _trusted_cache(self) -> Path:
        cache = self._cache("trusted")
        offered = os.environ.get(TRUSTED_CACHE_ENV)
        if not offered:
            return cache
        try:
            if not (Path(offered) / "triton").is_dir():
                self.report["trusted_cache"] = "the server's holds no Triton cache; compiled in this run"
                return cache
            _copy_files(Path(offered) / "triton", cache / "triton", TRUSTED_CACHE_MAX_BYTES)
            self.report["trusted_cache"] = "the server's baseline compile cache"
        except OSError as exc:  # the baseline compiles as it would without one
            shutil.rmtree(cache / "triton", ignore_errors=True)
            self.report["trusted_cache"] = f"the server's could not be read ({exc.strerror or exc}); compiled in this run"
        return cache

    def _candidate(self, label: str, first: bool = False) -> HostProcess:
        """A fresh host with the candidate (or the incumbent, `against`) loaded."""
        # the pre-roll event goes with the host's start: a confined host cannot open it later
        host = HostProcess(self.arena, self.sources["judge"], "candidate", self.spec.device, self.logs, label,
                           candidate=self.sources[label], cache_dir=self._host_cache(label),
                           preroll=self.arena.preroll(self.spec.timing.preroll_ms).handle)
        try:
            host.request({"op": "load", "dir": host.candidate_dir})
        except CandidateError as exc:
            self._close(host)
            if first:
                self.report["holdout_pass"] = False
                self.report["holdout_detail"] = f"{exc.kind}: {exc.message.splitlines()[0]}"
            raise Stop(exc.kind, f"{label}: {exc.message}") from None
        return host

    def _close(self, host: HostProcess) -> None:
        host.close()
        tail = host.log_tail()
        if tail.strip():
            for line in tail.splitlines():
                print(f"[{host.label}] {line}", file=sys.stderr)
            sys.stderr.flush()

    def _check(self, host: HostProcess, T: int, setup_inputs: dict, make: MakeInputs, oracle: str,
               loose: bool) -> dict:
        """One setup, one call on fresh inputs, verified."""
        try:
            sess = Session(self.be, self.spec, self.arena, host, T, setup_inputs)
            batch = sess.batch([make])
        except CandidateError as exc:
            return {"ok": False, "detail": f"{exc.kind}: {exc.message}", "rms": {}, "error": exc.kind}
        inputs = make()
        res = verify(self.be, self.spec, batch.snapshots[0], inputs, oracle, loose)
        changed = sess.inputs_intact(inputs)
        if changed:
            res["ok"] = False
            res["detail"] = "; ".join(d for d in (f"the call changed its inputs: {', '.join(changed)}",
                                                   res["detail"]) if d)
        return res

    # ---- checks
    def _holdout(self, host: HostProcess) -> None:
        spec, be = self.spec, self.be
        case = Case("holdout", "holdout")
        self.cases.append(case)
        hc = holdout_cases(self.seeds, spec)
        for i, h in enumerate(hc):
            # Set up on other values than those checked: work done in setup cannot help.
            res = self._check(host, h.T, regime_inputs(be, spec, h.T, self.seed("holdout-setup", i)),
                              lambda h=h: holdout_inputs(be, spec, h), "f64", h.loose)
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

    def _probes(self, host: HostProcess) -> None:
        spec, be = self.spec, self.be
        for j, T in enumerate(spec.probe_lengths):
            case = Case(f"probe_T{T}", "probe")
            self.cases.append(case)
            res = self._check(host, T, regime_inputs(be, spec, T, self.seed("probe-setup", j)),
                              lambda T=T, j=j: regime_inputs(be, spec, T, self.seed("probe", j), "mixed_depth"),
                              "f64", False)
            case.calls.append(res)
            case.status, case.detail = ("PASS", "vs float64 recurrence") if res["ok"] else ("FAIL", res["detail"])
            if not res["ok"]:
                raise Stop(res.get("error", "correctness"), f"{case.name}: {case.detail}")

    def _scored_and_stress(self, host: HostProcess) -> None:
        spec, be = self.spec, self.be
        T = spec.T
        try:
            sess = Session(be, spec, self.arena, host, T, regime_inputs(be, spec, T, self.seed("scored-setup")))
        except CandidateError as exc:
            raise Stop(exc.kind, exc.message) from None
        for r, regime in enumerate(spec.regimes):
            case = Case(regime, "stress")
            self.cases.append(case)
            make = (lambda r=r, regime=regime: regime_inputs(be, spec, T, self.seed("stress", r), regime))
            res = self._verified_batch(sess, [make], "f32", regime in LOOSE_REGIMES)[0]
            case.calls.append(res)
            case.status, case.detail = ("PASS", "vs fp32 reference") if res["ok"] else ("FAIL", res["detail"])
            if not res["ok"]:
                raise Stop(res.get("error", "correctness"), f"{case.name}: {case.detail}")
        self.scored = Case("scored", "scored")
        self.cases.append(self.scored)
        makers = [lambda i=i: regime_inputs(be, spec, T, self.seed("scored", i)) for i in range(spec.calls_before_timing)]
        self.scored.calls.extend(self._verified_batch(sess, makers, "f32", False))
        self._scored_verdict()

    def _verified_batch(self, sess: Session, makers: list, oracle: str, loose: bool,
                        flush_bytes: int = 0) -> list[dict]:
        try:
            batch = sess.batch(makers, flush_bytes)
        except CandidateError as exc:
            return [{"ok": False, "detail": f"{exc.kind}: {exc.message}", "rms": {}, "error": exc.kind}]
        out: list[dict] = []
        inputs: Any = None
        for snap, make in zip(batch.snapshots, makers):
            inputs = make()
            out.append(verify(self.be, self.spec, snap, inputs, oracle, loose))
        changed = sess.inputs_intact(inputs)
        if changed:
            out[-1] = dict(out[-1], ok=False, detail=f"the call changed its inputs: {', '.join(changed)}")
        return out

    def _scored_verdict(self) -> None:
        case = self.scored
        case.status, case.detail = _series_status(case.calls)
        if case.status != "PASS":
            err = next((c.get("error") for c in case.calls if not c["ok"]), None)
            raise Stop(err or ("flaky" if case.status == "FLAKY" else "correctness"), f"scored: {case.detail}")

    # ---- timing
    def _timing(self) -> None:
        spec, be = self.spec, self.be
        t = spec.timing
        against = "against" in self.sources
        # Its caches are made now, once every candidate process is gone.
        trusted = HostProcess(self.arena, self.sources["judge"], "trusted", spec.device, self.logs, "trusted",
                              cache_dir=self._trusted_cache())
        try:
            loaded = trusted.request({"op": "load", "spec": self.raw_spec}, timeout=900)
            if against:
                name, note = f"against {self.options.get('against_name') or 'candidate'}", ""
            else:
                name, note = str(loaded.get("name")), str(loaded.get("note") or "")
                self.log(f"baseline check ({name})")
                self._baseline_check(trusted)
            self.report.update(baseline_name=name, baseline_note=note, method=method_text(be, t))
            self.scheduling.seen(trusted.proc.pid)  # no candidate process exists yet
            setup = regime_inputs(be, spec, spec.T, self.seed("timing-setup"))
            null = Session(be, spec, self.arena, trusted, spec.T, setup, which="null")
            # The baseline runs in the judge's own host in every run: it is the figure to beat,
            # or, against an incumbent, the trusted batch that calibrates both sides' weighing.
            base = Session(be, spec, self.arena, trusted, spec.T, setup, which="baseline")
            one = regime_inputs(be, spec, spec.T, self.seed("null"))
            trials: list[Pair] = []
            flags: list[str] = []
            others: dict[int, Pair] = {}   # by trial: the measure a re-measure left out
            for trial in range(t.trials):
                self.log(f"timing trial {trial + 1} of {t.trials} ({name})")
                began = time.monotonic()
                pair = self._trial(trial, "", trusted, base, null, one, against)
                first = refused(pair, against)
                if first and self._time_left() > 2 * (time.monotonic() - began) + REMEASURE_MARGIN_S:
                    self.log(f"timing trial {trial + 1}: {', '.join(first)} refused, measured again")
                    again = self._trial(trial, "-again", trusted, base, null, one, against)
                    kept, note = settle(pair, again, against)
                    others[trial] = again if kept is pair else pair
                    pair = kept
                    flags.append(f"trial {trial + 1}: {note}")
                elif first:
                    flags.append(f"trial {trial + 1}: not re-measured (too little of the run's time left)")
                flags.extend(f"trial {trial + 1} {who}: {f.why}" for who, f in zip(("baseline", "kernel"), pair) if f.why)
                trials.append(pair)
        except CandidateError as exc:
            raise Stop(exc.kind, f"timing: {exc.message}") from None
        finally:
            self._close(trusted)
        self.report.update(summarise(trials, others))
        self.report["timing_flags"] = flags
        self.report["clock"] = _clock_text(trials, t)
        self._scored_verdict()

    def _trial(self, trial: int, attempt: str, trusted: HostProcess, base: Session, null: Session, one: dict,
               against: bool) -> Pair:
        """One timing trial: the baseline's batch in the judge's host, the no-op batch, then the
        candidate (and, against an incumbent, the incumbent) in fresh hosts. `attempt` keeps a
        re-measure's inputs apart from the first measure's."""
        spec, be, t = self.spec, self.be, self.spec.timing
        n = t.warmup + t.calls
        makers_b: list[MakeInputs] = [lambda i=i: regime_inputs(be, spec, spec.T, self.seed(f"base-{trial}{attempt}", i))
                                      for i in range(n)]
        makers_c: list[MakeInputs] = [lambda i=i: regime_inputs(be, spec, spec.T, self.seed(f"timed-{trial}{attempt}", i))
                                      for i in range(n)]
        self._still_scheduled(trusted)
        trusted_batch = base.batch(makers_b, t.flush_bytes)
        null_batch = null.batch([lambda: one] * n, t.flush_bytes)
        # The baseline in the judge's own host keeps its times and measures what a call doing
        # real work costs the protocol beyond a no-op call: the calibration of the weighing of
        # the candidate and of an incumbent (against) alike.
        f_trusted = clock_figure(trusted_batch, null_batch, t, trusted=True)
        cal = (f_trusted.per_call or {}).get("unexplained_ms", 0.0)
        if against:
            b_batch, b_checks = self._untrusted_trial("against", makers_b, f"{trial}{attempt}")
            if not all(c["ok"] for c in b_checks):
                bad = next(c for c in b_checks if not c["ok"])
                raise Stop("runtime", f"the incumbent (against) failed its check in timing trial "
                                      f"{trial + 1}: {bad['detail']}")
            fb = clock_figure(b_batch, null_batch, t, calibration_ms=cal)
        else:
            fb = f_trusted
        c_batch, c_checks = self._untrusted_trial("candidate", makers_c, f"{trial}{attempt}")
        self.scored.calls.extend(c_checks)
        return fb, clock_figure(c_batch, null_batch, t, calibration_ms=cal)

    def _time_left(self) -> float:
        """Seconds before the runner stops the judge (no limit given: unbounded)."""
        limit = self.options.get("timeout_s")
        return math.inf if limit is None else float(limit) - (time.monotonic() - self.t0)

    def _still_scheduled(self, trusted: HostProcess) -> None:
        """No figure from a judge or baseline host whose priority a candidate lowered."""
        lowered = self.scheduling.lowered(os.getpid()) + self.scheduling.lowered(trusted.proc.pid)
        if lowered:
            raise Stop("runtime", "a candidate lowered the scheduling priority of the judge or the baseline's "
                                  "host, which would slow what it is compared with: " + "; ".join(lowered[:4]))

    def _untrusted_trial(self, label: str, makers: list, trial: str) -> tuple[Batch, list[dict]]:
        """A fresh host, a fresh setup, one batch (warm-up calls first), the host killed with
        everything it started, then every call verified."""
        spec, be, t = self.spec, self.be, self.spec.timing
        host = self._candidate(label)
        try:
            sess = Session(be, spec, self.arena, host, spec.T,
                           regime_inputs(be, spec, spec.T, self.seed(f"{label}-setup-{trial}")))
            batch = sess.batch(makers, t.flush_bytes)
        finally:
            self._close(host)
        checks = [verify(be, spec, snap, make(), "f32", False) for snap, make in zip(batch.snapshots, makers)]
        return batch, checks

    def _baseline_check(self, trusted: HostProcess) -> None:
        """The baseline must agree with our reference, or its timing is of something else."""
        spec, be = self.spec, self.be
        make = (lambda: regime_inputs(be, spec, spec.T, self.seed("baseline-check"), "mixed_depth"))
        sess = Session(be, spec, self.arena, trusted, spec.T, make(), which="baseline_check")
        batch = sess.batch([make])
        res = verify(be, spec, batch.snapshots[0], make(), "f32", False)
        self.report["baseline_check"] = {
            "ok": res["ok"], "output_rms_ratio": res["rms"].get("output"),
            "final_state_rms_ratio": res["rms"].get("final_state"), "detail": res["detail"],
        }


def _copy_files(src: Path, dest: Path, limit: int) -> None:
    """The regular files under `src` (no links followed or copied), at most `limit` bytes."""
    total = 0
    for dirpath, _dirs, filenames in os.walk(src):
        rel = Path(dirpath).relative_to(src)
        (dest / rel).mkdir(parents=True, exist_ok=True)
        for name in filenames:
            path = Path(dirpath) / name
            if path.is_symlink() or not path.is_file():
                continue
            total += path.stat().st_size
            if total > limit:
                raise OSError(f"more than {limit >> 20} MiB")
            shutil.copyfile(path, dest / rel / name, follow_symlinks=False)


def _tolerance_text(spec: WorkloadSpec) -> str:
    t, lt = spec.tolerance, spec.loose_tolerance
    basis = spec.extra.get("x_tolerance_basis", "")
    text = (f"per output RMS(x-y)/RMS(y) < {t.rms_ratio:g} (ill-conditioned cases {lt.rms_ratio:g}); "
            f"an element is off if |x-y| > {t.abs_rms:g}*RMS(y) and |x-y|/|y| > {t.rel:g}")
    return f"{text}; {basis}" if basis else text


def _clock_text(trials: list[tuple[Figure, Figure]], t: Timing) -> str:
    judged = [f"trial {i + 1} {who}" for i, pair in enumerate(trials)
              for who, f in zip(("baseline", "kernel"), pair) if f.clock == "judge"]
    slack = (f"slack {t.clock_slack_rel:.0%} + {t.clock_slack_call_ms:g} ms per call (median of the timed calls; "
             f"{t.clock_slack_ms:g} ms per batch on a CPU clock)")
    if not judged:
        return f"host call times, every batch within the judge's own clock ({slack})"
    return f"the judge's own clock for {', '.join(judged)} (host call times refused beyond {slack}); host call times elsewhere"


def _finite(obj):
    """The wire format has no NaN/Infinity: non-finite floats become None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


__all__ = ["Case", "Judge", "Stop"]
