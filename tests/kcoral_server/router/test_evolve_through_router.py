"""`evolve run` through the released router over two of our CPU nodes: a node is killed
mid-stage (its stage is recorded as an unknown outcome and retried once, nothing is lost)
and later the router crashes and comes back (the run waits and goes on).

Runtime: about 45 s on 2 cores (more on a loaded machine)."""
from __future__ import annotations

import json
import subprocess
import time

from tests.evolve.search.helpers import cli_env, evolve_cmd, population, wait_for, write_config
from tests.kcoral_server.router.routerproc import RouterProcess, kill_server, our_node


def test_run_spreads_over_nodes_and_survives_a_node_and_a_router_crash(router_binary, tmp_path):
    router = RouterProcess(router_binary).start()
    nodes = []
    proc = None
    try:
        nodes = [our_node(router, "cpu-a"), our_node(router, "cpu-b")]
        router.wait_capacity(2)
        cfg = write_config(tmp_path, max_evals=2, confirm_runs=1, gputest=False, concurrency=0,
                           fixed='{ algorithm = "chunked", dtype = "float32" }', subspace='{ chunk = [16, 32] }')
        db_url = f"sqlite:///{tmp_path / 'evolve.db'}"
        pop = population(db_url)
        proc = subprocess.Popen(evolve_cmd("run", str(cfg), "--remote", router.url, "--db", db_url, "--json"),
                                cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

        def bench_running_on_a_node():
            if proc.poll() is not None:
                return True
            try:
                wid = pop.workload_id("forward_cpu_small")
            except KeyError:
                return None
            if not [e for e in pop.evaluations_of(wid, status="running") if e.stage == "bench"]:
                return None
            return next((n for n in nodes if n.health()["active_requests"]), None)

        victim = wait_for(bench_running_on_a_node, timeout=90, interval=0.05, what="a bench on a node")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        kill_server(victim)                                   # a crashed node, mid-request
        survivor = next(n for n in nodes if n is not victim)
        wid = pop.workload_id("forward_cpu_small")
        lost = wait_for(lambda: next((e for e in pop.evaluations_of(wid)
                                      if (e.metrics or {}).get("outcome_unknown")), None) or proc.poll() is not None,
                        timeout=60, interval=0.1, what="the lost stage recorded")
        assert proc.poll() is None, proc.communicate()[1][-3000:]

        # Later in the run (once the lost stage's retry passed, so that one stage is not hit
        # twice) the router crashes and comes back on its port.
        wait_for(lambda: any(e.retry_of == lost.id and e.status == "passed" for e in pop.evaluations_of(wid))
                 or proc.poll() is not None, timeout=90, interval=0.1, what="the lost stage's retry")
        time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()[1][-3000:]   # the run is still going
        router.kill()
        time.sleep(1.5)                                       # the run sees connection refused meanwhile
        router.start()
        out, err = proc.communicate(timeout=240)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.communicate()
        for n in nodes:
            n.stop()
        router.kill()
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out[out.index("{"):])["summary"]
    evs = pop.evaluations_of(wid)
    # The lost stage: failed as transport with the outcome unknown, retried once as a new row.
    # The router's crash may have caught stages in flight too: each is recorded the same way.
    unknown = [e for e in evs if (e.metrics or {}).get("outcome_unknown")]
    assert lost.id in {e.id for e in unknown}
    for u in unknown:
        assert u.status == "failed" and u.failure_kind == "transport" and "outcome" in u.message.lower()
        retries = [e for e in evs if e.retry_of == u.id]
        assert len(retries) == 1 and retries[0].status == "passed" and retries[0].stage == u.stage
    # Nothing else failed, every stage says which node ran it, and the run finished its budget.
    assert {e.id for e in evs if e.status != "passed"} == {e.id for e in unknown}, \
        [(e.id, e.stage, e.message) for e in evs if e.status != "passed"]
    benches = [e for e in evs if e.stage in ("bench", "confirm") and e.status == "passed"]
    assert benches and all((e.metrics or {}).get("node") in ("cpu-a", "cpu-b") for e in benches)
    checks = [e for e in evs if e.stage == "check" and e.status == "passed"]
    assert checks and all((e.metrics or {}).get("node") in ("cpu-a", "cpu-b") for e in checks)  # the import probe
    assert pop.runs(wid)[-1].state == "finished" and summary["evaluated"] >= 2
    assert survivor.instance_id in {e.server_instance for e in benches}
