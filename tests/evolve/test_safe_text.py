"""Candidate-derived text reaches the orchestrator's terminal without its controls: a
failure message cannot move the cursor to forge a `bench passed` line, set the title or
the clipboard (OSC), reorder what is read (bidi), or be read as Rich markup."""
from __future__ import annotations

import io
import json
import logging
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from evolve.breaker import FailureBreaker
from evolve.cli import main
from evolve.db import open_database
from evolve.loop import SearchLoop
from evolve.pipeline import RunStats
from evolve.pipeline.runner import PipelineOutcome
from evolve.population import NewCandidate, Population, StageResult
from evolve.promotion import Decision
from evolve.safe_text import SafeFormatter, safe_text
from evolve.stage_progress import StageEvent, StagePhase, StageProgress

# Erase the line above and write a forged pass in its place.
FORGED = "candidate 1: bench passed in 61.0s 9.870x"
ATTACK = f"ValueError: [/] [bold]x[/bold] \x1b[1A\x1b[2K{FORGED}"
SHOWN = f"ValueError: [/] [bold]x[/bold] \\x1b[1A\\x1b[2K{FORGED}"
TITLE = "\x1b]0;pwned\x07"                      # OSC ended by BEL: the window title
CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4=\x1b\\"      # OSC 52 ended by ESC \: the clipboard


# ---- the helper -----------------------------------------------------------------------------
@pytest.mark.parametrize(("raw", "shown"), [
    ("\x1b", "\\x1b"),
    ("\x1b[1A\x1b[2Kok", "\\x1b[1A\\x1b[2Kok"),                       # CSI
    (TITLE, "\\x1b]0;pwned\\x07"),                                     # OSC ... BEL
    (CLIPBOARD, "\\x1b]52;c;cm0gLXJmIH4=\\x1b\\"),                     # OSC ... ESC \
    ("\x9b31mred", "\\x9b31mred"),                                    # C1 CSI
    ("\x85\x9d", "\\x85\\x9d"),                                       # C1: NEL, OSC
    ("abc\u202edef", "abc\\u202edef"),                                 # right-to-left override
    ("\u202a\u2066\u2069", "\\u202a\\u2066\\u2069"),                   # embedding, isolates
    ("50%\rdone\b\x7f\x00", "50%\\x0ddone\\x08\\x7f\\x00"),            # CR, backspace, DEL, NUL
])
def test_controls_are_shown_as_escapes(raw: str, shown: str) -> None:
    assert safe_text(raw) == shown


def test_newlines_tabs_and_plain_text_are_kept() -> None:
    plain = "line one\n\tindented: 1.5x ✓ best … naïve [bold] kda_prep.cu(12): error"
    assert safe_text(plain) == plain


def test_nothing_unsafe_is_left_in_any_position() -> None:
    unsafe = [*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0), *range(0x202A, 0x202F),
              *range(0x2066, 0x206A)]
    out = safe_text("".join(chr(c) for c in unsafe))
    assert not any(ord(ch) in unsafe for ch in out)


def test_log_records_are_escaped() -> None:
    record = logging.LogRecord("evolve.loop", logging.ERROR, __file__, 1, "render failed: %s", (ATTACK,), None)
    assert SafeFormatter("%(message)s").format(record) == f"render failed: {SHOWN}"


# ---- the printers -----------------------------------------------------------------------------
def _failed(stage: str = "check") -> StageEvent:
    return StageEvent(candidate_id=1, stage=stage, phase=StagePhase.FINISHED, status="failed",
                      failure_kind="runtime", seconds=1.0, message=ATTACK)


def test_stage_progress_prints_a_failure_line_as_plain_escaped_text() -> None:
    out = io.StringIO()
    view = StageProgress(Console(file=out, width=200, color_system=None))   # not a terminal: plain lines
    view(_failed())
    text = out.getvalue()
    assert SHOWN in text                 # the markup shown as it is, the controls as escapes
    assert "\x1b" not in text


def test_stage_progress_on_a_terminal_keeps_the_forged_line_escaped() -> None:
    out = io.StringIO()
    console = Console(file=out, width=400, force_terminal=True, color_system=None)
    with StageProgress(console) as view:
        view(_failed())
    text = out.getvalue()
    assert f"\\x1b[2K{FORGED}" in text and f"\x1b[2K{FORGED}" not in text


def _population(tmp_path: Path) -> tuple[str, Population, int]:
    url = f"sqlite:///{tmp_path / 'evolve.db'}"
    pop = Population(open_database(url))
    wid = pop.ensure_workload("forward_cpu_small", "kcoral/workloads/kda/forward_cpu_small")
    cand, _ = pop.add_candidate(NewCandidate(workload_id=wid, origin="agent", digest="evil", name=f"evil{TITLE}",
                                             directory="scratch/evil", notes=f"see{CLIPBOARD}"))
    passed = pop.begin_stage(cand.id, "check")
    assert passed is not None and pop.finish_stage(passed, StageResult(status="passed"))
    bench = pop.begin_stage(cand.id, "bench")
    assert bench is not None and pop.finish_stage(bench, StageResult(
        status="passed", ms=1.0, baseline_ms=2.0, speedup=2.0, spread=0.01))
    confirm = pop.begin_stage(cand.id, "confirm")
    assert confirm is not None and pop.finish_stage(confirm, StageResult(status="passed", speedup=2.0))
    pop.promote(cand.id, None, [confirm], margin=0.02, speedup_over_best=None)   # named in `status`
    failed = pop.begin_stage(cand.id, "ncu")
    assert failed is not None and pop.finish_stage(failed, StageResult(
        status="failed", failure_kind="runtime", message=ATTACK, metrics={"stderr_tail": f"boom\n{CLIPBOARD}"}))
    return url, pop, cand.id


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    assert main(list(args)) == 0
    return capsys.readouterr().out


def test_show_prints_candidate_text_escaped_and_json_as_stored(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    url, _pop, cid = _population(tmp_path)
    text = _cli(capsys, "show", str(cid), "--db", url)
    assert "\x1b" not in text and "\x07" not in text
    assert SHOWN in text and "evil\\x1b]0;pwned\\x07" in text and "\\x1b]52;c;" in text
    doc = json.loads(_cli(capsys, "show", str(cid), "--db", url, "--json"))
    assert [e["message"] for e in doc["evaluations"]][-1] == ATTACK      # stored and --json: as it came


def test_leaderboard_and_status_escape_candidate_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, _pop, _cid = _population(tmp_path)
    for command in ("leaderboard", "status"):
        text = _cli(capsys, command, "--db", url)
        assert "\x1b" not in text and "\x07" not in text, command
        assert "evil\\x1b]0;pwned\\x07" in text, command


def test_the_run_loop_escapes_a_confirmation_failure_in_its_decision_line() -> None:
    stream = io.StringIO()
    loop = SimpleNamespace(stream=stream, breaker=FailureBreaker(0), events=None, _trip=lambda reason: None)
    done: Future = Future()
    done.set_result((PipelineOutcome(candidate_id=1, passed=True),
                     Decision(candidate_id=1, promoted=False, reason=f"confirmation failed: {ATTACK}")))
    SearchLoop._account(loop, done, RunStats())  # type: ignore[arg-type]
    assert SHOWN in stream.getvalue() and "\x1b" not in stream.getvalue()


def test_a_one_line_context_shows_newlines_too() -> None:
    from evolve.safe_text import safe_line

    forged = "boom\n#12 bench    passed 9.870x\x1b[2K"
    assert safe_line(forged) == "boom\\n#12 bench    passed 9.870x\\x1b[2K"
    assert "\n" not in safe_line(forged)
