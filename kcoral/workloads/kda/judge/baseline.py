"""What speedups are measured against: fla's Triton chunk_kda when the server has it,
otherwise the workload's own fp32 chunked reference. Both expose the candidate interface
`setup(data, B, T, H) -> fn`."""
from __future__ import annotations

from typing import Callable

from .backend import Backend, write_into
from .harness import CandidateError
from .reference import chunked_f32
from .spec import WorkloadSpec


class ReferenceBaseline:
    """The judge's fp32 chunked reference as a candidate."""

    def __init__(self, be: Backend, spec: WorkloadSpec) -> None:
        self.be, self.spec = be, spec
        self.name = f"reference (fp32 chunked, {'CuPy' if be.device == 'cuda' else 'NumPy'}, chunk {spec.chunk})"

    def setup(self, data: dict, B: int, T: int, H: int, write_outputs: bool = True) -> Callable[[], None]:
        be, spec = self.be, self.spec  # the reference always writes its outputs

        def fn() -> None:
            out, state = chunked_f32(be.xp, data, spec.scale, spec.gate_floor, spec.norm_eps, spec.chunk)
            write_into(be.xp, data["output"], out)
            data["final_state"][...] = state

        return fn


class FlaBaseline:
    """fla's chunk_kda with the gate, beta-sigmoid and q/k L2 norm in kernel, lower bound
    -5 (gate = -5*sigmoid(exp(A_log)*(g+dt_bias)), our gate exactly), V-first state.

    Timed calls run chunk_kda alone; its outputs land in its own tensors (copying them into
    the judge's buffers would charge the baseline a copy the candidate does not pay). The
    judge checks the baseline once, with `write_outputs=True`, against the reference."""

    def __init__(self, be: Backend, spec: WorkloadSpec) -> None:
        import torch
        from fla.ops.kda import chunk_kda

        try:
            from importlib.metadata import version

            ver = version("fla-core")
        except Exception:  # noqa: BLE001 - the version is only a label
            ver = "?"
        self.torch, self.chunk_kda = torch, chunk_kda
        self.be, self.spec = be, spec
        self.name = f"fla chunk_kda (fla-core {ver}, Triton)"

    def _t(self, arr):
        # bf16 through an int16 view (same bits, a dtype every torch takes over DLPack).
        torch, xp = self.torch, self.be.xp
        if arr.dtype.itemsize == 2 and arr.dtype.kind not in "iu":
            return torch.from_dlpack(arr.view(xp.int16)).view(torch.bfloat16)
        return torch.from_dlpack(arr)

    def setup(self, data: dict, B: int, T: int, H: int, write_outputs: bool = False) -> Callable[[], None]:
        torch, spec = self.torch, self.spec
        t = {n: self._t(data[n]) for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state")}
        out_t = self._t(data["output"])
        state_t = self._t(data["final_state"])

        def fn():
            with torch.inference_mode():
                o, s = self.chunk_kda(
                    q=t["q"], k=t["k"], v=t["v"], g=t["g"], beta=t["beta"], scale=spec.scale,
                    initial_state=t["initial_state"], output_final_state=True,
                    use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                    use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=spec.gate_floor,
                    state_v_first=True, A_log=t["A_log"], dt_bias=t["dt_bias"],
                )
                if write_outputs:
                    out_t.copy_(o)
                    state_t.copy_(s.reshape(state_t.shape))
            return o, s

        return fn


def make_baseline(be: Backend, spec: WorkloadSpec) -> tuple[ReferenceBaseline | FlaBaseline, str]:
    """(baseline, note): the one the workload names. Never another in its place: a speedup
    over the fp32 reference (~100 ms on the H200) is not one over fla (~2.6 ms)."""
    if spec.baseline == "reference":
        return ReferenceBaseline(be, spec), ""
    if be.device != "cuda":
        raise CandidateError("unavailable", "the workload's baseline is fla, which needs a CUDA device")
    try:
        return FlaBaseline(be, spec), ""
    except Exception as exc:  # noqa: BLE001 - fla absent or broken here
        raise CandidateError(
            "unavailable", f"the workload's baseline is fla, and it does not load here ({type(exc).__name__}: {exc}). "
            "Install torch and fla-core where the server runs, or give the workload \"baseline\": \"reference\" "
            "to time against the fp32 reference instead (its speedups are not comparable with fla's)") from None
