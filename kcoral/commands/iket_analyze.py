"""`kcoral iket-analyze`: per warp and stage mean/median/count, kernel span and the
steady-state chunk period of an IKET Chrome trace."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from kcoral.iket import IketError, analyze_trace, format_analysis


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("iket-analyze", help="summarise an IKET trace")
    p.add_argument("trace", metavar="TRACE.json")
    p.add_argument("cta", nargs="?", type=int, default=None, metavar="CTA",
                   help="analyse this CTA only (default: all CTAs pooled)")
    p.add_argument("--json", action="store_true", help="print the analysis as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        trace = json.loads(Path(args.trace).read_text())
    except ValueError as exc:
        raise IketError(f"{args.trace} is not JSON: {exc}") from None
    analysis = analyze_trace(trace, args.cta)
    print(json.dumps(analysis.to_dict(), indent=2) if args.json else format_analysis(analysis))
    return 0
