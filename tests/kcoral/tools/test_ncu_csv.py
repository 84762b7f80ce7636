"""NCU raw-CSV parser on a fixture in the documented format (header row, units row,
thousands separators, one row per launch), and the ncu-metrics command."""
from __future__ import annotations

from pathlib import Path

import pytest

from kcoral.cli import main
from kcoral.errors import NcuError
from kcoral.ncu import NcuMetrics, format_table, load_metrics, parse_raw_csv

CSV = (Path(__file__).parent / "fixtures" / "ncu_raw_two_launches.csv").read_text()


def test_parses_every_launch_with_base_units() -> None:
    m = parse_raw_csv(CSV)
    assert [k.launch_id for k in m.kernels] == [0, 1]
    k = m.kernels[0]
    assert k.name == "kda_fwd_kernel"
    assert k.duration_ns == 135296.0
    assert (k.sectors_excessive, k.sectors_total, k.sectors_ideal) == (190464, 1837824, 1647360)
    assert k.registers == 168 and k.shared_bank_conflicts == 656485
    assert k.achieved_occupancy == pytest.approx(11.82)
    assert k.units["derived__memory_l2_theoretical_sectors_global_excessive"] == "byte"
    assert k.values["gpu__time_duration.sum"] == 135296.0
    # A demangled template name with commas survives CSV quoting.
    assert m.kernels[1].name.startswith("void kda_prep<64, 128>(")
    assert m.kernels[1].sectors_excessive == 6144


def test_recorded_h200_output() -> None:
    """Recorded: `ncu --import ... --page raw --csv --print-units base --metrics <key>` of
    tests/kcoral/tools/gpu_app/toy_iket.py on an H200 with Nsight Compute 2025.3.1."""
    text = (Path(__file__).parent / "fixtures" / "ncu_raw_h200_toy.csv").read_text()
    (k,) = parse_raw_csv(text).kernels
    assert (k.name, k.duration_ns, k.registers) == ("toy_chunks", 172064.0, 31)
    assert (k.sectors_excessive, k.sectors_total, k.sectors_ideal) == (1572864, 2097216, 524352)
    assert (k.achieved_occupancy, k.shared_bank_conflicts) == (6.25, 0)
    assert k.units["memory_l2_theoretical_sectors_global"] == "sectors"


def test_preamble_lines_and_missing_metrics() -> None:
    text = ('==PROF== Disconnected from process 4242\n'
            '"ID","Kernel Name","gpu__time_duration.sum","launch__registers_per_thread"\n'
            '"","","ns","register/thread"\n'
            '"0","k","1,234.5","n/a"\n')
    k = parse_raw_csv(text).kernels[0]
    assert k.duration_ns == 1234.5
    assert k.registers is None and k.sectors_excessive is None and k.achieved_occupancy is None


def test_rows_without_units_row() -> None:
    text = '"ID","Kernel Name","gpu__time_duration.sum"\n"3","k","10"\n'
    k = parse_raw_csv(text).kernels[0]
    assert (k.launch_id, k.duration_ns, k.units) == (3, 10.0, {})


@pytest.mark.parametrize("text, message", [
    ("", "no CSV"),
    ("==WARNING== No kernels were profiled.\n", "no header"),
    ('"ID","Kernel Name","gpu__time_duration.sum"\n"0","k"\n', "2 cells"),
])
def test_bad_csv_is_refused(text: str, message: str) -> None:
    with pytest.raises(NcuError, match=message):
        parse_raw_csv(text)


def test_table_lists_key_metrics() -> None:
    table = format_table(parse_raw_csv(CSV))
    assert "135.296" in table and "190,464" in table and "1,837,824" in table
    assert len(table.splitlines()) == 3


def test_ncu_metrics_command_reads_csv_and_json(tmp_path: Path, capsys) -> None:
    csv_path = tmp_path / "r.csv"
    csv_path.write_text(CSV)
    assert main(["ncu-metrics", str(csv_path), "--json"]) == 0
    saved = tmp_path / "r.ncu-rep.json"
    saved.write_text(capsys.readouterr().out)
    assert NcuMetrics.model_validate_json(saved.read_text()).kernels[0].registers == 168
    assert main(["ncu-metrics", str(saved)]) == 0
    assert "kda_fwd_kernel" in capsys.readouterr().out
    assert main(["ncu-metrics", str(tmp_path / "missing.json")]) == 1
    assert "no such file" in capsys.readouterr().err


def test_report_needs_local_ncu(tmp_path: Path, monkeypatch) -> None:
    rep = tmp_path / "r.ncu-rep"
    rep.write_bytes(b"binary")
    monkeypatch.setenv("PATH", str(tmp_path))  # no ncu here
    with pytest.raises(NcuError, match="needs Nsight Compute"):
        load_metrics(rep)


def test_profile_fields_under_the_other_generations_names() -> None:
    from kcoral.ncu_columns import profile_fields

    got = profile_fields({"smsp__average_warp_latency_issue_stalled_barrier.ratio": 3.0,
                          "smsp__average_warp_latency_issue_stalled_wait.ratio": 5.0,
                          "sm__inst_executed_pipe_tensor.avg.pct_of_peak_sustained_active": 12.0,
                          "gpu__time_duration.sum": 1.0})
    assert got == {"dram_pct": None, "sm_pct": None, "tensor_pct": 12.0, "stalls": {"wait": 5.0, "barrier": 3.0}}


def test_dram_throughput_under_the_name_ncu_2025_prints() -> None:
    # The H200's ncu 2025.3 raw page has gpu__dram_throughput, not dram__throughput: the
    # first GPU run of the profile columns read dram % as missing.
    from kcoral.ncu_columns import is_profile_metric, profile_fields

    name = "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"
    assert is_profile_metric(name)
    assert profile_fields({name: 71.5})["dram_pct"] == 71.5


def test_a_page_without_profile_columns_has_none() -> None:
    (k, _) = parse_raw_csv(CSV).kernels
    assert (k.dram_pct, k.tensor_pct, k.stalls) == (None, None, {})
    assert "dram %" in format_table(parse_raw_csv(CSV))


def test_recorded_h200_full_page_of_the_two_pass_kernels() -> None:
    """Recorded: `ncu --clock-control none --set full -k regex:kda --launch-count 2` of the
    two_pass defaults' capture_ncu.py (B=1, T=8192, H=96) on an H200, Nsight Compute 2025.3.1,
    then `ncu --import --page raw --csv --print-units base` (2026-12-05). Over 2,000 columns a
    launch; the profile columns must come out of it whole, and out of the server's cut too."""
    from kcoral.ncu_columns import profile_columns

    text = (Path(__file__).parent / "fixtures" / "ncu_raw_full_page_h200_two_pass.csv").read_text()
    for page in (text, profile_columns(text)):
        prep, walk = parse_raw_csv(page).kernels
        assert (prep.name, walk.name) == ("kda_prep_kernel", "kda_state_kernel")
        assert (prep.dram_pct, prep.sm_pct, prep.tensor_pct) == (65.09, 53.55, 13.26)
        assert list(prep.stalls) == ["short_scoreboard", "wait", "long_scoreboard", "barrier"]
        assert (walk.dram_pct, walk.tensor_pct) == (85.66, 53.3)  # wgmma counts in the tensor pipe
        assert "gmma" in walk.stalls
    assert len(profile_columns(text).splitlines()[0]) < len(text.splitlines()[0]) / 10
