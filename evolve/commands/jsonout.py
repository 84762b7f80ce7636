"""`--json` for every evolve command: one JSON document on stdout, nothing else there
(progress and errors stay on stderr), so a script or an agent reads results directly."""
from __future__ import annotations

import argparse
import json
from typing import Any

JSON_HELP = "print one JSON document on stdout instead of text"


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help=JSON_HELP)


def emit(doc: Any) -> None:
    print(json.dumps(doc, indent=2, default=str))
