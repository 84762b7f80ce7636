"""The run loop: propose, render, register, evaluate, promote, within budgets.

Work is taken in this order: evaluations a dead process left unfinished (of the
resumed run, or of a worker of this run whose heartbeat stopped; retried as new
attempts with `retry_of`), then candidates waiting in the population (agent
registrations), then the strategy's proposals. A candidate is claimed before its
pipeline starts (its first stage's evaluation is the claim), so several processes
working on one run (`--join`, any hosts on one database) never take the same one.
Pipelines run on a thread pool one wider than the GPU concurrency, so a CPU check
overlaps the GPU stages; the GPU stages themselves pass through the context's gate.
"""
from __future__ import annotations

import logging
import os
import random
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Callable, TextIO

from kcoral import Client
from pydantic import BaseModel, Field

from evolve.breaker import FailureBreaker
from evolve.cards import CardGuard, population_card
from evolve.config import RunConfig
from evolve.digest import SourcesChanged
from evolve.events import EventHook, EventKind
from evolve.families import Family
from evolve.leaseclock import LeaseClock
from evolve.paths import display_path
from evolve.pipeline import GpuGate, PipelineOutcome, RunStats, StageContext, run_pipeline
from evolve.population import Candidate, Evaluation, NewCandidate, Population, Run
from evolve.preflight import PreflightError, health_gpus, probe_ncu, problems, tool_problems
from evolve.promotion import Decision, Promoter
from evolve.render import RenderError, render_candidate
from evolve.run_progress import Progress
from evolve.safe_text import safe_line, safe_text
from evolve.search_view import SearchView
from evolve.strategies import Parent, SearchState, make_strategy, point_key
from evolve.strategies.base import Failed, Proposal, Strategy
from evolve.vocabulary import INFEASIBLE_KINDS, SERVER_KINDS, EvaluationStatus, FailureKind, Origin, RunState, Stage

log = logging.getLogger(__name__)

HEARTBEAT_S = 10.0
MAX_DUPLICATES = 64          # consecutive already-known proposals before the space counts as used up


class Job(BaseModel):
    candidate_id: int
    retry_of: dict[Stage, int] = Field(default_factory=dict)
    claimed: dict[Stage, int] = Field(default_factory=dict)   # stage -> evaluation this process claimed


SERVER_RETRIES = 2   # resumes that retry one candidate's stage the server lost, at most


def _lost_to_the_server(evs: list[Evaluation], stages: list[Stage]) -> Evaluation | None:
    """The candidate's last evaluation if the server lost it rather than judged it: a
    pipeline stage, or a confirmation, failed with a server kind (`SERVER_KINDS`). A run
    whose breaker tripped on a broken server ends with such candidates, its seed among
    them. Whichever run wrote it: a resumed run that stopped before it got to what it owed
    leaves it to the next resume. Not after `SERVER_RETRIES` retries lost the same way: a
    candidate that takes the server down each time it runs would otherwise open every resume."""
    last = evs[-1] if evs else None
    owed = set(stages) | ({Stage.CONFIRM} if Stage.BENCH in stages else set())
    if (last is None or last.stage not in owed
            or last.status != EvaluationStatus.FAILED or last.failure_kind not in SERVER_KINDS):
        return None
    losses = sum(e.stage == last.stage and e.status == EvaluationStatus.FAILED and e.failure_kind in SERVER_KINDS
                 for e in evs)
    return last if losses <= SERVER_RETRIES else None


