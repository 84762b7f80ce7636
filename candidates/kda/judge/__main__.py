"""Entry point: `python -m judge ROOT` in a directory holding judge/, workload.json,
candidate/ (and against/). Reads {"holdout_seeds", "holdout_source", ...} as JSON on stdin
(never from a file or the environment, where the candidate could look) and writes the
report as one JSON document to the stdout it was started with. Everything printed while it
runs, the candidate's prints included, goes to stderr."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> int:
    request = json.loads(sys.stdin.read() or "{}")
    sys.stdin.close()
    # Keep the real stdout for the report; fd 1 now points at stderr for everyone else.
    report_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    from judge.judge import Judge

    report = Judge(root, request.get("holdout_seeds") or [], request.get("holdout_source", "server"),
                   request).run()
    with os.fdopen(report_fd, "w") as fh:
        json.dump(report, fh)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
