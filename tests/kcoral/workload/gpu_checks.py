"""GPU checks of the workload, usable as a script (prints a table) and from test_gpu.py.

    python tests/kcoral/workload/gpu_checks.py                 # on a machine with CuPy and a GPU
    python tests/kcoral/workload/gpu_checks.py --direct-bench  # the bench of scratch/reference, no server

1. The CuPy fp32 chunked reference against the CuPy float64 recurrence, per regime, at the
   scored H, K, V and a ragged length; and against the NumPy reference on the same inputs.
2. The reference at the full scored shape: finite, and its time per call.
3. fla's chunk_kda (when importable) against the reference: same semantics or not.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

KDA = Path(__file__).resolve().parents[3] / "kcoral" / "workloads" / "kda"
if str(KDA) not in sys.path:
    sys.path.insert(0, str(KDA))

from judge.backend import bf16_to_f32, make_backend  # noqa: E402
from judge.compare import check_output  # noqa: E402
from judge.inputs import regime_inputs  # noqa: E402
from judge.reference import chunked_f32, recurrence_f64  # noqa: E402
from judge.spec import REGIMES, load_spec  # noqa: E402

SPEC = load_spec(KDA / "forward_b1_t8192_h96" / "workload.json")


def _rms(xp, x, y) -> float:
    x, y = x.astype(xp.float64), y.astype(xp.float64)
    return float(xp.sqrt(xp.mean((x - y) ** 2)) / (xp.sqrt(xp.mean(y * y)) + 1e-8))


def reference_vs_f64(T: int = 321) -> list[tuple[str, float, float, float]]:
    """(regime, output rms ratio vs f64, state rms ratio vs f64, output rms ratio GPU vs NumPy)."""
    import numpy as np

    be = make_backend("cuda")
    xp = be.xp
    rows = []
    for regime in ("scored",) + REGIMES:
        inp = regime_inputs(be, SPEC, T, 17, regime)
        o64, s64 = recurrence_f64(xp, inp, SPEC.scale)
        o32, s32 = chunked_f32(xp, inp, SPEC.scale, chunk=SPEC.chunk)
        host = {k: be.to_host(v) for k, v in inp.items()}
        on, _ = chunked_f32(np, host, SPEC.scale, chunk=SPEC.chunk)
        rows.append((regime, _rms(xp, bf16_to_f32(xp, o32), o64), _rms(xp, s32, s64),
                     _rms(np, bf16_to_f32(np, on), be.to_host(bf16_to_f32(xp, o32)))))
    return rows


def reference_full_shape(calls: int = 5) -> tuple[float, bool]:
    """(median ms per call of chunked_f32 at the scored shape, all finite)."""
    be = make_backend("cuda")
    xp = be.xp
    inp = regime_inputs(be, SPEC, SPEC.T, 1, "mixed_depth")
    out, state = chunked_f32(xp, inp, SPEC.scale, chunk=SPEC.chunk)  # warm-up (kernel compiles)
    be.sync()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        out, state = chunked_f32(xp, inp, SPEC.scale, chunk=SPEC.chunk)
        be.sync()
        times.append((time.perf_counter() - t0) * 1e3)
    finite = bool(xp.isfinite(bf16_to_f32(xp, out)).all()) and bool(xp.isfinite(state).all())
    return sorted(times)[len(times) // 2], finite


def fla_vs_reference(T: int = 1024) -> dict | None:
    """fla against the reference on mixed-depth inputs; None when fla does not import."""
    be = make_backend("cuda")
    xp = be.xp
    try:
        from judge.baseline import FlaBaseline

        fla = FlaBaseline(be, SPEC)
    except Exception as exc:  # noqa: BLE001
        return {"available": False, "why": f"{type(exc).__name__}: {exc}"}
    res = {"available": True, "name": fla.name}
    for regime in ("scored", "saturated", "mixed_depth", "random_depth"):
        inp = regime_inputs(be, SPEC, T, 23, regime)
        out = xp.empty((1, T, SPEC.H, SPEC.V), dtype=inp["q"].dtype)
        state = xp.empty((1, SPEC.H, SPEC.V, SPEC.K), dtype=xp.float32)
        fla.setup(dict(inp, output=out, final_state=state, scale=SPEC.scale), 1, T, SPEC.H, write_outputs=True)()
        be.sync()
        ro, rs = chunked_f32(xp, inp, SPEC.scale, chunk=SPEC.chunk)
        vo = check_output(xp, "output", out, ro, SPEC.tolerance)
        vs = check_output(xp, "final_state", state, rs, SPEC.tolerance)
        # the transposed state too: a layout mix-up shows as a large ratio here and a small one there
        vt = check_output(xp, "final_state^T", xp.ascontiguousarray(state.swapaxes(-1, -2)), rs, SPEC.tolerance)
        res[regime] = {"ok": vo.ok and vs.ok, "output_rms": vo.rms_ratio, "state_rms": vs.rms_ratio,
                       "state_T_rms": vt.rms_ratio, "detail": "; ".join(d for d in (vo.detail, vs.detail) if d)}
    return res


def direct_bench(timeout_s: float = 140, workload: str = "forward_b1_t8192_h96") -> int:
    """The official bench of scratch/reference without a server: the same runner and judge,
    seeds drawn here (for a GPU host where the server cannot start)."""
    import os
    import secrets
    import tempfile

    from judge import runner
    from kcoral.bench import BenchReport, format_lines
    from kcoral.bench.staging import bench_archive, load_workload

    wl = load_workload(KDA / workload)
    archive = bench_archive(wl, wl.root / "scratch" / "reference")
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        out = runner.bench(archive, [secrets.randbits(64) for _ in range(wl.holdout_count)],
                           {"timeout_s": timeout_s, "holdout_source": "client", "candidate_name": "scratch/reference"})
    if out["report"] is None:
        print(out["runner_error"], out["log"][-3000:])
        return 1
    rep = BenchReport.from_judge(out["report"], log=out["log"])
    print("\n".join(format_lines(rep)))
    print(rep.log[-2500:])
    return 0 if rep.passed else 1


def main() -> int:
    if "--direct-bench" in sys.argv:
        return direct_bench()
    be = make_backend("cuda")
    print(f"device: {be.name}")
    print("| regime | output vs f64 | state vs f64 | GPU vs NumPy output |")
    print("|---|---|---|---|")
    ok = True
    for regime, ro, rs, rn in reference_vs_f64():
        print(f"| {regime} | {ro:.2e} | {rs:.2e} | {rn:.2e} |")
        ok &= ro < 4e-3 and rs < 1e-4
    ms, finite = reference_full_shape()
    print(f"reference chunked_f32 full shape (1x8192x96x128): {ms:.1f} ms/call (median of 5), finite={finite}")
    ok &= finite
    print(f"fla: {fla_vs_reference()}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
