"""Loading a candidate inside its host process, and the failure a candidate can cause.

Only the host process (host.py) calls `load_solution`: the judge's own process never
imports candidate code."""
from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path
from types import ModuleType


class CandidateError(Exception):
    """The candidate failed to import, set up or run; `kind` is the failure kind."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def tail(limit: int = 4000) -> str:
    return traceback.format_exc()[-limit:]


def load_solution(cand_dir: Path, module_name: str = "kda_candidate") -> ModuleType:
    path = Path(cand_dir) / "solution.py"
    if not path.is_file():
        raise CandidateError("import", f"{Path(cand_dir).name}: no solution.py")
    # The candidate dir goes on sys.path so that its own helper modules import.
    sys.path.insert(0, str(Path(cand_dir).resolve()))
    try:
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"no loader for {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    except BaseException as exc:  # anything the candidate raises is its failure
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise CandidateError("import", f"importing solution.py failed:\n{tail()}") from None
    if not callable(getattr(module, "setup", None)):
        raise CandidateError("import", "solution.py has no callable setup(data, B, T, H)")
    return module
