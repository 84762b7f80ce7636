"""How much a KDA candidate slows down for what runs on the SMs it leaves idle.

fused_tiles puts one CTA per head on 96 of an H100's or H200's 132 SMs and, with side chunks,
a second kernel on the other 36. That kernel slowed the fused prep by about a third without
touching its SMs; this script finds out through which shared part of the GPU. It times each
configuration alone and beside a neighbour kernel holding every idle SM (one CTA of 1024
threads and 200 KB of shared memory each, launched first on its own stream, running about 4 ms,
longer than the call):

    fma    dependent FMAs in a loop: clocks and power only
    read   streaming loads through L2 (about 1.3 TB/s): DRAM and L2 bandwidth
    write  streaming stores (about 1.8 TB/s): the write path
    code   8,192 distinct dependent FMAs in a loop (icache_probe.py's), 128 KB of instructions, at
           the edge of what an SM's own instruction caches hold: the fetch path the SMs share
    side   the side prep kernel of --side-config (fused_tiles' defaults) alone: what the
           candidate's own side chunks put beside it

    python3 benchmarks/kda_neighbours.py --config fused_tiles:side_sixteenths=0 --iters 15 --out n.json

The configurations are kernels that leave SMs idle: fused_tiles points without side chunks (a
point's own side kernel would take the SMs the neighbour holds). Each number is the median of --iters calls timed by CUDA events on the candidate's stream (no L2
flush: the neighbours are what is compared). Prints a table; --out writes the JSON report.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy

sys.path.insert(0, str(Path(__file__).resolve().parent))
import icache_probe
import kda_kernels  # CuPy, the renderer and the inputs

cupy = kda_kernels.cupy
NEIGHBOURS = ("fma", "read", "write", "code", "side")
SMEM = 200 * 1024          # one neighbour CTA an SM, and none beside a fused CTA
CODE_KB = 128              # of straight-line code (icache_probe.py's loop)
TARGET_MS = 4.0            # each neighbour outlasts the call it runs beside

SOURCE = r"""
extern "C" __global__ void burn_fma(float* out, long long iters) {
    float a = threadIdx.x * 1e-3f, b = 1.f, c = .5f, d = .25f;
    for (long long i = 0; i < iters; ++i) {
        a = fmaf(a, .999f, .001f); b = fmaf(b, .999f, .001f); c = fmaf(c, .999f, .001f); d = fmaf(d, .999f, .001f);
    }
    if (a + b + c + d == 12345.f) out[0] = a;
}
extern "C" __global__ void burn_read(const float4* src, long long n, long long reps, float* out) {
    float acc = 0.f;
    for (long long r = 0; r < reps; ++r)
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
            const float4 v = __ldcg(src + i);
            acc += v.x + v.y + v.z + v.w;
        }
    if (acc == 12345.f) out[0] = acc;
}
extern "C" __global__ void burn_write(float4* dst, long long n, long long reps, float* out) {
    for (long long r = 0; r < reps; ++r)
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
            __stcg(dst + i, make_float4(r, i, 1.f, 2.f));
}
"""


def code_source() -> str:
    return icache_probe.loop_source(CODE_KB, name="burn_code")


class Neighbours:
    """The neighbour kernels on `ctas` SMs, each calibrated to run about TARGET_MS alone."""

    def __init__(self, ctas: int, side_call=None):
        mod = cupy.RawModule(code=SOURCE + code_source())
        self.kernels = {n: mod.get_function(f"burn_{n}") for n in ("fma", "read", "write", "code")}
        for k in self.kernels.values():
            k.max_dynamic_shared_size_bytes = SMEM
        self.ctas, self.side_call = ctas, side_call
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.out = cupy.zeros(1, cupy.float32)
        self.buf = cupy.ones(64 * 1024 * 1024, cupy.float32)   # 256 MB: past L2
        self.work = {"fma": 100_000, "read": 1, "write": 1, "code": 1}
        for name in self.work:   # scale each to TARGET_MS from one timed launch
            self.launch(name)
            self.work[name] = max(1, int(self.work[name] * TARGET_MS / self.time(name)))

    def launch(self, name: str) -> None:
        with self.stream:
            if name == "side":
                self.side_call()
                return
            k, n4 = self.kernels[name], self.buf.size // 4
            args = {"fma": (self.out, numpy.int64(self.work[name])),
                    "read": (self.buf, numpy.int64(n4), numpy.int64(self.work[name]), self.out),
                    "write": (self.buf, numpy.int64(n4), numpy.int64(self.work[name]), self.out),
                    "code": (self.out, numpy.int64(self.work[name]))}[name]
            k((self.ctas,), (1024,), args, shared_mem=SMEM)

    def time(self, name: str) -> float:
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        e0.record(self.stream)
        self.launch(name)
        e1.record(self.stream)
        e1.synchronize()
        return cupy.cuda.get_elapsed_time(e0, e1)


def time_beside(fn, neighbours: Neighbours | None, names: list[str], iters: int) -> dict[str, dict]:
    stream = cupy.cuda.Stream(non_blocking=True)
    times: dict[str, list[float]] = {n: [] for n in ["alone", *names]}
    for _ in range(iters):
        for name in times:   # alternated, so drift touches every column alike
            cupy.cuda.Device().synchronize()
            if name != "alone":
                neighbours.launch(name)
                time.sleep(3e-4)   # its CTAs hold the idle SMs before the call's launch
            e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
            with stream:
                e0.record(stream)
                fn()
                e1.record(stream)
            cupy.cuda.Device().synchronize()
            times[name].append(cupy.cuda.get_elapsed_time(e0, e1))
    return {n: {"median_ms": float(numpy.median(v)), "min_ms": float(min(v))} for n, v in times.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", default=[], help="FAMILY[:name=value,...] (repeatable)")
    ap.add_argument("--neighbours", default=",".join(NEIGHBOURS), help=f"of {','.join(NEIGHBOURS)}")
    ap.add_argument("--side-config", default="fused_tiles", help="whose side kernel the `side` neighbour runs")
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--H", type=int, default=96)
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--out", default=None, help="write the JSON report here")
    args = ap.parse_args(argv)
    names = [n for n in args.neighbours.split(",") if n]
    if not names or set(names) - set(NEIGHBOURS):
        ap.error(f"--neighbours takes names of {', '.join(NEIGHBOURS)}")
    data = kda_kernels.kda_launch.random_inputs(1, args.T, args.H)
    root = Path(tempfile.mkdtemp(prefix="kda_neighbours_"))
    ctas = cupy.cuda.Device().attributes["MultiProcessorCount"] - args.H
    if ctas < 1:
        ap.error(f"{args.H} heads leave no SM idle")
    side_call = None
    if "side" in names:   # the side kernel alone: its fused kernel's CTAs return as they start (KDA_ALONE=4)
        family, params = kda_kernels.parse_config(args.side_config)
        side_sol = kda_kernels.load_solution(kda_kernels.render(family, params, root))
        side_call = side_sol.build(data, 1, args.T, args.H, ("KDA_ALONE=4",)).call
    neighbours = Neighbours(ctas, side_call)
    report = {"device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "T": args.T, "H": args.H,
              "iters": args.iters, "idle_sms": ctas,
              "neighbour_ms_alone": {n: neighbours.time(n) for n in names}, "rows": []}
    for text in args.config or ["fused_tiles:side_sixteenths=0"]:
        family, params = kda_kernels.parse_config(text)
        fn = kda_kernels.load_solution(kda_kernels.render(family, params, root)).setup(data, 1, args.T, args.H)
        report["rows"].append({"config": text, "ms": time_beside(fn, neighbours, names, args.iters)})
        print(f"{text}: timed", file=sys.stderr, flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"{report['device']}, {ctas} idle SMs; neighbours alone: " +
          ", ".join(f"{n} {ms:.2f} ms" for n, ms in report["neighbour_ms_alone"].items()))
    cols = ["alone", *names]
    print(f"{'configuration':<44} " + " ".join(f"{c + ' ms':>16}" for c in cols))
    for row in report["rows"]:
        base = row["ms"]["alone"]["median_ms"]
        cells = [f"{row['ms'][c]['median_ms']:>8.4f} ({row['ms'][c]['median_ms'] / base:4.2f}x)" if c != "alone"
                 else f"{base:>16.4f}" for c in cols]
        print(f"{row['config']:<44} " + " ".join(f"{c:>16}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
