"""`--on-event CMD`: a shell command run on promotion, abort and finish, so an unattended
run can page someone. It gets the event as JSON on stdin and its kind in $EVOLVE_EVENT; a
failing or slow hook is logged, never fatal to the run."""
from __future__ import annotations

import json
import logging
import os
import subprocess
from enum import StrEnum
from typing import Any

log = logging.getLogger(__name__)
HOOK_TIMEOUT_S = 30.0


class EventKind(StrEnum):
    PROMOTION = "promotion"
    ABORT = "abort"
    FINISH = "finish"


class EventHook:
    def __init__(self, command: str | None):
        self.command = command

    def emit(self, kind: EventKind, **payload: Any) -> None:
        if not self.command:
            return
        doc = json.dumps({"event": kind.value, **payload}, default=str)
        env = dict(os.environ, EVOLVE_EVENT=kind.value, EVOLVE_EVENT_JSON=doc)
        try:
            done = subprocess.run(self.command, shell=True, input=doc, text=True, env=env,
                                  timeout=HOOK_TIMEOUT_S, capture_output=True)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("--on-event hook for %s failed: %s", kind.value, exc)
            return
        if done.returncode != 0:
            log.warning("--on-event hook for %s exited %s: %s", kind.value, done.returncode,
                        done.stderr.strip()[-500:])
