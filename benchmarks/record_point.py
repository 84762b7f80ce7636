"""Append measured points of our GPU families to the recorded-points file.

    python benchmarks/record_point.py FAMILY '{"v_block": 128, ...}' --ms 1.2467 --commit 2ea21dd --source "..."
    python benchmarks/record_point.py FAMILY '{...}' --failure compile --commit SHA
    python benchmarks/record_point.py --from-db sqlite:///evolve.db --commit SHA [--workload NAME] [--device TEXT]

`--from-db` appends every family candidate's latest official bench in that database (its
time, or its failure kind), of the benches run on a card whose name holds `--device` ("H200"
unless told: the file records H200 points; "" takes every card). Benches that recorded no
card (databases before 2026-12-05, all from the H200) are taken. Prints what it appended, and
on stderr what it left out; `--json` as JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
from datetime import date, datetime, UTC
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pydantic import ValidationError  # noqa: E402

from evolve.cards import bench_card  # noqa: E402
from evolve.replay.recorded import RecordedPoint, append_points  # noqa: E402

DEFAULT_FILE = REPO / "benchmarks" / "landscapes" / "h200-points.csv"


def from_db(url: str, workload: str | None, commit: str, source: str,
            device: str = "H200") -> tuple[list[RecordedPoint], dict[str, int]]:
    """The points, and by card name the benches left out for running on another card."""
    from evolve.population import Population
    if "://" not in url:
        url = f"sqlite:///{url}"
    pop = Population.open(url)
    try:
        wid = pop.workload_id(workload) if workload else None
        latest = {}
        other: dict[str, int] = {}
        for ev in pop.evaluations_of(wid, stage="bench"):
            card = bench_card(ev.metrics)
            if card is not None and device.lower() not in card.lower():
                other[card] = other.get(card, 0) + 1
                continue
            if ev.status in ("passed", "failed"):
                latest[ev.candidate_id] = ev
        out = []
        for cid, ev in sorted(latest.items()):
            cand = pop.candidate(cid)
            if cand is None or not cand.family:
                continue
            when = (ev.ended_at or ev.started_at or datetime.now(UTC)).date()
            out.append(RecordedPoint(family=cand.family, params=cand.params, date=when, commit=commit,
                                     source=source or f"evolve database, candidate {cid}",
                                     ms=ev.ms if ev.status == "passed" else None,
                                     failure=None if ev.status == "passed" else (ev.failure_kind or "runtime")))
        return out, other
    finally:
        pop.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("family", nargs="?")
    ap.add_argument("params", nargs="?", help="the point, as a JSON object")
    ap.add_argument("--ms", type=float)
    ap.add_argument("--failure", help="failure kind instead of a time (compile, runtime, correctness, ...)")
    ap.add_argument("--commit", required=True)
    ap.add_argument("--date", type=date.fromisoformat, default=datetime.now(UTC).date())
    ap.add_argument("--source", default="", help="where the figure comes from (a docs section, a command)")
    ap.add_argument("--from-db", help="an evolve database (URL or SQLite path): append its benched points")
    ap.add_argument("--workload", help="with --from-db: only this workload")
    ap.add_argument("--device", default="H200", help="with --from-db: only benches on a card whose name holds "
                                                     "this ('' for every card)")
    ap.add_argument("--file", type=Path, default=DEFAULT_FILE)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        if args.from_db:
            if args.family or args.params:
                ap.error("--from-db takes no FAMILY or PARAMS")
            points, other = from_db(args.from_db, args.workload, args.commit, args.source, args.device)
            for card, n in sorted(other.items()):
                print(f"left out {n} bench(es) run on {card} (not {args.device!r}; --device to choose)",
                      file=sys.stderr)
        else:
            if not args.family or not args.params:
                ap.error("give FAMILY and PARAMS, or --from-db")
            params = json.loads(args.params)
            if not isinstance(params, dict):
                ap.error("PARAMS must be a JSON object")
            points = [RecordedPoint(family=args.family, params=params, ms=args.ms, failure=args.failure,
                                    date=args.date, commit=args.commit, source=args.source)]
    except (ValueError, ValidationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    append_points(args.file, points)
    if args.json:
        print(json.dumps([p.model_dump(mode="json") for p in points], indent=2))
    else:
        for p in points:
            print(f"{args.file}: {p.family} {json.dumps(p.params, sort_keys=True)} "
                  f"{f'{p.ms:.6g} ms' if p.ms is not None else p.failure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
