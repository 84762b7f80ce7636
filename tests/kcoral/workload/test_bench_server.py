"""`kcoral bench` end to end against a real CPU server: the reference passes, each broken
candidate fails for its own reason, the salt never reaches the candidate, the fallback for
a server without the holdout builtin, the fixed lines and the exit codes."""
from __future__ import annotations

import json
import textwrap

import pytest

from kcoral.bench import BenchReport, format_lines, run_bench
from kcoral.cli import main as kcoral_main
from kcoral.outcome import Outcome
from kcoral.protocol.error_info import ErrorInfo

from .conftest import CPU_WORKLOAD, GPU_WORKLOAD, SALT, stage_broken

pytestmark = pytest.mark.slow


def case(rep: BenchReport, name: str):
    return next(c for c in rep.cases if c.name == name)


def test_reference_passes(client):
    rep = run_bench(client, CPU_WORKLOAD, "scratch/reference", timeout=120)
    assert rep.passed, rep.message + rep.log
    assert rep.holdout_pass is True and rep.holdout_source == "server"
    assert rep.baseline_name.startswith("reference (fp32 chunked, NumPy")
    assert rep.kernel_ms > 0 and rep.baseline_ms > 0
    assert rep.speedup == pytest.approx(rep.baseline_ms / rep.kernel_ms)
    assert len(rep.trials) == 3 and rep.spread == max(rep.spreads.values())
    names = [c.name for c in rep.cases]
    for expected in ["probe_T1", "probe_T321", "saturated", "correlated", "random_depth", "scored"]:
        assert expected in names
    assert all(c.status == "PASS" for c in rep.cases)
    # 3 scored calls before timing, then every call of every timing trial (1 warm-up + 5
    # timed each): all verified, and FLAKY detection spans them all
    assert case(rep, "scored").detail == "21 call(s)"
    assert rep.candidate == "scratch/reference" and rep.workload == "forward_cpu_small"


@pytest.mark.parametrize("name, kind, must, must_not", [
    ("only_output", "holdout", ["final_state:", "not finite"], ["output:"]),
    ("setup_only", "holdout", ["output:", "final_state:", "not finite"], ["changed its inputs"]),
    ("changes_input", "holdout", ["changed its inputs: q"], ["not finite"]),
    ("deep_decay", "holdout", ["RMS ratio"], ["not finite", "changed its inputs"]),
    ("replay", "correctness", ["strong:", "out of tolerance"], ["not finite"]),
    ("flaky", "flaky", ["scored: call 2 of 3", "final_state:"], ["output:"]),
    ("output_2pct", "holdout", ["output: RMS ratio"], ["final_state:", "not finite"]),
    ("state_2pct", "holdout", ["final_state: RMS ratio"], ["output:", "not finite"]),
])
def test_broken_candidates_fail_for_their_reason(client, tmp_path, name, kind, must, must_not):
    cand = stage_broken(name, tmp_path)
    rep = run_bench(client, CPU_WORKLOAD, cand, timeout=120)
    assert not rep.passed
    assert rep.failure_kind == kind, rep.message
    for text in must:
        assert text in rep.message, rep.message
    for text in must_not:
        assert text not in rep.message, rep.message
    if kind == "holdout":
        assert rep.holdout_pass is False and rep.kernel_ms is None  # nothing was timed
        assert format_lines(rep)[0].startswith("holdout correctness: FAIL case ")
    elif kind == "flaky":
        assert rep.holdout_pass is True and rep.kernel_ms is None  # failed before timing
        assert case(rep, "scored").status == "FLAKY"
        assert "correct: FLAKY scored call 2 of 3" in "\n".join(format_lines(rep))
    else:
        assert rep.holdout_pass is True and rep.kernel_ms is None


def test_replay_is_caught_by_fresh_inputs(client, tmp_path):
    rep = run_bench(client, CPU_WORKLOAD, stage_broken("replay", tmp_path), timeout=120)
    stress = [c for c in rep.cases if c.group == "stress"]
    failing = [c for c in rep.cases if c.status != "PASS"]
    # its first call on a setup is right (holdout and probes use one call per setup) ...
    assert all(c.status == "PASS" for c in rep.cases if c.group in ("holdout", "probe"))
    assert stress[0].status == "PASS"
    # ... the second call, on fresh inputs, replays the first one's result
    assert failing == [stress[1]] and "out of tolerance" in failing[0].detail


