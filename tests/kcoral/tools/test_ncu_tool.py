"""`kcoral ncu` end to end with the FAKE ncu (fakes/fake_ncu.py) first on the server's
PATH: the command line the runner builds, the report and metrics that come back."""
from __future__ import annotations

import glob
import json
import textwrap
from pathlib import Path

import pytest

from kcoral.cli import EXIT_TOOL_FAILURE, main
from kcoral.ncu import KEY_METRICS, NcuMetrics
from kcoral.remote import SendSpec, run_ncu


def _capture_dir(tmp_path: Path, code: int = 0) -> Path:
    d = tmp_path / "cand"
    d.mkdir()
    (d / "capture.py").write_text(textwrap.dedent(f"""
        import os, sys
        print("captured with", os.environ.get("SHAPE"))
        sys.exit({code})
    """))
    return d


def test_ncu_saves_report_and_metrics(url: str, tmp_path: Path, capsys) -> None:
    d = _capture_dir(tmp_path)
    out = tmp_path / "artifacts" / "kda-full.ncu-rep"
    code = main(["ncu", "--remote", url, "--send", str(d), "-o", str(out), "-e", "SHAPE=small",
                 "--set", "full", "--launch-count", "1", "--kernel-name", "kda_fwd_kernel",
                 "--", "python", "capture.py"])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    assert "captured with small" in stdout
    report = json.loads(out.read_bytes())
    argv = report["argv"]
    assert argv[argv.index("--clock-control") + 1] == "none"
    assert argv[argv.index("--metrics") + 1].split(",") == [
        m for m in KEY_METRICS if not m.startswith("derived__")]
    assert argv[argv.index("--section") + 1] == "SourceCounters"
    assert argv[argv.index("--set") + 1] == "full"
    assert argv[argv.index("--kernel-name") + 1] == "kda_fwd_kernel"
    # "python" is the worker's interpreter, not whichever python is first on PATH.
    assert report["app"][1:] == ["capture.py"] and "python" in Path(report["app"][0]).name
    saved = NcuMetrics.model_validate_json(Path(str(out) + ".json").read_text())
    assert [k.sectors_excessive for k in saved.kernels] == [190464, 6144]
    assert "kda_fwd_kernel" in stdout and "190,464" in stdout


def test_user_clock_control_wins_and_app_status_propagates(client, tmp_path: Path) -> None:
    d = _capture_dir(tmp_path, code=5)
    r = run_ncu(client, [SendSpec(d)], app=["python", "capture.py"],
                ncu_args=["--clock-control", "base"], timeout=60)
    argv = json.loads(r.report)["argv"]
    assert argv.count("--clock-control") == 1 and "base" in argv
    assert r.exit_code == 5
    assert r.metrics.kernels[0].duration_ns == 135296.0 and r.metrics_error is None


def test_no_report_is_a_failure(url: str, tmp_path: Path, capsys) -> None:
    d = _capture_dir(tmp_path)
    code = main(["ncu", "--remote", url, "--send", str(d), "-o", str(tmp_path / "r"),
                 "--kernel-name", "nomatch", "--", "python", "capture.py"])
    assert code == 1
    assert "ncu wrote no report" in capsys.readouterr().err
    assert not (tmp_path / "r.ncu-rep").exists()


def test_unknown_ncu_option_reaches_ncu(url: str, tmp_path: Path, capsys) -> None:
    d = _capture_dir(tmp_path)
    code = main(["ncu", "--remote", url, "--send", str(d), "-o", str(tmp_path / "r"),
                 "--bogus-option", "--", "python", "capture.py"])
    assert code == 1
    assert "unrecognised option '--bogus-option'" in capsys.readouterr().err


def test_server_without_ncu_fails_clearly(url: str, tmp_path: Path, capsys) -> None:
    # The runner also looks in the usual install places; where ncu really is installed
    # there, emptying PATH cannot hide it.
    if any(glob.glob(p) for p in ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu",
                                  "/usr/local/NVIDIA-Nsight-Compute*/ncu")):
        pytest.skip("a real ncu is installed in a standard location")
    d = _capture_dir(tmp_path)
    code = main(["ncu", "--remote", url, "--send", str(d), "-o", str(tmp_path / "r"),
                 "-e", "PATH=/nonexistent", "--", "python", "capture.py"])
    assert code == EXIT_TOOL_FAILURE
    assert "ncu (Nsight Compute) was not found on the server" in capsys.readouterr().err


def test_where_the_time_goes_comes_back_without_being_asked_for(client, tmp_path: Path) -> None:
    # DRAM and SM throughput, the tensor pipes and the stall reasons are read from the
    # report's whole raw page, cut on the server to those columns; none of them is in
    # --metrics, where a name this ncu does not know would fail the capture.
    d = _capture_dir(tmp_path)
    r = run_ncu(client, [SendSpec(d)], app=["python", "capture.py"], ncu_args=["--set", "full"], timeout=60)
    argv = json.loads(r.report)["argv"]
    assert "dram__" not in argv[argv.index("--metrics") + 1]
    k, prep = r.metrics.kernels
    assert (k.dram_pct, k.sm_pct) == (71.25, 40.1)
    assert k.tensor_pct == 27.75  # the busiest pipe by active cycles (instruction shares: a fallback)
    assert list(k.stalls) == ["long_scoreboard", "barrier", "short_scoreboard", "math_pipe_throttle"]
    assert prep.stalls["math_pipe_throttle"] == 4.0 and "selected" not in prep.stalls
    assert "device__attribute_max_threads_per_block" not in k.values  # cut on the server
    assert k.sectors_excessive == 190464 and r.metrics_error is None
    assert r.profile_csv is not None and len(r.profile_csv) < len(
        (Path(__file__).parent / "fixtures" / "ncu_raw_full_page_synthetic.csv").read_text())
