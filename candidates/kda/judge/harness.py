"""Loading a candidate and calling it under the judge's rules.

The judge owns the inputs and the output buffers. Before each checked call it can rewrite
the inputs in place with fresh values, it poisons both outputs with NaN, and after the
call it verifies that the inputs are bit-identical and that the candidate still writes
into the judge's buffers.
"""
from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path

from .backend import BF16, Backend, bits_view, poison, write_into
from .inputs import INPUT_NAMES
from .spec import WorkloadSpec


class CandidateError(Exception):
    """The candidate failed to import, set up or run; `kind` is the failure kind."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def _tail(limit: int = 4000) -> str:
    text = traceback.format_exc()
    return text[-limit:]


def load_solution(cand_dir: Path, module_name: str):
    path = Path(cand_dir) / "solution.py"
    if not path.is_file():
        raise CandidateError("import", f"{cand_dir.name}: no solution.py")
    # The candidate dir goes on sys.path so that its own helper modules import.
    sys.path.insert(0, str(Path(cand_dir).resolve()))
    return _exec_solution(path, module_name)


def _exec_solution(path: Path, module_name: str):
    try:
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - anything the candidate raises is its failure
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise CandidateError("import", f"importing solution.py failed:\n{_tail()}") from None
    if not callable(getattr(module, "setup", None)):
        raise CandidateError("import", "solution.py has no callable setup(data, B, T, H)")
    return module


class Prepared:
    """One `setup` of a candidate at one length T, with the judge's buffers."""

    def __init__(self, be: Backend, spec: WorkloadSpec, module, inputs: dict, T: int) -> None:
        xp = be.xp
        self.be, self.spec, self.T = be, spec, T
        self.inputs = inputs
        self.output = xp.empty((spec.B, T, spec.H, spec.V), dtype=BF16)
        self.final_state = xp.empty((spec.B, spec.H, spec.V, spec.K), dtype=xp.float32)
        poison(xp, self.output)
        poison(xp, self.final_state)
        self.data = dict(inputs)
        self.data.update(output=self.output, final_state=self.final_state, scale=float(spec.scale))
        try:
            fn = module.setup(self.data, spec.B, T, spec.H)
            be.sync()
        except BaseException as exc:  # noqa: BLE001
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise CandidateError("import", f"setup(data, B={spec.B}, T={T}, H={spec.H}) raised:\n{_tail()}") from None
        if not callable(fn):
            raise CandidateError("import", f"setup returned {type(fn).__name__}, not a callable")
        self.fn = fn
        # What setup's own warm-up left in the buffers: a later call that returns exactly
        # this on other inputs replays it.
        xp = be.xp
        self.setup_output = bits_view(xp, self.output).copy()
        self.setup_q = bits_view(xp, inputs["q"]).copy()

    def refill(self, fresh: dict) -> None:
        """Rewrite every input buffer in place (same objects the candidate captured)."""
        for name in INPUT_NAMES:
            write_into(self.be.xp, self.inputs[name], fresh[name])

    def call(self) -> list[str]:
        """Poison, call once, synchronise; return integrity problems (empty if none)."""
        xp = self.be.xp
        before = {n: bits_view(xp, self.inputs[n]).copy() for n in INPUT_NAMES}
        poison(xp, self.output)
        poison(xp, self.final_state)
        try:
            self.fn()
            self.be.sync()
        except BaseException as exc:  # noqa: BLE001
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise CandidateError("runtime", f"fn() raised:\n{_tail()}") from None
        problems = []
        changed = [n for n in INPUT_NAMES if not bool((bits_view(xp, self.inputs[n]) == before[n]).all())]
        if changed:
            problems.append(f"the call changed its inputs: {', '.join(changed)}")
        for key, buf in (("output", self.output), ("final_state", self.final_state)):
            if self.data.get(key) is not buf:
                problems.append(f"data[{key!r}] was replaced; outputs must be written into the given buffers")
        return problems


class ScopedCandidate:
    """A candidate with its own view of helper modules, for two candidates in one process
    (--against): rendered candidates share file names (helpers, kernels), and without this
    the second would silently import the first one's. Each `setup` and `fn` call runs with
    this candidate's directory first on sys.path and its helper modules in sys.modules."""

    def __init__(self, cand_dir: Path, module_name: str) -> None:
        self.dir = str(Path(cand_dir).resolve())
        self.own: dict = {}
        path = Path(cand_dir) / "solution.py"
        if not path.is_file():
            raise CandidateError("import", f"{Path(cand_dir).name}: no solution.py")
        with self._active(scan=True):
            self.module = _exec_solution(path, module_name)
        if not callable(getattr(self.module, "setup", None)):
            raise CandidateError("import", "solution.py has no callable setup(data, B, T, H)")

    def _enter(self) -> dict:
        saved = {name: sys.modules.get(name) for name in self.own}
        sys.modules.update(self.own)
        sys.path.insert(0, self.dir)
        return saved

    def _exit(self, saved: dict, scan: bool) -> None:
        sys.path.remove(self.dir)
        if scan:  # adopt what this candidate imported from its own directory
            prefix = self.dir + "/"
            for name, mod in list(sys.modules.items()):
                if str(getattr(mod, "__file__", "") or "").startswith(prefix):
                    self.own[name] = mod
                    saved.setdefault(name, None)
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod

    class _Scope:
        def __init__(self, owner: "ScopedCandidate", scan: bool) -> None:
            self.owner, self.scan = owner, scan

        def __enter__(self):
            self.saved = self.owner._enter()

        def __exit__(self, *exc):
            self.owner._exit(self.saved, self.scan)
            return False

    def _active(self, scan: bool) -> "ScopedCandidate._Scope":
        return ScopedCandidate._Scope(self, scan)

    def setup(self, data: dict, B: int, T: int, H: int):
        with self._active(scan=True):
            fn = self.module.setup(data, B, T, H)
        if not callable(fn):
            return fn  # Prepared reports it

        def scoped_fn():
            with self._active(scan=False):
                return fn()

        return scoped_fn
