"""benchmarks/kda_timeline.py on a trace written by hand: the side chunks' heads recovered from
the side kernel's order, and each flag's lateness against the moment the walk asked for it."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
import kda_timeline  # noqa: E402

DTYPE = np.dtype([("cta", "<u4"), ("warp", "<u4"), ("stage", "<u4"), ("seq", "<u4"),
                  ("start_ns", "<u8"), ("end_ns", "<u8")])


def _write(path: Path, rows: list[tuple]) -> None:
    rec = np.array(rows, dtype=DTYPE)
    path.write_bytes(np.array([len(rec), len(rec)], dtype="<u8").tobytes() + rec.tobytes())


def test_lateness_of_side_flags(tmp_path):
    # two heads, chunks 0-3, chunk 2 the side kernel's (6 of 16); one side CTA: team 0 takes head
    # 0's side chunk, team 1 head 1's
    fused = []
    for cta, filled1 in ((0, 1000), (1, 1000)):
        for c, end in ((0, 500), (1, filled1), (3, 2000)):
            fused += [(cta, w, 0, c, end - 400, end - 300) for w in range(8)]          # load_gate
            fused += [(cta, w, 4, c, end - 100, end) for w in range(8)]                # w_u
        for c in range(4):
            fused.append((cta, 8, 5, c, 900 if c == 1 else 100 + 600 * c, 950 + 600 * c))   # wait_full
    side = []
    for team, done in ((0, 1300), (1, 800)):
        for w in range(8):
            side.append((0, 8 * team + w, 0, 2, 100, 200))
            side.append((0, 8 * team + w, 4, 2, done - 50, done - (w % 2)))
    _write(tmp_path / "kda_fused_kernel.iket.bin", fused)
    _write(tmp_path / "kda_side_prep_kernel.iket.bin", side)
    r = kda_timeline.analyse(tmp_path, heads=2)
    # head 0: asked at 1000 (the prep's last w_u of chunk 1, after the walk began waiting at 900),
    # flag at 1300: 300 late; head 1: flag at 800, 200 early
    assert r["side_flag_minus_ask"]["n"] == 2
    assert r["side_flag_minus_ask"]["max_us"] == 0.3
    assert r["side_chunks_late"]["late"] == 1
    assert r["walk_wait_side_chunks"]["n"] == 2 and r["walk_wait_prep_chunks"]["n"] == 6
    kda_timeline.print_report(r)


def test_side_items_follow_the_side_kernels_own_team_count():
    # two side CTAs of two teams each (side_teams = 2), four heads, chunk 2 the side chunk: the
    # team t of CTA c takes item 2 c + t, head (2 c + t) % 4; with three teams assumed, CTA 1's
    # teams would be items 3 and 4
    side = []
    for cta in (0, 1):
        for team in (0, 1):
            done = 1000 + 100 * (2 * cta + team)
            for w in range(8):
                side.append((cta, 8 * team + w, 0, 2, 100, 200))
                side.append((cta, 8 * team + w, 4, 2, done - 50, done))
    flags = kda_timeline.side_flags(np.array(side, dtype=DTYPE), heads=4)
    assert flags == {(0, 2): 1000, (1, 2): 1100, (2, 2): 1200, (3, 2): 1300}
