from __future__ import annotations

import re
from xml.etree import ElementTree

from evolve.population import Population
from evolve.report import best_so_far, nice_ticks, render_report, step_plot

from .conftest import populate


def test_report_has_the_table_plots_and_failures(pop: Population, workload: int) -> None:
    ids = populate(pop, workload)
    page = render_report(pop, workload)
    assert page.startswith("<!DOCTYPE html>") and "</html>" in page
    assert "<table>" in page and "3.000×" in page and "✓ best" in page
    svgs = re.findall(r"<svg.*?</svg>", page, flags=re.S)
    assert len(svgs) == 2
    for svg in svgs:
        root = ElementTree.fromstring(svg)  # well-formed XML
        assert root.find("{http://www.w3.org/2000/svg}path") is not None
    assert "compile" in page  # failure kinds table
    assert "bench" in page and "check" in page  # per-stage timing
    assert f'<tr class="best"><td class="n">1</td><td class="n">{ids["fast"]}</td>' in page
    assert "<script" not in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")


def test_empty_database_still_renders(pop: Population) -> None:
    page = render_report(pop)
    assert "No candidate has passed the bench yet." in page
    assert page.count("<svg") == 2


def test_best_so_far_steps_at_each_promotion(pop: Population, workload: int) -> None:
    populate(pop, workload)
    by_count, by_time = best_so_far(pop.evaluation_summaries(workload), pop.promotions(workload))
    assert [y for _, y in by_count] == [1.0, 3.0]
    assert by_count[0][0] < by_count[1][0]
    assert all(x >= 0 for x, _ in by_time)


def test_nice_ticks_cover_the_range() -> None:
    ticks = nice_ticks(0.93, 3.1)
    assert ticks[0] <= 0.93 and ticks[-1] >= 3.1
    steps = {round(b - a, 9) for a, b in zip(ticks, ticks[1:])}
    assert len(steps) == 1 and steps.pop() in (0.5, 1.0)
    svg = step_plot([(1.0, 1.0), (5.0, 2.0)], title="t", x_label="x", y_label="y")
    assert 'd="M' in svg and "H" in svg


def test_best_so_far_follows_confirmed_bests(pop: Population, workload: int) -> None:
    from .test_leaderboard import _issue_case

    _issue_case(pop, workload)
    by_count, _ = best_so_far(pop.evaluation_summaries(workload), pop.promotions(workload))
    assert [y for _, y in by_count] == [1.2]   # the unconfirmed 1.51x does not lift the curve
