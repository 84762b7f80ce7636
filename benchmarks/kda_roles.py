"""Time each role of fused_tiles points alone, to see which one sets the kernel's period.

For each configuration, up to five builds of the same rendered candidate (the kernel's
KDA_ALONE; --builds picks them): the whole kernel; the prep alone (the walk hands each slot back
untouched) at the point's registers, and at all 128 (no setmaxnreg: what the prep would run at
if the walk left it more); the walk alone (the prep hands over slots it never fills); the side
kernel alone (the fused CTAs return as they start; nothing without side chunks). A role's period is its
time over the chunks; the kernel's is near the slower role's. Timing as kda_kernels.py's
(CUDA events, an L2 flush before each call, the builds alternated, the median), with the
registers and local memory of each build as the driver reports them. With side chunks
(side_sixteenths > 0) the side kernel runs beside every build: the prep alone is then the fused
kernel's prep over its own chunks, and the walk alone still waits for the side chunks.

    python3 benchmarks/kda_roles.py --config fused_tiles:side_sixteenths=0 --config fused_tiles:side_sixteenths=0,elementwise=bf16x2 --out roles.json

Prints a line on stderr as each configuration is timed and rewrites --out after each, so a
run stopped by a time limit keeps what it has.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kda_kernels  # CuPy, the renderer and the timing loop

cupy = kda_kernels.cupy
kda_launch = kda_kernels.kda_launch

BUILDS = {"whole": 0, "prep": 1, "prep_128": 2, "walk": 3, "side": 4}   # name -> KDA_ALONE


def time_roles(family: str, params: dict, root: Path, data: dict, T: int, H: int, iters: int,
               builds: dict[str, int] = BUILDS) -> dict:
    cand = kda_kernels.render(family, params, root)
    sol = kda_kernels.load_solution(cand)
    fns, resources = {}, {}
    for name, alone in builds.items():
        built = sol.build(data, 1, T, H, (f"KDA_ALONE={alone}",))
        attrs = built.kernels["kda_fused_kernel"].attributes
        resources[name] = {"registers": attrs["num_regs"], "local_bytes": attrs["local_size_bytes"]}
        fns[name] = built.call
    ms = kda_kernels.time_alternating(fns, iters)
    chunks = -(-T // int(params.get("chunk", 64)))
    return {"candidate": cand.name,
            "builds": {n: {"ms": ms[n], "us_per_chunk": 1e3 * ms[n] / chunks, **resources[n]} for n in builds}}


def print_table(rows: list[dict]) -> None:
    names = list(rows[0]["builds"]) if rows else []
    print(f"{'configuration':<52} " + " ".join(f"{n + ' ms (us/chunk)':>22}" for n in names))
    for row in rows:
        cells = [f"{b['ms']:>10.4f} ({b['us_per_chunk']:>6.2f})" for b in row["builds"].values()]
        print(f"{row['config']:<52} " + " ".join(f"{c:>22}" for c in cells))
    print("registers / local bytes a thread: " + "; ".join(
        f"{n} {b['registers']}/{b['local_bytes']}" for n, b in rows[0]["builds"].items()) if rows else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", default=[], help="fused_tiles[:name=value,...] (repeatable)")
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--H", type=int, default=96)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default=None, help="write the JSON report here")
    ap.add_argument("--builds", default=",".join(BUILDS), help=f"which builds to time, of {','.join(BUILDS)}")
    args = ap.parse_args(argv)
    builds = {n: BUILDS[n] for n in args.builds.split(",") if n}
    if not builds or set(builds) - set(BUILDS):
        ap.error(f"--builds takes names of {', '.join(BUILDS)}")
    configs = [kda_kernels.parse_config(c) for c in (args.config or ["fused_tiles"])]
    if any(family != "fused_tiles" for family, _ in configs):
        ap.error("only the fused_tiles family has roles to time alone (KDA_ALONE)")
    data = kda_launch.random_inputs(1, args.T, args.H)
    root = Path(tempfile.mkdtemp(prefix="kda_roles_"))
    report = {"device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "T": args.T, "H": args.H,
              "iters": args.iters, "rows": []}
    for text, (family, params) in zip(args.config or ["fused_tiles"], configs):
        row = {"config": text, **time_roles(family, params, root, data, args.T, args.H, args.iters, builds)}
        report["rows"].append(row)
        print(f"{text}: " + ", ".join(f"{n} {b['ms']:.4f} ms" for n, b in row["builds"].items()),
              file=sys.stderr, flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1))
    print_table(report["rows"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