def _config_changes(before: dict, after: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two recorded configs (bookkeeping keys aside)."""
    out: list[str] = []
    for key in sorted(set(before) | set(after)):
        if not prefix and key in ("resumed_from", "budget"):   # a resume's budget is its own
            continue
        a, b = before.get(key), after.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _config_changes(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}")
    return out


def _bench_beats(evs: list[Evaluation], best_speedup: float | None) -> bool:
    """Whether the candidate's last passed bench beats the best's figure."""
    bench = [e.speedup for e in evs if e.stage == Stage.BENCH and e.status == EvaluationStatus.PASSED]
    return bool(bench) and bench[-1] is not None and (best_speedup is None or bench[-1] > best_speedup)


class JoinError(ValueError):
    """`--join` named no run this process can work on."""


JOIN_LATEST = "latest"


class RunSummary(BaseModel):
    run_id: int
    workload_id: int
    evaluated: int
    passed: int
    failures: dict[str, int]
    promotions: int
    best_candidate_id: int | None
    best_speedup: float | None
    stopped_because: str
    aborted: bool = False              # the circuit breaker stopped it (a setup problem, not the budget)
    gpu_busy: float | None = None     # lease-held fraction of the run's wall time per server GPU
    resumed_from: int | None = None
    retried: list[int] = Field(default_factory=list)   # evaluation ids retried on resume
    worker_id: int | None = None       # this process's worker row in the run
    joined: bool = False               # it joined a run another process started


def server_concurrency(health: dict) -> int:
    """The server's GPU worker count (its GPU leases keep timed work from overlapping, and a
    second worker per GPU overlaps one request's CPU part with another's GPU part); on a
    CPU server, its worker count."""
    workers = health.get("workers")
    if not isinstance(workers, list):
        # A router (or a stock server) lists no workers: its request capacity is the slots
        # its nodes hold, one per GPU worker (or CPU worker).
        capacity = (health.get("load") or {}).get("request_capacity")
        if isinstance(capacity, int) and not isinstance(capacity, bool) and capacity > 0:
            return capacity
        workers = []
    if int(health.get("gpu_count") or 0) > 0:
        on_gpu = [w for w in workers if isinstance(w, dict) and w.get("gpu_id") is not None]
        return max(1, len(on_gpu) or int(health["gpu_count"]))
    return max(1, len(workers))


def search_state(pop: Population, workload_id: int, tried: set, proposals: int) -> SearchState:
    """What a strategy sees, read from the population alone (so a resumed run sees what an
    uninterrupted one would): correct candidates fastest first, failed points, tried keys.
    One full read, the definition; the loop keeps a `SearchView` up to date instead, which
    hands out the same state (tests/evolve/search/test_search_view.py)."""
    # model_construct: the rows come typed from our own database.
    correct = [Parent.model_construct(id=cid, family=family, params=params, speedup=speedup, generation=generation)
               for cid, family, params, generation, speedup in pop.correct_points(workload_id)]
    ok = {p.id for p in correct}
    failed = [Failed.model_construct(id=cid, family=family, params=params, kind=kind)
              for cid, family, params, kind in pop.failed_points(workload_id, INFEASIBLE_KINDS) if cid not in ok]
    return SearchState.model_construct(correct=correct, failed=failed, tried=tried, proposal_index=proposals)


@dataclass
class _Work:
    """One process's part of a run: its setup, and the state the loop keeps between jobs."""
    workload_id: int
    run_id: int
    worker_id: int
    stages: list[Stage]
    families: dict[str, Family]
    slots: int                        # GPU concurrency; the pool is one wider (a CPU check overlaps)
    ctx: StageContext
    promoter: Promoter
    strategy: Strategy
    rng: random.Random
    jobs: list[Job]                   # owed work, taken first: retries of what dead processes left
    tried: set                        # point keys the population holds or this process proposed
    proposals: int = 0
    started_jobs: int = 0             # new pipelines started (what --max-evals counts)
    exhausted: bool = False
    started: float = 0.0              # time.monotonic() at the start
    deadline: float | None = None
    futures: dict[Future, int] = field(default_factory=dict)   # running job -> candidate id

    @property
    def stats(self) -> RunStats:
        return self.ctx.stats

    def usable(self, cand: Candidate) -> bool:
        # Processes on other hosts share the database, not necessarily the disk: a rendered
        # candidate's folder is rendered again where it is missing.
        try:
            return self.ctx.restored_dir(cand).is_dir()
        except SourcesChanged as exc:
            log.warning("%s", exc)
            return False


