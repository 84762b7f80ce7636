"""Shared pieces of the run tests: a config writer, a CLI runner, DB polling."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from evolve.db import open_database
from evolve.population import Population
from tests.evolve.search.conftest import REPO

WORKLOAD = REPO / "kcoral" / "workloads" / "kda" / "forward_cpu_small"


def write_config(tmp: Path, *, max_evals: int = 4, confirm_runs: int = 1, margin: float = 0.05,
                 subspace: str = "", fixed: str = "", gputest: bool = True, seed: int = 3,
                 concurrency: int = 1, kind: str = "evolution") -> Path:
    """A run config on the CPU twin that renders into tmp (never into the repository)."""
    text = f"""
root = "{REPO}"
workload = "kcoral/workloads/kda/forward_cpu_small"
output_dir = "{tmp / 'gen'}"

[[families]]
name = "numpy_chunked"
{('fixed = ' + fixed) if fixed else ''}
{('subspace = ' + subspace) if subspace else ''}

[strategy]
kind = "{kind}"
seed = {seed}
immigrant_share = 0.0
crossover_rate = 0.2
population_size = 4

[budget]
max_evals = {max_evals}
hours = 0.1

[stages.check]
timeout = 60
[stages.gputest]
enabled = {str(gputest).lower()}
timeout = 120
[stages.bench]
timeout = 180

[promotion]
confirm_runs = {confirm_runs}
margin = {margin}

[remote]
concurrency = {concurrency}
transport_wait_s = 90
"""
    path = tmp / "run.toml"
    path.write_text(text)
    return path


def evolve_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "evolve.cli", *args]


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    env.pop("KCORAL_REMOTE", None)
    return env


def run_cli(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(evolve_cmd(*args), cwd=cwd, env=cli_env(), capture_output=True, text=True,
                          timeout=timeout)


def population(db_url: str) -> Population:
    return Population(open_database(db_url))


def wait_for(predicate, timeout: float, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def run_until_a_bench(tmp: Path, server, stderr=subprocess.PIPE, max_evals: int = 3,
                      transport_wait_s: float | None = None):
    """(process, population, the bench evaluation in flight): an `evolve run` of a small
    chunked space (config tmp/run.toml, database tmp/evolve.db) started against `server`,
    waited on until one of its benches runs."""
    cfg = write_config(tmp, max_evals=max_evals, confirm_runs=1, gputest=False,
                       fixed='{ algorithm = "chunked", dtype = "float32" }', subspace='{ chunk = [16, 32] }')
    if transport_wait_s is not None:
        text = cfg.read_text()
        assert "transport_wait_s = 90" in text   # write_config's value, replaced here
        cfg.write_text(text.replace("transport_wait_s = 90", f"transport_wait_s = {transport_wait_s}"))
    db_url = f"sqlite:///{tmp / 'evolve.db'}"
    proc = subprocess.Popen(evolve_cmd("run", str(cfg), "--remote", server.url, "--db", db_url),
                            cwd=tmp, env=cli_env(), stdout=subprocess.PIPE if stderr is subprocess.PIPE else subprocess.DEVNULL,
                            stderr=stderr, text=True)
    pop = population(db_url)

    def in_bench():
        try:
            wid = pop.workload_id("forward_cpu_small")
        except KeyError:
            return None
        return [e for e in pop.evaluations_of(wid, status="running") if e.stage == "bench"]

    try:
        victim = wait_for(in_bench, timeout=60, interval=0.05, what="a bench in flight")[0]
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    return proc, pop, victim


def crash(server) -> None:
    """Kill a ServerProcess and its workers at once: a crash, not a graceful drain."""
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=10)
