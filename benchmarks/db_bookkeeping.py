"""The orchestrator's database bookkeeping per evaluation, on SQLite and on PostgreSQL.

One "evaluation" here is every population call `evolve run` makes for one candidate of a
GPU config (check, gputest, bench) that is not promoted: look for waiting registrations
(claim_next), register and claim the proposal in one transaction (add_and_claim), finish check,
begin and finish gputest and bench, read the candidate for its job, the promoter's
best() and bench_speedup(), the loop's refresh of the best, and one worker heartbeat.
Then the same from W processes at once on one shared run (as W `evolve run --join`
processes would do), for the aggregate rate and the latency each sees. Prints tables.

    python benchmarks/db_bookkeeping.py [--repeat 200] [--writers 1,4,8] [--seconds 10]
                                        [--backends sqlite,postgresql] [--pg-url URL]

PostgreSQL is a throwaway server on loopback (tests/pgserver.py: durability off, as the
SQLite file runs with synchronous=NORMAL in WAL), unless --pg-url names one.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from evolve.db import open_database  # noqa: E402
from evolve.population import NewCandidate, Population, StageResult  # noqa: E402

STEPS = ("claim_next (none waiting)", "add_and_claim (proposal + check)", "finish_stage (check)",
         "begin_stage + finish_stage (gputest)", "begin_stage + finish_stage (bench)", "candidate (job)",
         "best + bench_speedup (promoter)", "best + evaluations (refresh)", "heartbeat_worker")


class Bookkeeper:
    """One orchestrator process's population calls, timed step by step."""

    def __init__(self, url: str, tag: str) -> None:
        self.pop = Population(open_database(url))
        self.wid = self.pop.ensure_workload("bench_workload", "kcoral/workloads/kda/bench_workload")
        runs = [r for r in self.pop.runs(self.wid) if r.state == "running"]
        self.run = runs[0].id if runs else self.pop.start_run(self.wid, {}, "benchmark")
        self.worker = self.pop.join_run(self.run)
        self.tag = tag
        self.n = 0

    def evaluation(self, steps: dict[str, list[float]] | None = None) -> None:
        pop, n = self.pop, self.n
        self.n += 1
        clock = time.perf_counter

        def step(name: str, fn: Callable[[], object]) -> object:
            t0 = clock()
            out = fn()
            if steps is not None:
                steps[name].append((clock() - t0) * 1000.0)
            return out

        step(STEPS[0], lambda: pop.claim_next(self.wid, "check", run_id=self.run, worker_id=self.worker))
        cand, _, eid = step(STEPS[1], lambda: pop.add_and_claim(NewCandidate(  # type: ignore[misc]
            workload_id=self.wid, origin="template", family="two_pass", params={"n": n, "w": self.tag},
            digest=f"{self.tag}-{n}", directory=f"gen/{self.tag}-{n}", generation=1, operator="mutate",
            run_id=self.run), "check", worker_id=self.worker))
        assert eid is not None
        step(STEPS[2], lambda: pop.finish_stage(eid, StageResult(status="passed", registers=96, spills=0)))
        for name, stage, result in ((STEPS[3], "gputest", StageResult(status="passed")),
                                    (STEPS[4], "bench", StageResult(status="passed", ms=2.0, baseline_ms=2.0,
                                                                    speedup=1.0, spread=0.01))):
            def begin_finish(stage: str = stage, result: StageResult = result) -> None:
                e = pop.begin_stage(cand.id, stage, run_id=self.run, worker_id=self.worker)
                assert e is not None and pop.finish_stage(e, result)
            step(name, begin_finish)
        step(STEPS[5], lambda: pop.candidate(cand.id))

        def promoter() -> None:
            best = pop.best(self.wid)
            if best is not None:
                pop.bench_speedup(best.candidate_id)
        step(STEPS[6], promoter)

        def refresh() -> None:
            best = pop.best(self.wid)
            if best is not None:
                pop.evaluations(best.candidate_id, "bench")
        step(STEPS[7], refresh)
        step(STEPS[8], lambda: pop.heartbeat_worker(self.worker))


