"""IKET converter and analyzer on the committed SYNTHETIC capture (see
fixtures/make_synthetic_iket.py for how its known figures arise)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kcoral.cli import main
from kcoral.iket import (IketError, IketRecord, analyze_trace, convert_pair, find_pairs,
                         format_analysis, pack_buffer, parse_buffer, to_chrome_trace)

FIXTURES = Path(__file__).parent / "fixtures"
BIN = (FIXTURES / "kda_fwd_synthetic.iket.bin").read_bytes()
META = (FIXTURES / "kda_fwd_synthetic.iket.json").read_bytes()


def test_fixture_matches_its_generator() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen", FIXTURES / "make_synthetic_iket.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.buffer_bytes() == BIN
    assert json.loads(META) == gen.meta()


def test_parse_buffer_reads_header_and_records() -> None:
    buf = parse_buffer(BIN)
    assert (buf.capacity, buf.count, buf.dropped) == (400, 320, 0)
    assert len(buf.records) == 320
    first = min(buf.records, key=lambda r: r.start_ns)
    assert (first.cta, first.stage) == (0, 0)


def test_overflowed_buffer_reports_dropped_records() -> None:
    recs = [IketRecord(0, 0, 0, i, 1000 * i, 1000 * i + 10) for i in range(4)]
    buf = parse_buffer(pack_buffer(recs, capacity=4, count=9))
    assert len(buf.records) == 4 and buf.dropped == 5
    trace = to_chrome_trace(buf, {"kernel": "k", "stages": {"0": "s"}})
    assert trace["otherData"]["dropped"] == 5
    assert "5 records were dropped" in format_analysis(analyze_trace(trace))


def test_truncated_buffer_is_refused() -> None:
    with pytest.raises(IketError, match="truncated"):
        parse_buffer(BIN[: 16 + 32 * 10])
    with pytest.raises(IketError, match="header"):
        parse_buffer(b"\x00" * 8)


@pytest.mark.parametrize("meta, message", [
    (b"{", "not JSON"),
    (b"[]", "JSON object"),
    (b'{"stages": {}}', "kernel"),
    (b'{"kernel": "k", "stages": {"x": "a"}}', "decimal ids"),
    (b'{"kernel": "k", "chunk_stage": 3}', "chunk_stage"),
])
def test_bad_meta_is_refused(meta: bytes, message: str) -> None:
    with pytest.raises(IketError, match=message):
        to_chrome_trace(BIN, meta)


def test_chrome_trace_events() -> None:
    trace = json.loads(convert_pair(BIN, META))
    events = trace["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert len(spans) == 320
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "warp 0 (prep)" in names and "warp 5 (state)" in names
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert procs == {0: "CTA 0", 1: "CTA 1"}
    # ts/dur in microseconds from the earliest start; warp 1 of CTA 1, chunk 1's p-gram:
    # start 300 + 2000 ns, duration 900 + 8 ns.
    ev = next(e for e in spans if e["pid"] == 1 and e["tid"] == 1 and e["args"]["seq"] == 2)
    assert (ev["name"], ev["ts"], ev["dur"]) == ("p-gram", 2.3, 0.908)
    assert trace["otherData"]["kernel"] == "kda_fwd_synthetic"
    assert trace["otherData"]["chunk_stage"] == "state-update"


def test_analyzer_figures_all_ctas() -> None:
    a = analyze_trace(to_chrome_trace(BIN, META))
    assert a.kernel_span_us == pytest.approx(63.2)
    assert (a.worst_cta, a.cta_span_us) == (1, pytest.approx(62.9))
    w0 = {s.stage: s for s in a.warps[0].stages}
    assert (w0["p-gram"].mean_us, w0["p-gram"].median_us, w0["p-gram"].count) == (
        pytest.approx(0.928), pytest.approx(0.920), 32)
    w2 = {s.stage: s for s in a.warps[2].stages}
    assert w2["p-gram"].median_us == pytest.approx(0.600)
    assert [w.role for w in a.warps] == ["prep"] * 4 + ["mma", "state"]
    assert a.chunk_period is not None
    assert a.chunk_period.median_us == pytest.approx(4.0)
    assert a.chunk_period.mean_us == pytest.approx(4.0)  # fill and drain trimmed


def test_analyzer_one_cta_and_text() -> None:
    a = analyze_trace(to_chrome_trace(BIN, META), cta=0)
    assert a.cta_span_us == pytest.approx(62.8)
    assert a.warps[0].stages[0].count == 16
    text = format_analysis(a)
    assert "kernel span 63.2 us" in text
    assert "-- warp 0 (prep)" in text
    assert "p-gram       mean 0.928 med 0.920 [16]" in text
    assert "steady-state chunk period (state-update) mean 4.000 us" in text
    with pytest.raises(IketError, match="CTA 7 is not in the trace"):
        analyze_trace(to_chrome_trace(BIN, META), cta=7)


def test_find_pairs() -> None:
    pairs, lonely = find_pairs(["a.iket.bin", "a.iket.json", "b.iket.bin", "c.iket.json", "x.txt"])
    assert pairs == {"a": ("a.iket.bin", "a.iket.json")}
    assert lonely == ["b.iket.bin", "c.iket.json"]


def test_iket_analyze_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "k.trace.json"
    trace.write_bytes(convert_pair(BIN, META))
    assert main(["iket-analyze", str(trace), "1"]) == 0
    out = capsys.readouterr().out
    assert "CTA 1 span 62.9 us" in out and "-- warp 4 (mma)" in out
    assert main(["iket-analyze", str(trace), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["chunk_period"]["median_us"] == pytest.approx(4.0)
    bad = tmp_path / "bad.json"
    bad.write_text("{\"traceEvents\": []}")
    assert main(["iket-analyze", str(bad)]) == 1
    assert "no events" in capsys.readouterr().err
