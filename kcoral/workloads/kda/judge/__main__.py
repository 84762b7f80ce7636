"""Entry point: `python -m judge ROOT` in a directory holding judge/, workload.json,
candidate/ (and against/). Reads {"holdout_seeds", "holdout_source", "report_key", ...} as
JSON on stdin (never from a file or the environment, where a candidate could look) and
writes {"report": ..., "mac": ...} as one JSON document to the stdout it was started with,
the report signed with the runner's one-time key: a report from anywhere else (a host
writing to an inherited or reopened pipe) does not verify. Everything printed while it
runs goes to stderr; candidates print into their hosts' logs."""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import sys
from pathlib import Path


def sign(report: dict, key: str) -> dict:
    body = json.dumps(report, sort_keys=True)
    return {"report": report, "mac": hmac.new(key.encode(), body.encode(), hashlib.sha256).hexdigest()}


# Modules of the package that the judge's process never runs.
NOT_THE_JUDGES = ("__main__", "runner", "test_small")


def _import_whole_package(root: Path) -> None:
    """Every module of the judge now, before any candidate runs: one imported later would be
    read from files a candidate's host (the judge's uid) may have edited by then. Then the
    bench folder leaves sys.path, so that no module imported later (the standard library's,
    say) can be shadowed by a file planted there."""
    import importlib
    import pkgutil

    import judge

    for mod in pkgutil.iter_modules(judge.__path__):
        if mod.name not in NOT_THE_JUDGES:
            importlib.import_module(f"judge.{mod.name}")
    here = {str(root), os.path.realpath(root), os.getcwd(), os.path.realpath(os.getcwd())}
    sys.path[:] = [p for p in sys.path if p and os.path.realpath(p) not in here]


def main() -> int:
    request = json.loads(sys.stdin.read() or "{}")
    sys.stdin.close()
    key = str(request.pop("report_key", ""))
    # Keep the real stdout for the report; fd 1 now points at stderr for everyone else,
    # and the report's descriptor is not inherited by any host.
    report_fd = os.dup(1)
    os.set_inheritable(report_fd, False)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    # The judge's own CuPy kernels (references, checks, the pre-roll) compile into memory,
    # never through a cache folder a candidate's host could have planted cubins in.
    os.environ["CUPY_CACHE_IN_MEMORY"] = "1"
    _import_whole_package(root)
    from judge.judge import Judge

    report = Judge(root, request.get("holdout_seeds") or [], request.get("holdout_source", "server"),
                   request).run()
    with os.fdopen(report_fd, "w") as fh:
        json.dump(sign(report, key), fh)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
