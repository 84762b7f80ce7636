"""How fast an SM runs straight-line code of a given size, alone and with other SMs fetching too.

A KDA prep is tens of kilobytes of unrolled code run chunk after chunk. Where its loop is larger
than what an SM's own instruction caches hold, every pass fetches it again from a level the SMs
share, and whatever else runs on the GPU then slows it (kda_neighbours.py measured that). This
script finds both sizes: each kernel runs a loop of one dependent FMA chain spelled out as
SIZE kilobytes of distinct instructions, eight warps a CTA, one CTA an SM (200 KB of shared
memory each), on 1, 36 and all SMs at once, and prints the time of one instruction of a warp
against the smallest loop's. The knee over SIZE on one SM is the SM-private capacity; the
spread between one SM and all of them, at a size past it, is the cost of sharing the level
behind it.

    python3 benchmarks/icache_probe.py --sizes 8,16,32,48,64,96,128 --sms 1,36,132 --out icache.json
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy

SMEM = 200 * 1024        # one CTA an SM
THREADS = 256            # eight warps: two on each of the SM's four schedulers
INSTR_BYTES = 16         # every sm_90 instruction
TARGET_MS = 2.0


def loop_source(kilobytes: int, name: str = "loop") -> str:
    """A kernel `name` whose loop body is about `kilobytes` of FMAs (two a line, distinct constants
    and one dependent chain, so the compiler can neither fold nor reorder them away)."""
    pairs = kilobytes * 1024 // (2 * INSTR_BYTES)
    body = "".join(f"        a = fmaf(a, {1 + i * 1e-7:.9f}f, b); b = fmaf(b, {1 - i * 1e-7:.9f}f, a);\n"
                   for i in range(pairs))
    return (f'extern "C" __global__ void {name}(float* out, long long reps) {{\n'
            "    float a = threadIdx.x * 1e-3f, b = 1.f;\n"
            "    for (long long r = 0; r < reps; ++r) {\n" + body + "    }\n"
            "    if (a + b == 1.f) out[0] = a;\n}\n")


def instructions_of(kilobytes: int) -> int:
    return 2 * (kilobytes * 1024 // (2 * INSTR_BYTES))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4,8,16,24,32,48,64,96,128,192", help="loop sizes in KB")
    ap.add_argument("--sms", default="1,36,all", help="how many SMs run it at once ('all': every SM)")
    ap.add_argument("--out", default=None, help="write the JSON report here")
    args = ap.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
        asked = [s if s == "all" else int(s) for s in args.sms.split(",")]
    except ValueError:
        ap.error("--sizes takes integers, --sms integers or 'all'")
    if min(sizes) < 1 or any(c != "all" and c < 1 for c in asked):
        ap.error("sizes in KB and SM counts are at least 1")
    import cupy

    sm_count = cupy.cuda.Device().attributes["MultiProcessorCount"]
    counts = [sm_count if c == "all" else c for c in asked]
    if max(counts) > sm_count:
        ap.error(f"this GPU has {sm_count} SMs")
    out = cupy.zeros(1, cupy.float32)
    rows = []
    for kb in sizes:
        fn = cupy.RawModule(code=loop_source(kb)).get_function("loop")
        fn.max_dynamic_shared_size_bytes = SMEM

        def run(ctas: int, reps: int, fn=fn) -> float:
            e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
            e0.record()
            fn((ctas,), (THREADS,), (out, numpy.int64(reps)), shared_mem=SMEM)
            e1.record()
            e1.synchronize()
            return cupy.cuda.get_elapsed_time(e0, e1)

        run(1, 1)
        reps = max(1, int(TARGET_MS / max(run(1, 10) / 10, 1e-4)))
        row = {"kb": kb, "instructions": instructions_of(kb), "reps": reps, "ns_per_instruction": {}}
        for ctas in counts:
            ms = float(numpy.median([run(ctas, reps) for _ in range(5)]))
            row["ns_per_instruction"][str(ctas)] = ms * 1e6 / (reps * row["instructions"])
        rows.append(row)
        print(f"{kb} KB: timed", file=sys.stderr, flush=True)
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    base = rows[0]["ns_per_instruction"]
    print(f"{name}: ns per instruction of one warp (a dependent chain), {THREADS // 32} warps an SM; "
          f"(x) against the {rows[0]['kb']} KB loop on as many SMs")
    print(f"{'loop KB':>8} " + " ".join(f"{str(c) + ' SMs':>16}" for c in counts))
    for row in rows:
        cells = [f"{row['ns_per_instruction'][str(c)]:7.3f} ({row['ns_per_instruction'][str(c)] / base[str(c)]:4.2f}x)"
                 for c in counts]
        print(f"{row['kb']:>8} " + " ".join(f"{c:>16}" for c in cells))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": name, "sm_count": sm_count, "threads": THREADS, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