class SearchLoop:
    def __init__(self, config: RunConfig, client: Client, pop: Population, *, resume: bool = False,
                 stream: TextIO | None = None, progress_interval_s: float = 5.0, events: EventHook | None = None,
                 join: int | str | None = None):
        self.config = config
        self.events = events or EventHook(None)
        self.breaker = FailureBreaker(config.budget.max_same_failures)
        self.aborted: str | None = None
        self.cards = CardGuard(None, config.remote.mixed_cards)   # the population's card, once the run knows it
        self._run_id: int | None = None
        self.client = client
        self.pop = pop
        self._views: dict[int, SearchView] = {}   # per workload: the search's state, kept up to date
        self.resume = resume
        if resume and join is not None:
            raise JoinError("--resume starts a new run that finishes a dead one; --join works on a live one: pick one")
        self.join = join
        self.stream = stream or sys.stderr
        self.progress_interval_s = progress_interval_s
        self.cancel = threading.Event()

    # ---- resume ------------------------------------------------------------------------
    def _previous_run(self, workload_id: int) -> Run | None:
        for run in reversed(self.pop.runs(workload_id)):
            if not self.pop.run_alive(run):
                return run
        return None

    def _resume_jobs(self, prev: Run, stages: list[Stage]) -> tuple[list[Job], list[int]]:
        """Jobs that finish what `prev` left (interrupted stages, pipelines cut between stages,
        a bench not yet weighed for promotion), and what the server failed in any run."""
        jobs: dict[int, Job] = {}
        retried: list[int] = []
        for ev in self.pop.interrupted(prev.id, heartbeat_timeout_s=0):
            if self.pop.mark_interrupted(ev.id, f"interrupted: run {prev.id} died; retried by a resumed run"):
                jobs.setdefault(ev.candidate_id, Job(candidate_id=ev.candidate_id)).retry_of[ev.stage] = ev.id
                retried.append(ev.id)
        if prev.state == RunState.RUNNING:
            self.pop.finish_run(prev.id, RunState.INTERRUPTED, dead=True)
        best = self.pop.best(prev.workload_id)
        best_speedup = self.pop.bench_speedup(best.candidate_id) if best else None
        families = {f.name for f in self.config.families}
        for cand in self.pop.candidates(prev.workload_id):
            if cand.id in jobs:
                continue
            evs = self.pop.evaluations(cand.id)
            lost = _lost_to_the_server(evs, stages)
            # Never judged: the server failed it (fixed since, one hopes). Owed only where this
            # config still searches its family (agents' candidates have none), and a
            # confirmation only while the bench still beats the best (else promotion would not try).
            in_config = cand.family is None or cand.family in families
            if (lost is not None and in_config
                    and (lost.stage != Stage.CONFIRM or _bench_beats(evs, best_speedup))):
                jobs[cand.id] = Job(candidate_id=cand.id, retry_of={lost.stage: lost.id})
                retried.append(lost.id)
                continue
            # A failure a later attempt retried is history, not the candidate's standing.
            replaced = {e.retry_of for e in evs if e.retry_of is not None}
            unfinished = any(e.status in (EvaluationStatus.FAILED, EvaluationStatus.RUNNING)
                             for e in evs if e.id not in replaced)
            if not any(e.run_id == prev.id for e in evs) or unfinished:
                continue
            passed = {e.stage for e in evs if e.status == EvaluationStatus.PASSED}
            if not set(stages) <= passed:
                jobs[cand.id] = Job(candidate_id=cand.id)        # cut between stages
            elif (Stage.BENCH in stages and not any(e.stage == Stage.CONFIRM for e in evs)
                  and _bench_beats(evs, best_speedup)):
                # Benched, then died before promotion was considered: only worth a job if it
                # beats the best (the pipeline itself is all skips).
                jobs[cand.id] = Job(candidate_id=cand.id)
        return list(jobs.values()), retried

    def _run_to_join(self, workload_id: int, join: int | str) -> int:
        """The live run `join` names (a run id, or the workload's newest live run)."""
        if join == JOIN_LATEST:
            for live in reversed(self.pop.runs(workload_id)):
                if self.pop.run_alive(live):
                    return live.id
            raise JoinError(f"no live run of workload {self.config.workload_name!r} to join; "
                            "start one with `evolve run` (without --join)")
        run = self.pop.run(int(join))
        if run is None:
            raise JoinError(f"no run {join} in the database")
        if run.workload_id != workload_id:
            raise JoinError(f"run {run.id} searches another workload (id {run.workload_id}), "
                            f"not {self.config.workload_name!r}")
        if not self.pop.run_alive(run):
            raise JoinError(f"run {run.id} is not alive (state {run.state}); `evolve run --resume` continues a dead run")
        return run.id

    def _reclaim(self, run_id: int, worker_id: int, usable: Callable[[Candidate], bool]) -> list[Job]:
        """Jobs that retry what workers of this run left when their lease ran out (each
        row is marked interrupted compare-and-set, so one survivor retries it). A
        candidate whose folder this host cannot see is left to a process that can."""
        jobs: dict[int, Job] = {}
        for ev in self.pop.interrupted(run_id):
            if ev.worker_id is None or ev.worker_id == worker_id:
                continue
            cand = self.pop.candidate(ev.candidate_id)
            if cand is None or not usable(cand):
                continue
            if self.pop.mark_interrupted(ev.id, f"interrupted: worker {ev.worker_id} of run {run_id} stopped "
                                                f"beating; retried by worker {worker_id}"):
                jobs.setdefault(ev.candidate_id, Job(candidate_id=ev.candidate_id)).retry_of[ev.stage] = ev.id
        return list(jobs.values())

    # ---- the search state --------------------------------------------------------------
    def _state(self, workload_id: int, tried: set, proposals: int) -> SearchState:
        view = self._views.get(workload_id)
        if view is None:
            view = self._views[workload_id] = SearchView(self.pop, workload_id)
        return view.state(tried, proposals)

    def _register(self, families: dict[str, Family], proposal: Proposal, workload_id: int, run_id: int, worker_id: int,
                  stage: Stage) -> tuple[Candidate, int | None] | None:
        """Render and store a proposal, claimed for this process in the same transaction:
        (candidate, its first stage's evaluation, or None if it was known and evaluated)."""
        family = families[proposal.family]
        try:
            directory = render_candidate(family, proposal.params, self.config.gen_dir)
        except RenderError as exc:
            log.error("render failed: %s", exc)
            return None
        cand, _created, eid = self.pop.add_and_claim(NewCandidate(
            workload_id=workload_id, origin=Origin.SEED if proposal.operator == "seed" else Origin.TEMPLATE,
            family=family.name, params=proposal.params, digest=directory.name,
            directory=display_path(directory), parents=proposal.parents, generation=proposal.generation,
            operator=proposal.operator, run_id=run_id), stage, worker_id=worker_id)
        return cand, eid

    # ---- the loop ----------------------------------------------------------------------
    def run(self) -> RunSummary:
        cfg = self.config
        families = cfg.load_families()
        stages = cfg.enabled_stages()
        workload_id = self.pop.ensure_workload(cfg.workload_name, display_path(cfg.workload_dir))
        health = self.client.health()
        slots = cfg.remote.concurrency or server_concurrency(health)
        self._preflight(health, families)
        prev, jobs, retried = self._resume_previous(workload_id, stages)
        run_id, worker_id = self._enter_run(workload_id, prev)
        work = self._start_work(families, stages, workload_id, run_id, worker_id, slots, jobs)
        lease_clock = LeaseClock(lambda: self.client.health(retry=False, timeout_s=2.0))
        lease_clock.start(health)
        progress = Progress(self.stream, slots, self.progress_interval_s,
                            has_gpu=health_gpus(health) > 0, lease_clock=lease_clock)
        self._refresh_best(workload_id, work.stats)

        stopped = self._drive(work, progress)

        stats = work.stats
        best = self.pop.best(workload_id)
        self.events.emit(EventKind.ABORT if self.aborted else EventKind.FINISH, run_id=run_id,
                         workload=cfg.workload_name, reason=stopped, evaluated=stats.evaluated,
                         passed=stats.passed, failures=dict(stats.failures), promotions=stats.promotions,
                         best_candidate_id=best.candidate_id if best else None, best_speedup=stats.best_speedup)
        return RunSummary(aborted=self.aborted is not None, run_id=run_id, workload_id=workload_id,
                          evaluated=stats.evaluated, passed=stats.passed,
                          failures=dict(stats.failures), promotions=stats.promotions,
                          best_candidate_id=best.candidate_id if best else None, best_speedup=stats.best_speedup,
                          stopped_because=stopped, resumed_from=prev.id if prev else None, retried=retried,
                          worker_id=worker_id, joined=self.join is not None,
                          gpu_busy=lease_clock.sample() if progress.has_gpu else None)

    def _preflight(self, health: dict, families: dict[str, Family]) -> None:
        cfg = self.config
        found = problems(cfg, health, families) or tool_problems(cfg, health, families,
                                                                 lambda: probe_ncu(self.client))
        if found:  # before any run or candidate is recorded: nothing to clean up
            self.events.emit(EventKind.ABORT, run_id=None, workload=cfg.workload_name,
                             reason="preflight: " + "; ".join(found))
            raise PreflightError(found)

    def _resume_previous(self, workload_id: int, stages: list[Stage]) -> tuple[Run | None, list[Job], list[int]]:
        """With --resume: the dead run to finish, the jobs it left and the evaluations retried."""
        prev = self._previous_run(workload_id) if self.resume else None
        if self.resume and prev is None:
            self.stream.write("evolve: nothing to resume for this workload; starting a new run\n")
        if prev is None:
            return None, [], []
        changed = _config_changes(prev.config, self.config.to_record())
        if changed:
            # A resume reads the config of its own command line, not the run's: a stage turned
            # off by `--set` last time and on now would be owed for every candidate benched.
            self.stream.write(f"evolve: note: this config differs from run {prev.id}'s in "
                              f"{', '.join(changed[:8])}{' ...' if len(changed) > 8 else ''} "
                              "(a resume uses the config and --set given now)\n")
        jobs, retried = self._resume_jobs(prev, stages)
        return prev, jobs, retried

    def _enter_run(self, workload_id: int, prev: Run | None) -> tuple[int, int]:
        """(run, this process's worker row): the run --join names, else a new one."""
        if self.join is not None:
            run_id = self._run_to_join(workload_id, self.join)
            try:
                worker_id = self.pop.join_run(run_id)
            except ValueError as exc:   # its last worker left since we looked
                raise JoinError(str(exc)) from None
        else:
            record = self.config.to_record() | {"resumed_from": prev.id if prev else None}
            run_id = self.pop.start_run(workload_id, record, self.config.strategy.kind)
            worker_id = self.pop.join_run(run_id)
        self._run_id = run_id
        return run_id, worker_id

    def _start_work(self, families: dict[str, Family], stages: list[Stage], workload_id: int, run_id: int,
                    worker_id: int, slots: int, jobs: list[Job]) -> _Work:
        cfg = self.config
        ctx = StageContext(client=self.client, pop=self.pop, workload_id=workload_id,
                           workload_dir=cfg.workload_dir, run_id=run_id, stages=cfg.stages, families=families,
                           gate=GpuGate(self.client, slots, cfg.remote.max_queue),
                           transport_wait_s=cfg.remote.transport_wait_s, root_dir=cfg.root_dir, stats=RunStats(),
                           cancel=self.cancel, worker_id=worker_id, screen_benches=True)
        work = _Work(workload_id=workload_id, run_id=run_id, worker_id=worker_id, stages=stages,
                     families=families, slots=slots, ctx=ctx, promoter=Promoter(ctx, cfg.promotion),
                     strategy=make_strategy(cfg.strategy, families),
                     # A joined process draws its own proposals, not the same ones as the run's first.
                     rng=random.Random(f"{cfg.strategy.seed}:{run_id}"
                                       + (f":{worker_id}" if self.join is not None else "")),
                     jobs=jobs,
                     # Every point the population already holds counts as tried: a resumed run (or a
                     # second run on the same database) does not spend a proposal on it again.
                     tried={point_key(family, params) for family, params in self.pop.family_points(workload_id)})
        if self.join is not None:
            work.jobs.extend(self._reclaim(run_id, worker_id, work.usable))
        self.cards.card = population_card(self.pop, workload_id)
        work.started = time.monotonic()
        work.deadline = self._deadline(work.started)
        return work

    def _job(self, work: _Work, job: Job) -> tuple[PipelineOutcome, Decision | None]:
        """One candidate's pipeline and, if its bench passed, its promotion decision (a worker thread)."""
        cand = self.pop.candidate(job.candidate_id)
        assert cand is not None
        outcome = run_pipeline(work.ctx, cand, work.stages, job.retry_of, job.claimed)
        decision = None
        if outcome.passed and outcome.bench is not None and Stage.BENCH in work.stages:
            decision = work.promoter.consider(cand, outcome.bench, retry_of=job.retry_of.get(Stage.CONFIRM))
        return outcome, decision

    def _next_job(self, work: _Work) -> Job | None:
        """Owed work first, then a candidate waiting in the population, then a new proposal;
        None when there is none now (`work.exhausted` says whether there will be)."""
        if work.jobs:
            return work.jobs.pop(0)
        if not work.stages:   # nothing to evaluate a candidate with, so nothing to claim
            work.exhausted = True
            return None
        first = work.stages[0]
        waiting = self.pop.claim_next(work.workload_id, first, run_id=work.run_id, worker_id=work.worker_id,
                                      usable=work.usable)
        if waiting is not None:
            return Job(candidate_id=waiting[0].id, claimed={first: waiting[1]})
        duplicates = 0
        while duplicates < MAX_DUPLICATES:
            proposal = work.strategy.propose(self._state(work.workload_id, work.tried, work.proposals), work.rng)
            if proposal is None:
                work.exhausted = True
                return None
            work.proposals += 1
            work.tried.add(proposal.key)
            registered = self._register(work.families, proposal, work.workload_id, work.run_id, work.worker_id,
                                        first)
            if registered is None:
                work.stats.failures["render"] += 1
                duplicates += 1  # a broken template must not spin this loop
                continue
            cand, eid = registered
            work.tried.add(point_key(cand.family or "", cand.params))
            if eid is not None:
                return Job(candidate_id=cand.id, claimed={first: eid})
            duplicates += 1
        work.exhausted = not work.futures  # nothing new nearby and nothing running: the space is used up
        return None

    def _fill(self, work: _Work, executor: ThreadPoolExecutor) -> None:
        """Start jobs until the pool is full, the budget is spent or there is none now."""
        while len(work.futures) < work.slots + 1:
            owed = bool(work.jobs)
            job = self._next_job(work)
            if job is None:
                break
            if not owed:
                work.started_jobs += 1
            work.futures[executor.submit(self._job, work, job)] = job.candidate_id
            with work.stats.lock:
                work.stats.in_flight = len(work.futures)
            if self._budget_left(work.started_jobs, work.started, work.deadline, owed=bool(work.jobs)) is not None:
                break

    def _drive(self, work: _Work, progress: Progress) -> str:
        """Run jobs on a thread pool until the budget is spent or the space used up; leaves
        the run on the way out (however it ends). Returns why it stopped."""
        executor = ThreadPoolExecutor(max_workers=work.slots + 1, thread_name_prefix="evolve-stage")
        try:
            stopped = self._pump(work, executor, progress)
        except KeyboardInterrupt:
            self._interrupted(work, executor, progress)
            raise
        except BaseException:
            self.cancel.set()
            executor.shutdown(wait=True, cancel_futures=True)
            self.pop.leave_run(work.worker_id, RunState.FAILED)
            raise
        executor.shutdown(wait=True)
        # The run ends when its last live worker leaves; until then the others go on.
        self.pop.leave_run(work.worker_id, RunState.FAILED if self.aborted else RunState.FINISHED)
        progress.close(work.stats)
        return stopped

    def _pump(self, work: _Work, executor: ThreadPoolExecutor, progress: Progress) -> str:
        stats = work.stats
        stopped = "budget"
        last_beat = time.monotonic()
        while True:
            reason = self._budget_left(work.started_jobs, work.started, work.deadline, owed=bool(work.jobs))
            if reason is None and not work.exhausted:
                self._fill(work, executor)
            elif reason is not None:
                stopped = reason
            if not work.futures:
                if work.exhausted:
                    stopped = "search space exhausted"
                return stopped
            done, _ = wait(list(work.futures), timeout=0.5, return_when=FIRST_COMPLETED)
            for fut in done:
                work.futures.pop(fut)
                self._account(fut, stats)
            if done:
                self._refresh_best(work.workload_id, stats)
            with stats.lock:
                stats.in_flight = len(work.futures)
            if time.monotonic() - last_beat > HEARTBEAT_S:
                if not self.pop.heartbeat_worker(work.worker_id):
                    log.warning("worker %s of run %s had left the run; its heartbeat was not renewed",
                                work.worker_id, work.run_id)
                work.jobs.extend(self._reclaim(work.run_id, work.worker_id, work.usable))
                last_beat = time.monotonic()
            progress.update(stats)

    def _interrupted(self, work: _Work, executor: ThreadPoolExecutor, progress: Progress) -> None:
        """Ctrl-C: finish the stages in flight (a second Ctrl-C abandons them) and leave the run."""
        self.cancel.set()
        # Marked first: if the user abandons the stages in flight, --resume retries them.
        # (A run other live processes work on goes on; this one keeps its lease while
        # its stages finish.)
        self.pop.leave_run(work.worker_id, RunState.INTERRUPTED, still_working=True)
        progress.close(work.stats, sample=False)
        if work.futures:
            self.stream.write(f"evolve: interrupted; finishing {len(work.futures)} stage(s) in flight "
                              "(interrupt again to abandon them; --resume retries them)\n")
            self.stream.flush()
        try:
            executor.shutdown(wait=True, cancel_futures=True)
        except KeyboardInterrupt:
            self.stream.write("evolve: abandoned the stages in flight (the server cancels their programs; "
                              "--resume retries them)\n")
            self.stream.flush()
            # Exiting closes every connection, which is what makes the server cancel the
            # programs (not Client.abort(): its threads would wake and record a failure
            # first). Their rows stay "running" in this interrupted run: --resume marks
            # them interrupted and retries them; no thread lives to record a result.
            # (A normal exit would wait for worker threads blocked in HTTP calls.)
            try:
                self.pop.checkpoint()   # nothing closes the database on the way out
            except Exception:  # leaving anyway: the write-ahead log still holds it all
                log.warning("could not checkpoint the database on the way out", exc_info=True)
            os._exit(130)
        self.pop.leave_run(work.worker_id, RunState.INTERRUPTED)

    # ---- helpers -----------------------------------------------------------------------
    def _deadline(self, started: float) -> float | None:
        limits = []
        if self.config.budget.hours is not None:
            limits.append(started + self.config.budget.hours * 3600.0)
        if self.config.budget.deadline is not None:
            left = (self.config.budget.deadline - datetime.now(UTC)).total_seconds()
            limits.append(started + left)
        return min(limits) if limits else None

    def _budget_left(self, started_jobs: int, started: float, deadline: float | None, *,
                     owed: bool = False) -> str | None:
        """None while there is budget for another pipeline, else why not. `owed`: the next
        job finishes a dead run's work (a resumed retry), which --max-evals does not count;
        the time budget still applies."""
        if self.aborted is not None:
            return f"aborted after {self.aborted}"
        if self.cancel.is_set():
            return "cancelled"
        max_evals = self.config.budget.max_evals
        if not owed and max_evals is not None and started_jobs >= max_evals:
            return f"max_evals={max_evals} reached"
        if deadline is not None and time.monotonic() >= deadline:
            return "time budget spent"
        return None

    def _account(self, fut: Future, stats: RunStats) -> None:
        try:
            outcome, decision = fut.result()
        except Exception as exc:  # a bug, not a candidate failure: keep the run going, say so
            log.exception("pipeline crashed")
            with stats.lock:
                stats.evaluated += 1
                stats.failures["internal"] += 1
            self.stream.write(safe_text(f"evolve: pipeline error: {type(exc).__name__}: {exc}") + "\n")
            self._trip(self.breaker.record_failure("internal", f"{type(exc).__name__}: {exc}"))
            return
        with stats.lock:
            if not outcome.skipped:
                stats.evaluated += 1
            if outcome.passed:
                stats.passed += 1
            elif outcome.failure_kind:
                stats.failures[outcome.failure_kind] += 1
            if decision is not None and decision.promoted:
                stats.promotions += 1
        mixed = self.cards.check(outcome.bench.metrics) if outcome.bench is not None else None
        if mixed is not None:   # the bench stays recorded; no new work is started
            self.stream.write(f"\nevolve: {mixed}\n")
            self._trip(mixed)
        if outcome.passed:
            self.breaker.record_success()
        elif outcome.failure_kind == FailureKind.SCREENED:
            pass   # its bench never ran: no news of the setup either way (a broken bench must still trip)
        elif outcome.failure_kind and not outcome.skipped:
            self._trip(self.breaker.record_failure(outcome.failure_kind, outcome.message))
        if decision is not None:
            verb = "promoted" if decision.promoted else "not promoted"
            # The reason quotes a failed confirmation's message: the candidate's words.
            self.stream.write(f"\nevolve: candidate {decision.candidate_id} {verb}: {safe_line(decision.reason)}\n")
            if decision.promoted:
                self.events.emit(EventKind.PROMOTION, run_id=self._run_id, workload=self.config.workload_name,
                                 **decision.model_dump())

    def _trip(self, reason: str | None) -> None:
        """The breaker tripped: no new work, and the stages in flight stop at their next stage."""
        if reason is not None and self.aborted is None:
            self.aborted = reason
            self.cancel.set()

    def _refresh_best(self, workload_id: int, stats: RunStats) -> None:
        best = self.pop.best(workload_id)
        if best is None:
            return
        for ev in reversed(self.pop.evaluations(best.candidate_id, Stage.BENCH)):
            if ev.status == EvaluationStatus.PASSED:
                stats.best_ms, stats.best_speedup = ev.ms, ev.speedup
                return