def _server_cpu_s(data_dir: Path) -> float:
    """CPU seconds used so far by a local PostgreSQL server: the postmaster, its reaped
    children (exited backends) and its live children (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])

    def fields(pid: int) -> list[str]:
        text = Path(f"/proc/{pid}/stat").read_text()
        return text[text.rindex(")") + 2:].split()   # after "pid (comm) "

    own = fields(postmaster)
    total = sum(int(x) for x in own[11:15])          # utime stime cutime cstime
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != postmaster:
            try:
                f = fields(int(entry.name))
            except (OSError, ValueError):
                continue
            if int(f[1]) == postmaster:               # ppid
                total += int(f[11]) + int(f[12])
    return total / tick


class RoundTrips:
    """Statements and commits an engine sends (SQLAlchemy events: exact, and the same on
    both backends; each statement is one round trip to a PostgreSQL server)."""

    def __init__(self, engine: object) -> None:
        from sqlalchemy import event

        self.statements = self.commits = 0
        event.listen(engine, "before_cursor_execute", self._statement)
        event.listen(engine, "commit", self._commit)

    def _statement(self, *_: object) -> None:
        self.statements += 1

    def _commit(self, *_: object) -> None:
        self.commits += 1


def _seed_best(url: str) -> None:
    """A promoted best, so the promoter's and the refresh's reads find one (as in a run)."""
    keeper = Bookkeeper(url, "seed")
    keeper.evaluation()
    pop = keeper.pop
    cand = pop.candidate_by_digest(keeper.wid, "seed-0")
    assert cand is not None
    c = pop.begin_stage(cand.id, "confirm")
    assert c is not None and pop.finish_stage(c, StageResult(status="passed", speedup=1.0))
    pop.promote(cand.id, None, [c], None, None)
    pop.close()


def _writer(url: str, tag: str, seconds: float, start: object, out: object) -> None:
    keeper = Bookkeeper(url, tag)
    keeper.evaluation()  # warm: connections, statement caches
    start.wait()  # type: ignore[attr-defined]
    latencies = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        keeper.evaluation()
        latencies.append((time.perf_counter() - t0) * 1000.0)
    keeper.pop.close()
    out.put(latencies)  # type: ignore[attr-defined]


def contention(url: str, writers: int, seconds: float) -> tuple[float, float, float]:
    """(evaluations/s over all writers, median ms, p95 ms) with `writers` processes at once."""
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(url, f"w{writers}-{i}", seconds, start, out)) for i in range(writers)]
    for p in procs:
        p.start()
    time.sleep(2.0 + 0.5 * writers)  # imports and the warm-up evaluation
    start.set()
    samples = [x for _ in procs for x in out.get(timeout=seconds + 300)]
    for p in procs:
        p.join(timeout=60)
    samples.sort()
    return len(samples) / seconds, statistics.median(samples), samples[int(0.95 * (len(samples) - 1))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=200, help="evaluations timed step by step, one process")
    ap.add_argument("--writers", default="1,4,8", help="process counts for the contention table")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each contention measurement")
    ap.add_argument("--backends", default="sqlite,postgresql")
    ap.add_argument("--pg-url", help="an existing PostgreSQL database (default: a throwaway server)")
    args = ap.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    writer_counts = [int(w) for w in args.writers.split(",") if w.strip()]   # "" for none
    tmp = tempfile.TemporaryDirectory()
    server = None
    urls: dict[str, str] = {}
    try:
        for backend in backends:
            if backend == "sqlite":
                urls[backend] = f"sqlite:///{Path(tmp.name) / 'bookkeeping.db'}"
            elif backend == "postgresql":
                if args.pg_url:
                    urls[backend] = args.pg_url
                else:
                    from tests.pgserver import TemporaryPostgres

                    server = TemporaryPostgres().start()
                    urls[backend] = server.create_database("bookkeeping")
            else:
                raise SystemExit(f"unknown backend {backend!r}")

        print(f"# python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} cpus, "
              f"load average {os.getloadavg()[0]:.1f}")
        per_step: dict[str, dict[str, list[float]]] = {}
        totals: dict[str, list[float]] = {}
        loads: dict[str, tuple[float, float | None, float, float]] = {}
        for backend, url in urls.items():
            _seed_best(url)
            keeper = Bookkeeper(url, f"one-{backend}")
            for _ in range(10):
                keeper.evaluation()  # warm
            steps: dict[str, list[float]] = {name: [] for name in STEPS}
            whole = []
            local = backend == "postgresql" and server is not None
            trips = RoundTrips(keeper.pop.db.engine)
            cpu0, srv0 = time.process_time(), _server_cpu_s(server.data) if local else 0.0  # type: ignore[union-attr]
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                keeper.evaluation(steps)
                whole.append((time.perf_counter() - t0) * 1000.0)
            client_ms = (time.process_time() - cpu0) * 1000.0 / args.repeat
            server_ms = ((_server_cpu_s(server.data) - srv0) * 1000.0 / args.repeat  # type: ignore[union-attr]
                         if local else None)
            loads[backend] = (client_ms, server_ms, trips.commits / args.repeat, trips.statements / args.repeat)
            per_step[backend], totals[backend] = steps, whole
            keeper.pop.close()

        print()
        print("| step (one process) | " + " | ".join(f"{b} median ms" for b in urls) + " |")
        print("|---|" + "---:|" * len(urls))
        for name in STEPS:
            print(f"| {name} | " + " | ".join(f"{statistics.median(per_step[b][name]):.2f}" for b in urls) + " |")
        print("| **per evaluation** (median; p95) | " + " | ".join(
            f"**{statistics.median(totals[b]):.1f}**; {sorted(totals[b])[int(0.95 * (len(totals[b]) - 1))]:.1f}"
            for b in urls) + " |")
        print("| client CPU ms per evaluation (evolve's process) | " + " | ".join(
            f"{loads[b][0]:.1f}" for b in urls) + " |")
        print("| database server CPU ms per evaluation | " + " | ".join(
            "(in the client)" if loads[b][1] is None else f"{loads[b][1]:.1f}" for b in urls) + " |")
        print("| transactions per evaluation | " + " | ".join(f"{loads[b][2]:.1f}" for b in urls) + " |")
        print("| SQL statements per evaluation (with BEGIN, COMMIT) | " + " | ".join(
            f"{loads[b][3]:.1f}" for b in urls) + " |")

        print()
        print("| writers (processes on one run) | backend | evaluations/s (all) | median ms | p95 ms |")
        print("|---:|---|---:|---:|---:|")
        for backend, url in urls.items():
            for w in writer_counts:
                rate, med, p95 = contention(url, w, args.seconds)
                print(f"| {w} | {backend} | {rate:.1f} | {med:.1f} | {p95:.1f} |", flush=True)
    finally:
        if server is not None:
            server.stop()
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
