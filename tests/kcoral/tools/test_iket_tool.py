"""`kcoral iket` end to end: a CPU "app" (the SYNTHETIC capture script) writes an IKET
pair into $IKET_OUT on the server; traces come back and are analysed locally."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

from kcoral.cli import main
from kcoral.remote import SendSpec, run_iket

FIXTURES = Path(__file__).parent / "fixtures"


def test_iket_round_trip_and_analysis(url: str, tmp_path: Path, capsys) -> None:
    out = tmp_path / "iket_out"
    code = main(["iket", "--remote", url, "--send", str(FIXTURES), "--output-dir", str(out),
                 "--", "python", "make_synthetic_iket.py"])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    assert "synthetic IKET pair written" in stdout
    trace = out / "kda_fwd_synthetic.trace.json"
    assert json.loads(trace.read_text())["otherData"]["kernel"] == "kda_fwd_synthetic"
    # The raw pair comes back byte for byte.
    assert (out / "kda_fwd_synthetic.iket.bin").read_bytes() == \
        (FIXTURES / "kda_fwd_synthetic.iket.bin").read_bytes()
    assert main(["iket-analyze", str(trace), "0"]) == 0
    text = capsys.readouterr().out
    assert "kernel span 63.2 us" in text and "CTA 0 span 62.8 us" in text
    assert "steady-state chunk period (state-update) mean 4.000 us" in text


def test_iket_env_and_no_raw(client, tmp_path: Path) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "probe.py").write_text(textwrap.dedent("""
        import os, runpy, sys
        assert os.environ["IKET"] == "1", os.environ.get("IKET")
        print("IKET_OUT is absolute:", os.path.isabs(os.environ["IKET_OUT"]))
        sys.argv = ["make_synthetic_iket.py"]
        runpy.run_path("gen/make_synthetic_iket.py", run_name="__main__")
    """))
    r = run_iket(client, [SendSpec(app), SendSpec(FIXTURES, "gen")], ["python", "probe.py"],
                 timeout=60, include_raw=False)
    assert r.exit_code == 0, r.stderr
    assert "IKET_OUT is absolute: True" in r.stdout
    assert list(r.traces) == ["kda_fwd_synthetic.trace.json"] and r.raw == {}


def test_app_without_traces_fails(url: str, tmp_path: Path, capsys) -> None:
    app = tmp_path / "quiet"
    app.mkdir()
    (app / "q.py").write_text("print('no tracing here')\n")
    code = main(["iket", "--remote", url, "--send", str(app), "--output-dir",
                 str(tmp_path / "o"), "--", "python", "q.py"])
    assert code == 1
    assert "wrote no IKET trace" in capsys.readouterr().err
