"""Convert a Kernel Tuner cache (JSON or JSON.gz) into a landscape CSV.gz for the replay.

    python benchmarks/landscapes/import_kernel_tuner.py CACHE.json.gz OUT.csv.gz --name NAME \
        [--meta source=URL --meta licence=MIT ...]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from evolve.replay.kernel_tuner import read_kernel_tuner_cache
from evolve.replay.landscape import LandscapeError, write_landscape


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cache", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--name", required=True)
    ap.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    meta = {}
    for item in args.meta:
        key, sep, value = item.partition("=")
        if not sep:
            ap.error(f"--meta {item!r}: expected KEY=VALUE")
        meta[key] = value
    try:
        landscape = read_kernel_tuner_cache(args.cache, name=args.name, meta=meta)
    except LandscapeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write_landscape(args.out, landscape)
    failed = sum(1 for p in landscape.points if p.failure)
    print(f"{args.out}: {len(landscape.points)} points ({failed} failed), "
          f"{len(landscape.parameters)} parameters, optimum {landscape.optimum_ms:.4g} ms, "
          f"{landscape.within(0.05)} within 5 %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