SNOOP = textwrap.dedent('''
    """Test candidate: prints its environment and every file of its own directory and the
    one above it (where the judge's files were, when the two shared a process)."""
    import os
    import sys

    def dump():
        print("SNOOP-BEGIN")
        for k, v in sorted(os.environ.items()):
            print(f"ENV {k}={v}")
        for base in (os.getcwd(), os.path.dirname(os.path.abspath(__file__))):
            for dirpath, _, files in os.walk(base):
                for f in files:
                    path = os.path.join(dirpath, f)
                    try:
                        with open(path, "rb") as fh:
                            print(f"FILE {path}:", fh.read().decode("utf-8", "replace"))
                    except OSError as exc:
                        print(f"FILE {path}: unreadable {exc}")
        print("SNOOP-END")
        sys.stdout.flush()

    def setup(data, B, T, H):
        dump()
        return lambda: None
''')


def test_salt_never_reaches_the_candidate(client, tmp_path):
    cand = tmp_path / "snoop"
    cand.mkdir()
    (cand / "solution.py").write_text(SNOOP)
    rep = run_bench(client, CPU_WORKLOAD, cand, timeout=120)
    assert "SNOOP-BEGIN" in rep.log and "SNOOP-END" in rep.log  # it did print
    assert "FILE " in rep.log and "solution.py" in rep.log  # and saw its own files
    assert SALT not in rep.log
    assert SALT not in rep.model_dump_json()
    assert not rep.passed and rep.failure_kind == "holdout"


class StockServerClient:
    """The real client and server, except that builtin.holdout_seeds is answered the way a
    stock KCoral server answers an unknown builtin (FAILED, kind `unavailable`)."""

    def __init__(self, inner):
        self.inner = inner
        self.refused = 0

    def execute(self, program, timeout_seconds=None):
        for ins in program.instructions:
            if ins.get("op") == "run" and ins.get("fn") == "builtin.holdout_seeds":
                self.refused += 1
                return Outcome(status="FAILED", request_id="stock", error=ErrorInfo(
                    kind="unavailable", message="unknown builtin holdout_seeds",
                    instruction_op="run", instruction_id=ins["id"]))
        return self.inner.execute(program, timeout_seconds=timeout_seconds)


def test_stock_server_fallback_and_against(client):
    """One bench covers two things: seeds drawn by the client when the server lacks the
    builtin, and --against timing another candidate in the baseline slot."""
    stock = StockServerClient(client)
    rep = run_bench(stock, CPU_WORKLOAD, "scratch/reference", timeout=120, against="scratch/reference")
    assert stock.refused == 1
    assert rep.passed and rep.holdout_source == "client"
    assert any(line.startswith("holdout_source: client") for line in format_lines(rep))
    assert rep.baseline_name == "against scratch/reference"
    assert 0.5 < rep.speedup < 2.0  # the same code on both sides


def test_cli_lines_and_exit_codes(server, tmp_path, capsys):
    code = kcoral_main(["bench", str(CPU_WORKLOAD), "scratch/reference", "--remote", server.url])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[0] == "holdout correctness: PASS"
    for prefix, pattern in [("baseline: ", r"\d+\.\d{6} ms"), ("kernel: ", r"\d+\.\d{6} ms"),
                            ("speedup: ", r"\d+\.\d{4}x")]:
        line = next(l for l in out if l.startswith(prefix))
        assert __import__("re").fullmatch(prefix + pattern, line), line
    assert any(l.startswith("baseline_name: ") for l in out)
    assert any(l.startswith("method: ") for l in out)
    assert any(l.startswith("spread: baseline=") for l in out)
    assert any(l.startswith("correct: PASS probe_T17") for l in out)
    assert out[-1] == "result: PASS"

    broken = stage_broken("changes_input", tmp_path)
    code = kcoral_main(["bench", str(CPU_WORKLOAD), str(broken), "--remote", server.url, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1
    assert doc["passed"] is False and doc["failure_kind"] == "holdout"

    code = kcoral_main(["bench", str(CPU_WORKLOAD), "scratch/no_such", "--remote", server.url])
    assert code == 2
    assert "no candidate" in capsys.readouterr().err


def test_gpu_workload_on_a_cpu_server_is_unavailable(server, capsys):
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is importable here: the GPU workload may well run")
    except ImportError:
        pass
    code = kcoral_main(["bench", str(GPU_WORKLOAD), "scratch/reference", "--remote", server.url])
    out = capsys.readouterr().out.splitlines()
    assert code == 125
    assert out[-1].startswith("result: FAIL unavailable: CUDA workload but CuPy is not importable")
