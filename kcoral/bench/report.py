"""The bench and gputest reports, and the fixed lines `kcoral bench` prints."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class CaseResult(BaseModel):
    name: str
    group: str  # holdout | probe | stress | scored | timing
    status: Literal["PASS", "FAIL", "FLAKY"]
    detail: str = ""
    rms_max: dict[str, float] = Field(default_factory=dict)  # worst RMS error ratio per output


class BenchReport(BaseModel):
    """Everything one official benchmark established. Times are the mean of trial medians."""

    passed: bool
    failure_kind: str | None = None  # correctness | flaky | holdout | import | runtime | timeout | transport | unavailable | check
    message: str = ""
    workload: str = ""
    candidate: str = ""
    device: str | None = None
    holdout_pass: bool | None = None
    holdout_source: Literal["server", "client"] = "server"
    holdout_detail: str = ""
    baseline_name: str | None = None
    baseline_note: str = ""
    method: str | None = None
    baseline_ms: float | None = None
    kernel_ms: float | None = None
    speedup: float | None = None
    # The larger of the two relative spreads (max-min of trial medians over their mean):
    # a comparison is only as steady as its shakier side. Both are in `spreads`.
    spread: float | None = None
    spreads: dict[str, float] = Field(default_factory=dict)
    trials: list[dict[str, Any]] = Field(default_factory=list)
    timing_flags: list[str] = Field(default_factory=list)  # trials whose host times were refused
    clock: str | None = None  # which clock the figures come from (the host's call times or the judge's)
    isolation: str = ""  # how the candidate was kept apart from the judge, the baseline and the server
    trusted_cache: str | None = None  # where the baseline's host found compiled kernels (None: compiled in the run)
    tolerance: str = ""  # the correctness bounds, and what they were set from
    input_key: str = ""  # the run's input key (after the run): every call's inputs can be replayed
    baseline_check: dict[str, Any] | None = None
    cases: list[CaseResult] = Field(default_factory=list)
    elapsed_s: float = 0.0
    log: str = ""  # the judge's stderr (candidate prints included), tail
    request_id: str = ""
    server_instance: str | None = None
    node_id: str | None = None
    gpu: int | None = None
    queue_ms: float | None = None
    lease_held_ms: float | None = None

    @classmethod
    def from_judge(cls, raw: dict[str, Any], **extra: Any) -> "BenchReport":
        spreads = raw.get("spread") or {}
        data = {k: v for k, v in raw.items() if k in cls.model_fields and k not in ("spread", "cases")}
        data["spreads"] = {k: float(v) for k, v in spreads.items() if v is not None}
        data["spread"] = max(data["spreads"].values()) if data["spreads"] else None
        data["cases"] = [CaseResult(name=c["name"], group=c["group"], status=c["status"], detail=c.get("detail", ""),
                                    rms_max=c.get("rms_max") or {})
                         for c in raw.get("cases", [])]
        data.update(extra)
        return cls.model_validate(data)

    @classmethod
    def failure(cls, kind: str, message: str, **extra: Any) -> "BenchReport":
        return cls(passed=False, failure_kind=kind, message=message, **extra)


def format_lines(rep: BenchReport) -> list[str]:
    """The fixed output: one fact per line, parseable by grep."""
    lines = []
    if rep.holdout_pass is True:
        lines.append("holdout correctness: PASS")
    elif rep.holdout_pass is False:
        lines.append(f"holdout correctness: FAIL {_one_line(rep.holdout_detail or rep.message)}")
    if rep.holdout_source == "client" and rep.holdout_pass is not None:
        lines.append("holdout_source: client (the server has no builtin.holdout_seeds; "
                     "seeds drawn by this client, so the holdout is not private)")
    if rep.baseline_name:
        lines.append(f"baseline_name: {rep.baseline_name}")
    if rep.baseline_note:
        lines.append(f"baseline_note: {_one_line(rep.baseline_note)}")
    if rep.baseline_check:
        chk = rep.baseline_check
        verdict = "PASS" if chk.get("ok") else f"FAIL {_one_line(str(chk.get('detail', '')))}"
        lines.append(f"baseline_check: {verdict} (vs the reference: output rms ratio "
                     f"{_num(chk.get('output_rms_ratio'))}, final_state {_num(chk.get('final_state_rms_ratio'))})")
    if rep.method and rep.kernel_ms is not None:
        lines.append(f"method: {rep.method}")
    if rep.clock and rep.kernel_ms is not None:
        lines.append(f"clock: {rep.clock}")
        # the trials whose host times were refused, measured again, or taken by their mean
        lines.extend(f"timing: {_one_line(flag)}" for flag in rep.timing_flags)
    if rep.isolation:
        lines.append(f"isolation: {rep.isolation}")
    if rep.tolerance:
        lines.append(f"tolerance: {rep.tolerance}")
    if rep.baseline_ms is not None and rep.kernel_ms is not None and rep.speedup is not None:
        lines.append(f"baseline: {rep.baseline_ms:.6f} ms")
        lines.append(f"kernel: {rep.kernel_ms:.6f} ms")
        lines.append(f"speedup: {rep.speedup:.4f}x")
        b, k = rep.spreads.get("baseline"), rep.spreads.get("kernel")
        if b is not None and k is not None:
            lines.append(f"spread: baseline={b:.4f} kernel={k:.4f}")
    for case in rep.cases:
        if case.group == "holdout":
            continue  # its line is the first one
        lines.append(f"correct: {case.status} {case.name} {_one_line(case.detail)}".rstrip())
    if rep.passed:
        lines.append("result: PASS")
    else:
        lines.append(f"result: FAIL {rep.failure_kind}: {_one_line(rep.message)}")
    return lines


def _num(value: Any) -> str:
    return f"{value:.2e}" if isinstance(value, (int, float)) else "n/a"


def _one_line(text: str, limit: int = 400) -> str:
    flat = " | ".join(part.strip() for part in (text or "").splitlines() if part.strip())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class GputestReport(BaseModel):
    """`test_small.py` run remotely: one bad-element fraction per regime."""

    passed: bool
    regimes: dict[str, float] = Field(default_factory=dict)
    quick_ms: float | None = None    # median of `quick_calls` calls at the scored shape (candidate-reported)
    exit_code: int | None = None
    timed_out: bool = False
    stdout: str = ""
    stderr: str = ""
    message: str = ""
