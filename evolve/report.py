"""A self-contained HTML report of a search: leaderboard, best-so-far plots (inline SVG),
failure kinds and per-stage timing. No scripts, no external files."""
from __future__ import annotations

import html
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from datetime import datetime

from evolve.db.models import utcnow
from evolve.db.records import EvaluationSummary, LeaderboardRow, Promotion
from evolve.population import Population

Point = tuple[float, float]

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0}th,td{padding:3px 10px;border-bottom:1px solid #eee;text-align:left}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}tr.best{background:#eef8ee}
.muted{color:#777}.plots{display:flex;flex-wrap:wrap;gap:1.5em}
"""


# ------------------------------------------------------------------- SVG plots
def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 2.5, 5 × 10^k steps) covering [lo, hi]."""
    if not math.isfinite(lo) or not math.isfinite(hi):
        return [0.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(count, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.floor(lo / step) * step
    ticks = []
    value = first
    while value <= hi + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < hi:
        ticks.append(round(value, 12))
    return ticks


def _fmt_tick(v: float) -> str:
    return f"{v:.0f}" if abs(v - round(v)) < 1e-9 else f"{v:g}"


def step_plot(
    points: Sequence[Point],
    *,
    title: str,
    x_label: str,
    y_label: str,
    markers: Sequence[Point] = (),
    width: int = 500,
    height: int = 300,
) -> str:
    """A best-so-far step line (each point holds until the next) with optional markers."""
    left, right, top, bottom = 58, 16, 30, 44
    plot_w, plot_h = width - left - right, height - top - bottom
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(title)}">',
        f'<text x="{left}" y="18" font-size="13" font-weight="bold">{html.escape(title)}</text>',
    ]
    if not points:
        out.append(f'<text x="{left + 10}" y="{top + plot_h / 2}" fill="#777">no passed bench yet</text></svg>')
        return "".join(out)
    xs = [p[0] for p in points] + [m[0] for m in markers]
    ys = [p[1] for p in points] + [m[1] for m in markers]
    x_ticks = nice_ticks(min(0.0, min(xs)), max(xs))
    y_ticks = nice_ticks(min(ys) - 0.05 * abs(min(ys)), max(ys) + 0.02 * abs(max(ys)))
    x0, x1, y0, y1 = x_ticks[0], x_ticks[-1], y_ticks[0], y_ticks[-1]

    def sx(x: float) -> float:
        return left + (x - x0) / ((x1 - x0) or 1) * plot_w

    def sy(y: float) -> float:
        return top + plot_h - (y - y0) / ((y1 - y0) or 1) * plot_h

    for t in y_ticks:
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{left - 6}" y="{sy(t) + 4:.1f}" font-size="11" text-anchor="end">{_fmt_tick(t)}</text>')
    for t in x_ticks:
        out.append(f'<line x1="{sx(t):.1f}" x2="{sx(t):.1f}" y1="{top}" y2="{top + plot_h}" stroke="#f3f3f3"/>')
        out.append(
            f'<text x="{sx(t):.1f}" y="{top + plot_h + 16}" font-size="11" text-anchor="middle">{_fmt_tick(t)}</text>'
        )
    out.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>')
    path = [f"M{sx(points[0][0]):.1f},{sy(points[0][1]):.1f}"]
    for x, y in points[1:]:
        path.append(f"H{sx(x):.1f}V{sy(y):.1f}")
    path.append(f"H{sx(max(xs)):.1f}")
    out.append(f'<path d="{"".join(path)}" fill="none" stroke="#2a6fdb" stroke-width="2"/>')
    for x, y in markers:
        out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" fill="#2b9e44"><title>promoted</title></circle>')
    out.append(
        f'<text x="{left + plot_w / 2}" y="{height - 8}" font-size="12" text-anchor="middle">{html.escape(x_label)}</text>'
    )
    out.append(
        f'<text transform="translate(14 {top + plot_h / 2}) rotate(-90)" font-size="12" '
        f'text-anchor="middle">{html.escape(y_label)}</text>'
    )
    out.append("</svg>")
    return "".join(out)


# ------------------------------------------------------------------ the data
def best_so_far(evaluations: Sequence[EvaluationSummary], promotions: Sequence[Promotion],
                ranked_stage: str = "bench") -> tuple[list[Point], list[Point]]:
    """The confirmed best as the search went: (by finished evaluation count, by hours).

    One point per promotion, at its last confirmation run, valued at the promoted
    candidate's best bench speedup: an unconfirmed bench (one lucky run) never moves it."""
    finished = sorted(
        (e for e in evaluations if e.ended_at is not None and e.status in ("passed", "failed")),
        key=lambda e: (e.ended_at, e.id),  # type: ignore[return-value]
    )
    if not finished:
        return [], []
    order = {e.id: n for n, e in enumerate(finished, start=1)}
    ended = {e.id: e.ended_at for e in finished}
    speed: dict[int, float] = {}
    for e in finished:
        if e.stage == ranked_stage and e.status == "passed" and e.speedup is not None:
            speed[e.candidate_id] = max(e.speedup, speed.get(e.candidate_id, e.speedup))
    origin = min(e.started_at for e in evaluations)
    by_count: list[Point] = []
    by_time: list[Point] = []
    for p in sorted(promotions, key=lambda p: p.id):
        value = speed.get(p.candidate_id)
        if value is None:
            continue
        confirmations = [i for i in p.confirmation_eval_ids if i in order]
        last = max(confirmations, key=lambda i: order[i]) if confirmations else None
        n = order[last] if last is not None else sum(1 for e in finished if e.ended_at <= p.promoted_at)  # type: ignore[operator]
        at = ended[last] if last is not None else p.promoted_at
        by_count.append((float(n), value))
        by_time.append(((at - origin).total_seconds() / 3600, value))  # type: ignore[operator]
    return by_count, by_time


def _stage_timing(evaluations: Sequence[EvaluationSummary]) -> list[dict[str, object]]:
    groups: dict[str, list[EvaluationSummary]] = defaultdict(list)
    for ev in evaluations:
        groups[ev.stage].append(ev)
    rows = []
    for stage, evs in groups.items():
        durations = sorted(d for d in (e.duration_s for e in evs) if d is not None)
        queue = [e.queue_ms for e in evs if e.queue_ms is not None]
        lease = [e.lease_held_ms for e in evs if e.lease_held_ms is not None]
        statuses = Counter(e.status for e in evs)
        rows.append(
            {
                "stage": stage,
                "count": len(evs),
                "passed": statuses["passed"],
                "failed": statuses["failed"],
                "other": statuses["running"] + statuses["interrupted"],
                "median_s": statistics.median(durations) if durations else None,
                "p90_s": durations[min(len(durations) - 1, int(0.9 * len(durations)))] if durations else None,
                "total_s": sum(durations),
                "queue_ms": statistics.fmean(queue) if queue else None,
                "lease_ms": statistics.fmean(lease) if lease else None,
            }
        )
    order = ["check", "gputest", "iket", "ncu", "bench", "confirm"]
    return sorted(rows, key=lambda r: (order.index(r["stage"]) if r["stage"] in order else len(order), r["stage"]))  # type: ignore[arg-type]


# ------------------------------------------------------------------ the page
def _num(value: float | int | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: set[int], row_class: Sequence[str] = ()) -> str:
    head = "".join(f'<th class="n">{html.escape(h)}</th>' if i in numeric else f"<th>{html.escape(h)}</th>" for i, h in enumerate(header))
    body = []
    for r, cells in enumerate(rows):
        cls = f' class="{row_class[r]}"' if r < len(row_class) and row_class[r] else ""
        tds = "".join(f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(cells))
        body.append(f"<tr{cls}>{tds}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _leaderboard_html(rows: Sequence[LeaderboardRow]) -> str:
    if not rows:
        return '<p class="muted">No candidate has passed the bench yet.</p>'
    cells = [
        [
            str(r.rank),
            str(r.candidate_id),
            html.escape(r.name or "–"),
            _num(r.ms, ".4f"),
            _num(r.baseline_ms, ".4f"),
            f"{r.speedup:.3f}×",
            ("–" if r.spread is None else f"{r.spread:.1%}") + (" noisy" if r.noisy else ""),
            ("✓ best" if r.best else "✓") if r.confirmed else "",
            _num(r.excessive_sectors, ",d"),
            html.escape(r.source),
            html.escape(r.directory),
        ]
        for r in rows
    ]
    header = ["rank", "id", "name", "ms", "baseline ms", "speedup", "spread", "confirmed", "excess sectors", "origin",
              "directory"]
    return _table(header, cells, {0, 1, 3, 4, 5, 6, 8}, ["best" if r.best else "" for r in rows])


def render_report(pop: Population, workload_id: int | None = None, *, limit: int = 50, now: datetime | None = None) -> str:
    now = now or utcnow()
    evaluations = pop.evaluation_summaries(workload_id)
    leaderboard = pop.leaderboard(workload_id, limit=limit)
    workloads = [w for w in pop.workloads() if workload_id is None or w.id == workload_id]
    promos = list(pop.promotions(workload_id))
    by_count, by_time = best_so_far(evaluations, promos)
    marks_count, marks_time = list(by_count), list(by_time)   # each step is a promotion

    # Short runs read better in minutes than in hundredths of an hour.
    span_h = max((x for x, _ in by_time + marks_time), default=0.0)
    unit, per_hour = ("minutes", 60.0) if span_h < 2 else ("hours", 1.0)
    by_time = [(x * per_hour, y) for x, y in by_time]
    marks_time = [(x * per_hour, y) for x, y in marks_time]
    plots = (
        step_plot(by_count, title="Best speedup so far, by evaluations", x_label="finished evaluations (all stages)",
                  y_label="speedup over baseline (×)", markers=marks_count)
        + step_plot(by_time, title="Best speedup so far, by wall time", x_label=f"{unit} since the first evaluation",
                    y_label="speedup over baseline (×)", markers=marks_time)
    )

    failures = Counter((e.stage, e.failure_kind) for e in evaluations if e.status == "failed")
    kinds = sorted({k for _, k in failures if k})
    stages = sorted({s for s, _ in failures})
    failure_html = (
        _table(["failure kind", *stages, "total"],
               [[html.escape(k or "?"), *(str(failures.get((s, k), 0)) for s in stages),
                 str(sum(failures.get((s, k), 0) for s in stages))] for k in kinds],
               set(range(1, len(stages) + 2)))
        if failures else '<p class="muted">No failures.</p>'
    )

    timing = _stage_timing(evaluations)
    timing_html = (
        _table(["stage", "evaluations", "passed", "failed", "running/interrupted", "median s", "p90 s", "total s",
                "mean queue ms", "mean lease ms"],
               [[html.escape(str(r["stage"])), str(r["count"]), str(r["passed"]), str(r["failed"]), str(r["other"]),
                 _num(r["median_s"], ".2f"), _num(r["p90_s"], ".2f"), _num(r["total_s"], ".0f"),  # type: ignore[arg-type]
                 _num(r["queue_ms"], ".0f"), _num(r["lease_ms"], ".0f")] for r in timing],  # type: ignore[arg-type]
               set(range(1, 10)))
        if timing else '<p class="muted">No evaluations yet.</p>'
    )

    title = "evolve report" + (f": {workloads[0].name}" if workload_id is not None and workloads else "")
    summary = (
        f"{len({e.candidate_id for e in evaluations})} candidates evaluated, {len(evaluations)} evaluations, "
        f"{len(promos)} promotions; workloads: {html.escape(', '.join(w.name for w in workloads) or '–')}"
    )
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
            f"<h1>{html.escape(title)}</h1>",
            f'<p class="muted">generated {now:%Y-%m-%d %H:%M:%S} UTC. {summary}</p>',
            f"<h2>Leaderboard (top {limit})</h2>",
            _leaderboard_html(leaderboard),
            "<h2>Progress</h2>",
            f'<div class="plots">{plots}</div>',
            '<p class="muted">Green dots: promotions (confirmed new best).</p>',
            "<h2>Failures by kind and stage</h2>",
            failure_html,
            "<h2>Time per stage</h2>",
            timing_html,
            "</body></html>",
        ]
    )
