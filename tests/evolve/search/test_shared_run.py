"""Two `evolve run` processes share one run while agents register candidates into it,
on SQLite and on PostgreSQL: each process claims its own candidates, every stage of a
candidate runs once, promotions form one chain, and the run ends when the last leaves."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess

from tests.evolve.search.helpers import cli_env, evolve_cmd, population, wait_for, write_config


def _agent_candidates(tmp, n: int) -> list:
    """Rendered NumPy candidates (correct, so they reach the bench), copied under scratch/
    as an agent's experiments are."""
    from evolve.families import load_family
    from evolve.render import render_candidate
    from tests.evolve.search.conftest import NUMPY_FAMILY

    family = load_family(NUMPY_FAMILY)
    dirs = []
    for i, chunk in enumerate((16, 8)[:n]):
        params = dict(algorithm="chunked", chunk=chunk, batching="per_chunk", decay_form="factored",
                      contract="matmul", solve="linalg", dtype="float32")
        rendered = render_candidate(family, params, tmp / "agent-renders")
        d = tmp / "kcoral" / "workloads" / "kda" / "forward_cpu_small" / "scratch" / f"agent{i}"
        shutil.copytree(rendered, d)
        dirs.append(d)
    return dirs


def test_two_orchestrators_share_one_run_while_agents_register(tmp_path, cpu_server, db_url):
    # Small budgets (the first process starts 2 pipelines, the joined one 1) keep this
    # near half a minute per backend on two cores.
    cfg = write_config(tmp_path, max_evals=2, confirm_runs=1, gputest=False,
                       fixed='{ algorithm = "chunked", dtype = "float32" }', subspace='{ chunk = [8, 16, 32, 64] }')
    env = cli_env()
    first = subprocess.Popen(evolve_cmd("run", str(cfg), "--remote", cpu_server.url, "--db", db_url, "--json"),
                             cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs = [first]
    try:
        pop = population(db_url)

        def live_run():
            try:
                runs = pop.runs(pop.workload_id("forward_cpu_small"))
            except KeyError:
                return None
            return runs[-1] if runs and pop.workers(runs[-1].id) else None

        run = wait_for(live_run, timeout=90, interval=0.1, what="the first run")
        # Agents register while the run is going (separate processes, as on other hosts).
        registers = [subprocess.run(evolve_cmd("register", str(d), "--author", f"agent-{i}", "--db", db_url),
                                    cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
                     for i, d in enumerate(_agent_candidates(tmp_path, 1))]
        for r in registers:
            assert r.returncode == 0, r.stderr
        agents = [int(r.stdout.split()[0]) for r in registers]
        second = subprocess.Popen(evolve_cmd("run", str(cfg), "--remote", cpu_server.url, "--db", db_url,
                                             "--join", str(run.id), "--max-evals", "1", "--json"),
                                  cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(second)
        outputs = [p.communicate(timeout=400) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for p, (_out, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-3000:]
    summaries = [json.loads(out)["summary"] for out, _ in outputs]
    assert {s["run_id"] for s in summaries} == {run.id}
    assert [s["joined"] for s in summaries] == [False, True]

    wid = pop.workload_id("forward_cpu_small")
    assert [r.id for r in pop.runs(wid)] == [run.id]              # one run, not two
    ended = pop.run(run.id)
    assert ended is not None and ended.state == "finished"
    workers = pop.workers(run.id)
    assert len(workers) == 2 and all(w.ended_at is not None for w in workers)
    evaluations = pop.evaluations_of(wid)
    by_worker = {w.id: {e.candidate_id for e in evaluations if e.worker_id == w.id} for w in workers}
    assert all(by_worker.values()), by_worker                       # both claimed work
    assert not set.intersection(*by_worker.values())                # ... and never the same candidate
    for cand in {e.candidate_id for e in evaluations}:
        for stage in ("check", "bench"):
            assert len([e for e in pop.evaluations(cand, stage) if e.status != "interrupted"]) <= 1, (cand, stage)
    # The agents' candidates landed in the running run and were evaluated by it.
    for cid in agents:
        checks = pop.evaluations(cid, "check")
        assert len(checks) == 1 and checks[0].run_id == run.id and checks[0].status in ("passed", "failed")
    assert not pop.evaluations_of(wid, status="running")
    # Promotions stay single: one chain, each over the best before it.
    chain = pop.promotions(wid)
    assert chain and chain[0].previous_best_id is None
    assert [p.previous_best_id for p in chain[1:]] == [p.candidate_id for p in chain[:-1]]
    pop.close()


def test_join_needs_a_live_run_and_excludes_resume(tmp_path, cpu_server, capsys, monkeypatch):
    """In-process (`evolve.cli.main`), as a subprocess costs seconds of imports here."""
    from evolve.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KCORAL_REMOTE", raising=False)
    cfg = write_config(tmp_path, max_evals=1, gputest=False)
    db = f"sqlite:///{tmp_path / 'evolve.db'}"

    def evolve(*args: str) -> tuple[int, str]:
        capsys.readouterr()
        code = main(["run", str(cfg), "--db", db, *args])
        return code, capsys.readouterr().err

    code, err = evolve("--join", "--resume")
    assert code == 2 and "pick one" in err
    code, err = evolve("--join", "seven")
    assert code == 2 and "run id" in err
    previous = signal.getsignal(signal.SIGTERM)   # `evolve run` installs its own handler
    try:
        code, err = evolve("--remote", cpu_server.url, "--join")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert code == 2 and "no live run of workload 'forward_cpu_small'" in err, err
    pop = population(db)
    wid = pop.workload_id("forward_cpu_small")
    assert pop.runs(wid) == [] and pop.candidates(wid) == []    # refused before anything was recorded
    pop.close()
