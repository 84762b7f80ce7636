"""The iket stage against a hostile trace (the candidate writes the buffer the server
converts): a trace over the size limit is refused before it is read, one with thousands of
warp x stage keys is stored capped, a NaN never reaches the row, and the raw pair is not
asked for. The server is faked at `run_iket`; traces come from kcoral's own converter."""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

from kcoral.iket import IketRecord, convert_pair, pack_buffer

from evolve.pipeline import iket
from evolve.population import StageResult
from evolve.vocabulary import EvaluationStatus, FailureKind, Stage

META = json.dumps({"kernel": "k", "stages": {"0": "load", "1": "mma"}}).encode()


def _stage(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, traces: dict[str, bytes]) -> StageResult:
    asked: dict = {}

    def fake_run_iket(client, sends, app, env, timeout, include_raw=True, files_cap=None):
        asked["include_raw"] = include_raw
        asked["files_cap"] = files_cap
        return SimpleNamespace(outcome=None, stdout="", stderr="", exit_code=0, timed_out=False,
                               traces=traces, raw={}, errors={}, unpaired=[])

    monkeypatch.setattr(iket, "run_iket", fake_run_iket)

    @contextmanager
    def slot(cancel=None):
        yield

    ctx = SimpleNamespace(stages={Stage.IKET: SimpleNamespace(app=["true"], timeout=60)},
                          gate=SimpleNamespace(slot=slot), cancel=None, client=None,
                          candidate_dir=lambda cand: tmp_path)
    result = iket.run(ctx, SimpleNamespace(id=1))  # type: ignore[arg-type]
    assert asked["include_raw"] is False and asked["files_cap"] == iket.MAX_TRACES_BYTES
    json.dumps(result.metrics, allow_nan=False)  # what PostgreSQL's json accepts
    return result


def test_an_honest_trace_is_summarised_per_warp_and_stage(monkeypatch, tmp_path):
    recs = [IketRecord(cta, warp, warp % 2, seq, 1_000 * seq + 7, 1_000 * seq + 7 + 333)
            for cta in range(4) for warp in range(4) for seq in range(10)]
    out = _stage(monkeypatch, tmp_path, {"k.trace.json": convert_pair(pack_buffer(recs), META)})
    assert out.status == EvaluationStatus.PASSED
    summary = out.metrics["traces"]["k.trace.json"]
    # ten records a warp in each CTA, one a microsecond: a loop with a period of 1 µs
    assert summary["stages"] == {f"w{w}:{'load' if w % 2 == 0 else 'mma'}": {"count": 40, "mean_us": 0.333,
                                                                          "period_us": 1.0}
                                 for w in range(4)}
    assert summary["span_us"] == 9.333 and "stages_left_out" not in summary


def test_an_oversized_trace_is_refused_without_being_read(monkeypatch, tmp_path):
    # Valid JSON: read, it would pass; it is refused on its size alone.
    trace = b'{"traceEvents":[]' + b" " * iket.MAX_TRACE_BYTES + b"}"

    def never(*args, **kwargs):
        raise AssertionError("an oversized trace was parsed")

    monkeypatch.setattr(iket, "_events", never)
    monkeypatch.setattr(iket.json, "loads", never)
    out = _stage(monkeypatch, tmp_path, {"k.trace.json": trace})
    assert out.status == EvaluationStatus.FAILED and out.failure_kind == FailureKind.RUNTIME
    assert f"{len(trace)} bytes" in out.message and f"limit of {iket.MAX_TRACE_BYTES}" in out.message
    assert "k.trace.json" in out.message


def test_a_trace_of_thousands_of_keys_is_stored_capped(monkeypatch, tmp_path):
    # Every record on its own warp: one warp x stage key each (the red team's capture).
    recs = [IketRecord(0, warp, 0, 0, 1_000 * warp, 1_000 * warp + 1) for warp in range(5_000)]
    recs += [IketRecord(0, 7, 0, s, 10 ** 7 + s, 10 ** 7 + s + 2) for s in range(1, 4)]  # w7 the busiest
    out = _stage(monkeypatch, tmp_path, {"k.trace.json": convert_pair(pack_buffer(recs), META)})
    assert out.status == EvaluationStatus.PASSED
    summary = out.metrics["traces"]["k.trace.json"]
    assert len(summary["stages"]) == iket.MAX_STAGE_KEYS
    assert summary["stages_left_out"] == 5_000 - iket.MAX_STAGE_KEYS
    # (0.001 + 3 * 0.002) / 4, rounded; its starts at 7 µs and 10,000.001-10,000.003 µs
    assert summary["stages"]["w7:load"] == {"count": 4, "mean_us": 0.002, "period_us": 3331.001}
    assert len(json.dumps(out.metrics)) < 64_000


def test_many_traces_are_stored_capped(monkeypatch, tmp_path):
    one = convert_pair(pack_buffer([IketRecord(0, 0, 0, 0, 0, 5)]), META)
    traces = {f"k{i:03d}.trace.json": one for i in range(200)}
    out = _stage(monkeypatch, tmp_path, traces)
    assert out.status == EvaluationStatus.PASSED
    assert len(out.metrics["traces"]) == iket.MAX_TRACES
    assert out.metrics["traces_left_out"] == 200 - iket.MAX_TRACES


@pytest.mark.parametrize("trace", [
    b'{"traceEvents":[{"ph":"X","tid":0,"name":"a","ts":0,"dur":NaN}]}',
    b'{"traceEvents":[{"ph":"X","tid":0,"name":"a","ts":Infinity,"dur":1}]}',
    b'{"traceEvents":[{"ph":"X","tid":0,"name":"a","ts":0,"dur":"nan"}]}',
    b'{"traceEvents":[{"ph":"X","tid":0,"name":"a","ts":0,"dur":1}',
    b"[" * 100_000 + b"]" * 100_000,
    b"\xff\xfe",
])
def test_an_unreadable_or_non_finite_trace_fails_the_stage(monkeypatch, tmp_path, trace):
    out = _stage(monkeypatch, tmp_path, {"k.trace.json": trace})
    assert out.status == EvaluationStatus.FAILED and out.failure_kind == FailureKind.RUNTIME
    assert out.message.startswith("iket trace 'k.trace.json' refused:")


def test_a_period_is_a_loops_and_its_series_are_capped(monkeypatch, tmp_path):
    """A stage recorded once or twice a CTA has no period; one in a loop has its start-to-start
    mean, averaged over CTAs; past MAX_PERIOD_SERIES (CTA, key) series no new one is followed."""
    monkeypatch.setattr(iket, "MAX_PERIOD_SERIES", 3)
    recs = [IketRecord(cta, 0, 0, s, 1_000 * s * (cta + 1), 1_000 * s * (cta + 1) + 10) for cta in range(2) for s in range(5)]
    recs += [IketRecord(cta, 1, 1, s, 500 * s, 500 * s + 10) for cta in range(2) for s in range(2)]   # twice: no loop
    recs += [IketRecord(9, 2, 0, s, 100 * s, 100 * s + 10) for s in range(5)]   # a fourth series: not followed
    summary = _stage(monkeypatch, tmp_path, {"k.trace.json": convert_pair(pack_buffer(recs), META)}).metrics["traces"]
    stages = summary["k.trace.json"]["stages"]
    assert stages["w0:load"]["period_us"] == 1.5   # CTA 0: 1 µs, CTA 1: 2 µs
    assert "period_us" not in stages["w1:mma"] and "period_us" not in stages["w2:load"]
    assert stages["w2:load"]["count"] == 5         # still counted and timed
