"""A server that dies and comes back on the same port mid-run: the run waits and goes on."""
from __future__ import annotations

import subprocess
import time

from evolve.embedded import free_port
from evolve.families import load_family
from evolve.population import NewCandidate
from evolve.render import render_candidate
from tests.evolve.search.conftest import NUMPY_FAMILY
from tests.evolve.search.helpers import WORKLOAD, cli_env, crash, evolve_cmd, population, wait_for, write_config
from tests.serverproc import ServerProcess


def test_run_survives_a_server_restart(tmp_path):
    port = free_port()
    args = ["--cpu-workers", "2", "--port", str(port)]
    first = ServerProcess(args).start()
    second = None
    cfg = write_config(tmp_path, max_evals=2, confirm_runs=1, gputest=False,
                       fixed='{ algorithm = "chunked", dtype = "float32" }', subspace='{ chunk = [16, 32] }')
    db_url = f"sqlite:///{tmp_path / 'evolve.db'}"
    # An agent's candidate waiting in the population is evaluated before any proposal.
    pop = population(db_url)
    wid = pop.ensure_workload("forward_cpu_small", str(WORKLOAD))
    fam = load_family(NUMPY_FAMILY)
    agent_dir = render_candidate(fam, dict(fam.defaults, algorithm="recurrent", contract="matmul"),
                                 tmp_path / "scratch")
    agent, _ = pop.add_candidate(NewCandidate(workload_id=wid, origin="agent", digest=agent_dir.name,
                                              directory=str(agent_dir), name="agent-loop"))
    proc = subprocess.Popen(evolve_cmd("run", str(cfg), "--remote", first.url, "--db", db_url),
                            cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def in_bench():
            try:
                wid = pop.workload_id("forward_cpu_small")
            except KeyError:
                return None
            running = [e for e in pop.evaluations_of(wid, status="running") if e.stage == "bench"]
            return running[0] if running else None

        victim = wait_for(lambda: in_bench() or proc.poll() is not None, timeout=60, interval=0.05,
                          what="a bench in flight")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        crash(first)
        time.sleep(1.5)                                 # the run sees connection refused meanwhile
        second = ServerProcess(args).start()
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        first.stop()
        if second is not None:
            second.stop()
    assert proc.returncode == 0, err[-3000:]
    evs = pop.evaluations_of(wid)
    assert not [e for e in evs if e.failure_kind == "transport"], [e.message for e in evs if e.failure_kind]
    after = pop.evaluation(victim.id)
    assert after.status == "passed"                   # the same row, finished once, after the restart
    assert after.server_instance == second.instance_id != first.instance_id
    benches = [e for e in evs if e.stage == "bench"]
    assert len(benches) == 2 and all(e.status == "passed" for e in benches)
    assert pop.runs(wid)[-1].state == "finished"
    seed = next(c for c in pop.candidates(wid) if c.operator == "seed")
    assert evs[0].candidate_id == agent.id                        # the agent's candidate went first
    assert {e.candidate_id for e in benches} == {agent.id, seed.id}
