"""`evolve run --resume` after a SIGKILL of `evolve run` in the middle of a stage, after a
SIGTERM, and after a run whose server went away for good in the middle of a bench."""
from __future__ import annotations

import json
import signal
import subprocess

from evolve.embedded import free_port
from tests.evolve.search.helpers import (cli_env, crash, evolve_cmd, population, run_cli, run_until_a_bench, wait_for,
                                        write_config)
from tests.serverproc import ServerProcess

REMOTE_STAGES = ("gputest", "bench", "confirm")


def test_sigkill_mid_stage_then_resume(tmp_path, cpu_server):
    cfg = write_config(tmp_path, max_evals=3, confirm_runs=1,
                       fixed='{ algorithm = "chunked" }', subspace='{ chunk = [8, 16, 32] }')
    db_url = f"sqlite:///{tmp_path / 'evolve.db'}"
    proc = subprocess.Popen(evolve_cmd("run", str(cfg), "--remote", cpu_server.url, "--db", db_url),
                            cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        pop = population(db_url)

        def mid_stage():
            # A confirmed best exists and another candidate is inside a server stage.
            try:
                wid = pop.workload_id("forward_cpu_small")
                best = pop.best(wid)
                if best is None:
                    return None
                running = [e for e in pop.evaluations_of(wid, status="running")
                           if e.stage in REMOTE_STAGES and e.candidate_id != best.candidate_id]
                return running[0] if running else None
            except KeyError:
                return None

        victim = wait_for(mid_stage, timeout=90, interval=0.05, what="a stage in flight after a promotion")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)   # reap it: a zombie's pid would still look alive
    assert proc.returncode == -signal.SIGKILL

    wid = pop.workload_id("forward_cpu_small")
    finished_before = {e.id: (e.status, e.ms) for e in pop.evaluations_of(wid) if e.status in ("passed", "failed")}
    confirmed_before = {r.candidate_id: r.speedup for r in pop.leaderboard(wid) if r.confirmed}
    best_before = pop.best(wid).candidate_id
    assert confirmed_before and pop.evaluation(victim.id).status == "running"
    # every pipeline stage in flight at the kill (often two or three: the server has two
    # workers), each owed a retry even though the resumed run may start only one new pipeline
    in_flight = [e for e in pop.evaluations_of(wid, status="running") if e.stage != "confirm"]

    resumed = run_cli("run", str(cfg), "--remote", cpu_server.url, "--db", db_url, "--resume", "--max-evals", "1",
                      cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    # the interrupted evaluation is marked so, and retried as a new attempt with its lineage
    assert pop.evaluation(victim.id).status == "interrupted"
    retries = [e for e in pop.evaluations(victim.candidate_id, victim.stage) if e.retry_of == victim.id]
    assert len(retries) == 1 and retries[0].status in ("passed", "failed"), (
        victim.stage, [(e.id, e.stage, e.status, e.retry_of) for e in pop.evaluations(victim.candidate_id)],
        resumed.stderr[-2000:])
    assert retries[0].attempt == victim.attempt + 1
    for ev in in_flight:
        again = [e for e in pop.evaluations(ev.candidate_id, ev.stage) if e.retry_of == ev.id]
        assert len(again) == 1 and again[0].status in ("passed", "failed"), (ev.stage, len(in_flight))
    # no finished evaluation was repeated or changed
    after = pop.evaluations_of(wid)
    for eid, state in finished_before.items():
        assert (pop.evaluation(eid).status, pop.evaluation(eid).ms) == state
    for cand in {e.candidate_id for e in after}:
        for stage in ("check", "gputest", "bench"):
            done = [e for e in pop.evaluations(cand, stage) if e.status in ("passed", "failed")]
            assert len(done) <= 1, (cand, stage, done)
    # confirmed entries of the leaderboard are unchanged
    confirmed_after = {r.candidate_id: r.speedup for r in pop.leaderboard(wid) if r.confirmed}
    for cid, speedup in confirmed_before.items():
        assert confirmed_after[cid] == speedup
    runs = pop.runs(wid)
    assert runs[0].state == "interrupted" and runs[-1].state == "finished"
    assert runs[-1].config["resumed_from"] == runs[0].id
    assert pop.best(wid).candidate_id in confirmed_after and best_before in confirmed_after


def test_sigterm_stops_gracefully_and_marks_the_run_interrupted(tmp_path, cpu_server):
    proc, pop, victim = run_until_a_bench(tmp_path, cpu_server)
    try:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err[-2000:]
    assert "--resume" in err
    wid = pop.workload_id("forward_cpu_small")
    assert pop.runs(wid)[-1].state == "interrupted"
    assert pop.evaluation(victim.id).status in ("passed", "failed")   # the stage in flight was finished
    assert not pop.evaluations_of(wid, status="running")



def test_resume_benches_again_what_the_server_failed(tmp_path):
    """A bench the server never judged (it died, and stayed away past the transport wait:
    kind `transport`, one of the server's kinds) is owed, not a verdict: the candidate, the
    run's seed, would otherwise be lost to the search. Once a server is back, `--resume`
    benches it again as a new attempt with its lineage; the stages it passed are not rerun."""
    args = ["--cpu-workers", "2", "--port", str(free_port())]
    first = ServerProcess(args).start()
    second = proc = None
    try:
        proc, pop, _ = run_until_a_bench(tmp_path, first, max_evals=1, transport_wait_s=3)
        crash(first)   # and no server comes back within the wait
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        wid = pop.workload_id("forward_cpu_small")
        (lost,) = [e for e in pop.evaluations_of(wid) if e.stage == "bench"]
        assert (lost.status, lost.failure_kind) == ("failed", "transport"), lost.message
        check_before = [(e.id, e.status) for e in pop.evaluations(lost.candidate_id, "check")]

        second = ServerProcess(args).start()
        resumed = run_cli("run", str(tmp_path / "run.toml"), "--remote", second.url, "--db",
                          f"sqlite:///{tmp_path / 'evolve.db'}", "--resume", "--max-evals", "1",
                          "--json", cwd=tmp_path)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.communicate()
        first.stop()
        if second is not None:
            second.stop()
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert lost.id in json.loads(resumed.stdout)["summary"]["retried"]
    benches = pop.evaluations(lost.candidate_id, "bench")
    assert [(e.status, e.retry_of, e.attempt) for e in benches] == [("failed", None, 1), ("passed", lost.id, 2)], (
        [(e.status, e.failure_kind, e.message[:200]) for e in benches])
    assert benches[1].speedup and benches[1].speedup > 0
    assert [(e.id, e.status) for e in pop.evaluations(lost.candidate_id, "check")] == check_before   # not run again
    assert pop.evaluation(lost.id).failure_kind == "transport"                                       # history kept
