"""Issue 15, item 3: a run that cannot succeed stops by itself, early and loudly."""
from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

from tests.evolve.search.conftest import NUMPY_FAMILY, REPO
from tests.evolve.search.helpers import population, run_cli, write_config


def _broken_family_config(tmp_path, *, extra: str = "") -> str:
    """numpy_chunked whose every candidate fails its import the same way (a missing package)."""
    fam = tmp_path / "broken_numpy"
    shutil.copytree(NUMPY_FAMILY, fam)
    src = fam / "solution.py.j2"
    src.write_text("import no_such_backend_package\n" + src.read_text())
    text = write_config(tmp_path, max_evals=12, kind="random").read_text()
    text = text.replace('name = "numpy_chunked"', f'name = "numpy_chunked"\npath = "{fam}"')
    text = text.replace("[budget]\n", f"[budget]\nmax_same_failures = 3\n{extra}")
    cfg = tmp_path / "broken.toml"
    cfg.write_text(text)
    return str(cfg)


def test_repeated_identical_failures_abort_the_run_and_call_the_hook(tmp_path, cpu_server):
    db_url = f"sqlite:///{tmp_path / 'evolve.db'}"
    events = tmp_path / "events.jsonl"
    proc = run_cli("run", _broken_family_config(tmp_path), "--remote", cpu_server.url, "--db", db_url,
                   "--on-event", f"cat >> {events}; echo >> {events}", "--json", cwd=tmp_path)
    assert proc.returncode == 3, proc.stdout + proc.stderr[-3000:]
    summary = json.loads(proc.stdout)["summary"]        # --json: stdout is one document
    assert summary["aborted"] is True and "3 consecutive" in summary["stopped_because"]
    last = proc.stderr.strip().splitlines()[-1]
    assert "aborted" in last and "3 consecutive" in last and "no_such_backend_package" in last
    pop = population(db_url)
    # stopped after the third failure (plus what was already in flight), not after 12
    assert len(pop.candidates()) <= 5
    [run] = pop.runs()
    assert run.state == "failed"
    kinds = [json.loads(line)["event"] for line in events.read_text().splitlines() if line.strip()]
    assert kinds == ["abort"]
    payload = json.loads(events.read_text().splitlines()[0])
    assert payload["run_id"] == run.id and "no_such_backend_package" in payload["reason"]


def test_preflight_refuses_a_gpu_workload_on_a_cpu_server(tmp_path, cpu_server):
    db_url = f"sqlite:///{tmp_path / 'evolve.db'}"
    cfg = tmp_path / "gpu.toml"
    cfg.write_text(f'root = "{REPO}"\nworkload = "kcoral/workloads/kda/forward_b1_t8192_h96"\n'
                   f'output_dir = "{tmp_path / "gen"}"\n[[families]]\nname = "two_pass"\n'
                   "[budget]\nmax_evals = 2\n")
    proc = run_cli("run", str(cfg), "--remote", cpu_server.url, "--db", db_url, cwd=tmp_path)
    assert proc.returncode == 3, proc.stdout + proc.stderr[-3000:]
    assert "preflight" in proc.stderr and "cuda" in proc.stderr and "no GPU" in proc.stderr
    assert population(db_url).candidates() == []


def test_the_breaker_counts_one_cause_in_a_row():
    from evolve.breaker import FailureBreaker, failure_signature

    assert failure_signature("import", "No module named 'cupy' (in /w/kcoral-tool-ab12/run)") == \
        failure_signature("import", "No module named 'cupy' (in /w/kcoral-tool-zz99/run)\nmore")
    assert failure_signature("runtime", "ValueError: chunk 48") != failure_signature("runtime", "ValueError: chunk 32")
    b = FailureBreaker(3)
    assert b.record_failure("import", "x") is None and b.record_failure("import", "x") is None
    b.record_success()                                  # a pass in between resets the count
    assert b.record_failure("import", "x") is None and b.record_failure("runtime", "x") is None
    assert b.record_failure("runtime", "x") is None
    assert "3 consecutive" in (b.record_failure("runtime", "x") or "")
    assert FailureBreaker(0).record_failure("import", "x") is None


