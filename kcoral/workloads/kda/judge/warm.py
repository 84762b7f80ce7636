"""Fill a baseline compile cache: `python -m judge.warm WORKLOAD_JSON CACHE_DIR`.

The operator of a server runs this once per machine (through `kcoral baseline-cache`),
outside any request, and gives the folder to the server as `--trusted-cache`. It starts
the judge's own trusted host, exactly as a bench does (same code, same environment, so the
same Triton cache keys), with CACHE_DIR as its caches, and calls the baseline on the
workload's shape until its kernels are compiled and autotuned. A bench's trusted host then
starts from a copy of CACHE_DIR/triton instead of compiling fla again (about 100 s on the
H200), and no candidate ever had a way to write into it."""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from .backend import make_backend
from .calls import Session
from .hostproc import HostProcess, Snapshot
from .inputs import regime_inputs
from .judge import PACKAGE
from .memory import Arena
from .spec import load_spec


def warm(spec_path: Path, cache: Path, calls: int = 2) -> dict:
    spec = load_spec(spec_path)
    raw = json.loads(spec_path.read_text())
    be = make_backend(spec.device)
    arena = Arena(be)
    logs = Path(tempfile.mkdtemp(prefix="kda-warm-logs-"))
    cache.mkdir(parents=True, exist_ok=True)
    host = HostProcess(arena, Snapshot(PACKAGE), "trusted", spec.device, logs, "warm", cache_dir=cache)
    t0 = time.monotonic()
    try:
        loaded = host.request({"op": "load", "spec": raw}, timeout=900)
        make = (lambda: regime_inputs(be, spec, spec.T, 1))
        session = Session(be, spec, arena, host, spec.T, make(), which="baseline")
        session.batch([make] * calls)
    finally:
        host.close()
        arena.free_all()
        shutil.rmtree(logs, ignore_errors=True)
    files = [p for p in (cache / "triton").rglob("*") if p.is_file()] if (cache / "triton").is_dir() else []
    return {"baseline": loaded.get("name"), "workload": spec.name, "seconds": round(time.monotonic() - t0, 1),
            "triton_files": len(files), "triton_bytes": sum(p.stat().st_size for p in files)}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m judge.warm WORKLOAD_JSON CACHE_DIR", file=sys.stderr)
        return 2
    print(json.dumps(warm(Path(argv[0]), Path(argv[1]).resolve())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
