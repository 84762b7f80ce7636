"""benchmarks/icache_probe.py: its loops are the size they claim (nvcc, on the CPU), and on a GPU
it times each size on each SM count and writes its report."""
from __future__ import annotations

import json
import sys

import pytest

from .conftest import REPO, compile_cubin, needs_nvcc, text_bytes

sys.path.insert(0, str(REPO / "benchmarks"))
import icache_probe


@needs_nvcc
@pytest.mark.parametrize("kilobytes", [4, 32])
def test_loop_is_the_size_asked(tmp_path, kilobytes):
    src = tmp_path / "loop.cu"
    src.write_text(icache_probe.loop_source(kilobytes))
    compile_cubin(src, tmp_path)
    size = text_bytes(tmp_path / "loop.cubin", "loop")
    # the FMAs, plus the loop's counter, branch and epilogue (a few hundred bytes)
    assert kilobytes * 1024 <= size <= kilobytes * 1024 + 1024, size
    assert icache_probe.instructions_of(kilobytes) * icache_probe.INSTR_BYTES == kilobytes * 1024


@pytest.mark.parametrize("args", [["--sizes", "0"], ["--sizes", "4,x"], ["--sms", "0"], ["--sms", "some"]])
def test_rejects_sizes_and_counts_it_cannot_run(capsys, args):
    with pytest.raises(SystemExit) as exc:   # before any GPU is looked for
        icache_probe.main(args)
    assert exc.value.code == 2 and "error:" in capsys.readouterr().err


def test_runs_on_a_gpu(tmp_path):
    from .conftest import cupy_or_skip

    cupy_or_skip()
    out = tmp_path / "icache.json"
    assert icache_probe.main(["--sizes", "4,8", "--sms", "1,all", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [r["kb"] for r in report["rows"]] == [4, 8]
    for row in report["rows"]:
        assert set(row["ns_per_instruction"]) == {"1", str(report["sm_count"])}
        assert all(v > 0 for v in row["ns_per_instruction"].values())
