"""The tools on a real GPU server: a CuPy kernel traced with IKET, and (where Nsight
Compute is installed) a real ncu capture whose raw CSV the parser must read. Skipped
without CuPy and a GPU."""
from __future__ import annotations

import glob
import json
import os
import shutil
from pathlib import Path
from typing import Iterator

import pytest

from tests.gpu import gpu_available

from kcoral.cli import main

pytestmark = pytest.mark.gpu
APP = Path(__file__).parent / "gpu_app"



def _ncu_available() -> bool:
    return bool(shutil.which("ncu") or glob.glob("/opt/nvidia/nsight-compute/*/ncu")
                or os.path.exists("/usr/local/cuda/bin/ncu"))


@pytest.fixture(scope="module")
def gpu_url() -> Iterator[str]:
    if not gpu_available():
        pytest.skip("needs CuPy and a CUDA GPU")
    from tests.serverproc import ServerProcess

    with ServerProcess([]) as srv:  # default: every visible GPU
        yield srv.url


def test_iket_on_gpu(gpu_url: str, tmp_path: Path, capsys) -> None:
    out = tmp_path / "iket"
    code = main(["iket", "--remote", gpu_url, "--send", str(APP), "--output-dir", str(out),
                 "--", "python", "toy_iket.py"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    trace = json.loads((out / "toy_chunks.trace.json").read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == 4 * 4 * 32 * 2 and trace["otherData"]["dropped"] == 0
    assert all(e["dur"] >= 0 for e in spans)
    assert main(["iket-analyze", str(out / "toy_chunks.trace.json"), "0"]) == 0
    text = capsys.readouterr().out
    print(text)
    assert "-- warp 3 (worker)" in text and "load" in text and "[32]" in text
    assert "steady-state chunk period (load)" in text


def test_ncu_on_gpu(gpu_url: str, tmp_path: Path, capsys) -> None:
    if not _ncu_available():
        pytest.skip("Nsight Compute is not installed")
    rep = tmp_path / "toy.ncu-rep"
    code = main(["ncu", "--remote", gpu_url, "--send", str(APP), "-o", str(rep),
                 "--kernel-name", "toy_chunks", "--launch-count", "1",
                 "--", "python", "toy_iket.py"])
    captured = capsys.readouterr()
    print(captured.out)
    assert code == 0, captured.err
    assert rep.stat().st_size > 1000
    saved = json.loads(Path(str(rep) + ".json").read_text())
    (kernel,) = saved["kernels"]
    assert kernel["name"].startswith("toy_chunks")
    assert kernel["duration_ns"] and kernel["duration_ns"] > 0
    assert kernel["registers"] and kernel["registers"] > 0
    assert kernel["sectors_total"] is not None


def test_ncu_full_set_reads_where_the_time_goes(gpu_url: str, tmp_path: Path, capsys) -> None:
    """`--set full` collects throughput, pipe and warp-state metrics: the profile columns
    (matched by name pattern, since a name this ncu does not know would fail the capture)
    must find them in a real report, not only in the made-up page of test_ncu_csv."""
    if not _ncu_available():
        pytest.skip("Nsight Compute is not installed")
    rep = tmp_path / "toy-full.ncu-rep"
    code = main(["ncu", "--remote", gpu_url, "--send", str(APP), "-o", str(rep),
                 "--kernel-name", "toy_chunks", "--launch-count", "1", "--set", "full",
                 "--", "python", "toy_iket.py"])
    captured = capsys.readouterr()
    print(captured.out)
    assert code == 0, captured.err
    (kernel,) = json.loads(Path(str(rep) + ".json").read_text())["kernels"]
    print({k: kernel.get(k) for k in ("dram_pct", "sm_pct", "tensor_pct", "stalls")})
    assert kernel["dram_pct"] is not None and 0 <= kernel["dram_pct"] <= 100
    assert kernel["sm_pct"] is not None and 0 <= kernel["sm_pct"] <= 100
    assert kernel["stalls"] and all(v >= 0 for v in kernel["stalls"].values())