def _with_tool_stages(tmp_path) -> str:
    text = write_config(tmp_path, max_evals=2).read_text()
    text += ('\n[stages.ncu]\nenabled = true\napp = ["python", "capture_ncu.py"]\n'
             '[stages.iket]\nenabled = true\napp = ["python", "capture_iket.py"]\n')
    cfg = tmp_path / "tools.toml"
    cfg.write_text(text)
    return str(cfg)


def test_preflight_refuses_tool_stages_on_a_server_without_a_gpu(tmp_path, cpu_server):
    db_url = f"sqlite:///{tmp_path / 'evolve.db'}"
    proc = run_cli("run", _with_tool_stages(tmp_path), "--remote", cpu_server.url, "--db", db_url, cwd=tmp_path)
    assert proc.returncode == 3, proc.stdout + proc.stderr[-3000:]
    assert "preflight: stages iket, ncu are enabled but the server has no GPU" in proc.stderr
    assert population(db_url).candidates() == []


def test_preflight_checks_the_tool_stages_apps_and_asks_the_server_for_ncu(tmp_path):
    """On a GPU server (virtual GPUs: the preflight only reads /health and runs a Python
    probe there): the family's candidates lack the stages' capture scripts, and ncu is
    reported as the server finds it."""
    import glob

    from kcoral.runners.tool_runner import NCU_PATTERNS
    from tests.serverproc import ServerProcess

    db_url = f"sqlite:///{tmp_path / 'evolve.db'}"
    with ServerProcess(["--virtual-gpus", "1"]) as srv:
        proc = run_cli("run", _with_tool_stages(tmp_path), "--remote", srv.url, "--db", db_url, cwd=tmp_path)
    assert proc.returncode == 3, proc.stdout + proc.stderr[-3000:]
    assert "stage ncu runs capture_ncu.py in the candidate's folder, but the candidates of families " \
           "['numpy_chunked'] have no such file" in proc.stderr
    assert "stage iket runs capture_iket.py" in proc.stderr
    has_ncu = shutil.which("ncu") or any(glob.glob(p) for p in NCU_PATTERNS)  # the server runs here
    assert ("the server has no Nsight Compute" in proc.stderr) == (not has_ncu), proc.stderr[-3000:]
    assert population(db_url).candidates() == []


def test_preflight_refuses_cuda_families_where_nvcc_cannot_be_confined(monkeypatch):
    # nvcc reads the candidate's includes on this machine: without its sandbox every CUDA
    # candidate would fail its check stage, one at a time, before the breaker stopped.
    from evolve.families import load_family
    from evolve.pipeline import nvcc
    from evolve.preflight import problems
    config = SimpleNamespace(workload_dir=REPO / "kcoral/workloads/kda/forward_b1_t8192_h96",
                             workload_name="forward_b1_t8192_h96")
    families = {"two_pass": load_family(REPO / "evolve/templates/kda/two_pass")}
    health = {"status": "ok", "gpu_count": 1, "versions": {"cupy": "14"}}
    monkeypatch.setattr(nvcc, "nvcc_path", lambda: "/opt/cuda/bin/nvcc")
    monkeypatch.setattr(nvcc, "sandbox_problem", lambda: "`bwrap` is not on PATH")
    assert problems(config, health, families) == ["families ['two_pass']: `bwrap` is not on PATH"]
    monkeypatch.setattr(nvcc, "sandbox_problem", lambda: None)
    assert problems(config, health, families) == []
    monkeypatch.setattr(nvcc, "nvcc_path", lambda: None)  # no local nvcc: the compile is skipped, not refused
    monkeypatch.setattr(nvcc, "sandbox_problem", lambda: "`bwrap` is not on PATH")
    assert problems(config, health, families) == []
