"""`render_report`: build the report's data (report.progress, .candidates, .runs,
.plots) and render it through the Jinja templates in templates/ with autoescape on, so a
message, a log or a name from a candidate can never become markup. The page is one
self-contained file: no scripts, no external files, plots as inline SVG."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import jinja2

from evolve.db.models import utcnow
from evolve.db.records import LeaderboardRow, Workload
from evolve.leaderboard_view import COLUMNS, Column, cards_note
from evolve.population import Population
from evolve.report.candidates import CandidatePage, anchor, candidate_page
from evolve.report.plots import StepPlot, step_plot
from evolve.report.progress import FailureTable, StageTiming, best_so_far, failure_table, stage_timing
from evolve.report.runs import RunSection, run_sections

# Candidates with a page besides the leaderboard's rows: the latest failures of each run.
FAILED_PAGES = 10


@dataclass(frozen=True)
class ReportData:
    title: str
    generated: datetime
    workloads: list[Workload]
    candidate_count: int
    evaluation_count: int
    promotion_count: int
    limit: int
    columns: tuple[Column, ...]
    leaderboard: list[LeaderboardRow]
    cards_note: str | None                  # where the rows' benches ran on several kinds of card
    plots: list[StepPlot]
    failures: FailureTable
    timing: list[StageTiming]
    runs: list[RunSection]
    pages: list[CandidatePage]


def build_report(pop: Population, workload_id: int | None = None, *, limit: int = 50,
                 now: datetime | None = None) -> ReportData:
    evaluations = pop.evaluation_summaries(workload_id)
    leaderboard = pop.leaderboard(workload_id, limit=limit)
    workloads = [w for w in pop.workloads() if workload_id is None or w.id == workload_id]
    promotions = list(pop.promotions(workload_id))
    by_count, by_time = best_so_far(evaluations, promotions)

    # Short runs read better in minutes than in hundredths of an hour.
    span_h = max((x for x, _ in by_time), default=0.0)
    unit, per_hour = ("minutes", 60.0) if span_h < 2 else ("hours", 1.0)
    by_time = [(x * per_hour, y) for x, y in by_time]
    y_label = "speedup over baseline (x)"
    plots = [
        step_plot(by_count, title="Confirmed best, by evaluations", x_label="finished evaluations (all stages)",
                  y_label=y_label, markers=by_count, marker_title="promoted after evaluation"),
        step_plot(by_time, title="Confirmed best, by wall time", x_label=f"{unit} since the first evaluation",
                  y_label=y_label, markers=by_time, marker_title=f"promoted at {unit}"),
    ]

    candidates = pop.candidates(workload_id)
    by_id = {c.id: c for c in candidates}
    speed = {c.id: c.best_speedup for c in candidates}
    runs = run_sections(pop, workload_id, promotions)
    failed_ids = [cid for section in runs for group in section.failures for cid in group.candidates]
    chosen = list(dict.fromkeys([r.candidate_id for r in leaderboard] + [p.candidate_id for p in promotions]
                                + failed_ids[:FAILED_PAGES]))
    shown = set(chosen)
    pages = [candidate_page(pop, by_id[cid], by_id=by_id, speed=speed, shown=shown, promotions=promotions)
             for cid in chosen if cid in by_id]

    title = "evolve report" + (f": {workloads[0].name}" if workload_id is not None and workloads else "")
    return ReportData(
        title=title, generated=now or utcnow(), workloads=workloads,
        candidate_count=len({e.candidate_id for e in evaluations}), evaluation_count=len(evaluations),
        promotion_count=len(promotions), limit=limit, columns=COLUMNS, leaderboard=leaderboard,
        cards_note=cards_note(leaderboard), plots=plots,
        failures=failure_table(evaluations), timing=stage_timing(evaluations), runs=runs, pages=pages)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("evolve.report", "templates"),
        autoescape=True,                    # every value is text unless a template says otherwise
        undefined=jinja2.StrictUndefined,   # a misspelt field fails the render, not the reader
        trim_blocks=True, lstrip_blocks=True,
    )
    env.globals["anchor"] = anchor

    def num(value: float | int | None, spec: str) -> str:
        return "–" if value is None else format(value, spec)

    env.filters["num"] = num
    return env


_ENV: list[jinja2.Environment] = []


def render_data(data: ReportData) -> str:
    if not _ENV:
        _ENV.append(_environment())
    return _ENV[0].get_template("report.html.j2").render(r=data)


def render_report(pop: Population, workload_id: int | None = None, *, limit: int = 50,
                  now: datetime | None = None) -> str:
    return render_data(build_report(pop, workload_id, limit=limit, now=now))


def render_plot(plot: StepPlot) -> str:
    """One plot as standalone SVG (the same macro the page uses)."""
    if not _ENV:
        _ENV.append(_environment())
    return _ENV[0].get_template("plots.svg.j2").module.step_plot(plot)  # type: ignore[attr-defined]  # a template module holds its macros as attributes
