from __future__ import annotations

import re
from xml.etree import ElementTree

from evolve.population import Population
from evolve.report import best_so_far, nice_ticks, render_plot, render_report, step_plot

from .conftest import add_tools_and_a_crash, populate


def test_report_has_the_table_plots_and_failures(pop: Population, workload: int) -> None:
    ids = populate(pop, workload)
    page = render_report(pop, workload)
    assert page.startswith("<!DOCTYPE html>") and "</html>" in page
    assert '<table class="leaderboard">' in page and "3.000x" in page and "✓ best" in page
    svgs = re.findall(r"<svg.*?</svg>", page, flags=re.S)
    assert len(svgs) == 2
    for svg in svgs:
        root = ElementTree.fromstring(svg)  # well-formed XML
        assert root.find("{http://www.w3.org/2000/svg}path") is not None
    assert "compile" in page  # failure kinds table
    assert "bench" in page and "check" in page  # per-stage timing
    best_row = re.search(r'<tr class="best">(.*?)</tr>', page, flags=re.S)
    assert best_row is not None
    cells = re.findall(r"<td[^>]*>(.*?)</td>", best_row.group(1), flags=re.S)
    assert cells[0] == "1" and f'href="#c{ids["fast"]}"' in cells[1]
    assert "<script" not in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")


def test_a_leaderboard_of_two_cards_says_so(pop: Population, workload: int) -> None:
    from evolve.population import StageResult

    from .conftest import finish, make_candidate

    populate(pop, workload)
    assert 'class="warn"' not in render_report(pop, workload)   # no card recorded: nothing to say
    for name, card in (("a", "NVIDIA H200"), ("b", "NVIDIA H100 80GB HBM3")):
        finish(pop, make_candidate(pop, workload, name), "bench",
               StageResult(status="passed", speedup=2.5, metrics={"device": card}))
    page = render_report(pop, workload)
    note = re.search(r'<p class="warn">(.*?)</p>', page, flags=re.S)
    assert note is not None and "2 kinds of card" in note.group(1) and "H100 80GB HBM3" in note.group(1)


def test_the_leaderboard_columns_are_the_texts(pop: Population, workload: int) -> None:
    """One column list: the HTML header is the COLUMNS' headers, in order, as the text table's."""
    from evolve.leaderboard_view import COLUMNS, format_table

    populate(pop, workload)
    page = render_report(pop, workload)
    head = re.search(r'<table class="leaderboard">\s*<thead><tr>(.*?)</tr>', page, flags=re.S)
    assert head is not None
    assert re.findall(r"<th[^>]*>(.*?)</th>", head.group(1)) == [c.header for c in COLUMNS]
    text_header = format_table(pop.leaderboard(workload)).splitlines()[0]
    assert [c.header for c in COLUMNS if c.in_text] == re.split(r"\s{2,}", text_header.strip())


def test_candidate_pages_hold_parameters_lineage_timeline_logs_and_tools(pop: Population, workload: int) -> None:
    ids = populate(pop, workload)
    crash = add_tools_and_a_crash(pop, workload, ids)
    page = render_report(pop, workload)
    section = page[page.index(f'<article class="candidate" id="c{ids["fast"]}"'):]
    section = section[:section.index("</article>")]
    assert "<th>chunk</th><td><code>64</code></td>" in section                 # parameters
    assert f'<a href="#c{ids["seed"]}">{ids["seed"]}</a>' in section           # lineage: its parent
    assert section.count('<div class="track">') == 4                            # check, bench, ncu, confirm
    tools = page[page.index(f'<article class="candidate" id="c{ids["slow"]}"'):]
    tools = tools[:tools.index("</article>")]
    assert "w1:state" in tools and "30.25" in tools                             # IKET table
    assert "period µs" in tools and "41.75" in tools                            # a chunk loop's period
    assert "kda_prep_kernel" in tools and "731000.0" in tools                   # NCU metrics
    crashed = page[page.index(f'id="c{crash}"'):]
    assert "Traceback (most recent call last)" in crashed and "warming up" in crashed  # stored logs
    # autoescape: a message from a candidate is text, never markup
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_run_sections_show_config_failures_and_confirmations(pop: Population, workload: int) -> None:
    ids = populate(pop, workload)
    page = render_report(pop, workload)
    run = page[page.index(f'id="run{ids["run"]}"'):]
    run = run[:run.index("</article>")]
    assert "&#34;strategy&#34;: &#34;evolution&#34;" in run                   # the config, as JSON text
    assert "kda_prep.cu(12): error: identifier undefined" in run               # failure message
    confirmations = run[run.index('<table class="confirmations">'):]
    assert "2.900" in confirmations and f"promoted over {ids['seed']}" in confirmations
    assert "first best, against the baseline" in confirmations


def test_empty_database_still_renders(pop: Population) -> None:
    page = render_report(pop)
    assert "No candidate has passed the bench yet." in page
    assert page.count("<svg") == 2 and "no confirmed best yet" in page


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
    svg = render_plot(step_plot([(1.0, 1.0), (5.0, 2.0)], title="t", x_label="x", y_label="y"))
    root = ElementTree.fromstring(svg)
    path = root.find("{http://www.w3.org/2000/svg}path")
    assert path is not None and path.get("d", "").startswith("M") and "H" in path.get("d", "")


def test_best_so_far_follows_confirmed_bests(pop: Population, workload: int) -> None:
    from .test_leaderboard import _issue_case

    _issue_case(pop, workload)
    by_count, _ = best_so_far(pop.evaluation_summaries(workload), pop.promotions(workload))
    assert [y for _, y in by_count] == [1.2]   # the unconfirmed 1.51x does not lift the curve
