"""`evolve run CONFIG`: the unattended search."""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from contextlib import nullcontext
from types import FrameType

from kcoral import Client, RemoteError

from evolve.commands.jsonout import add_json_flag, emit
from evolve.config import SET_HELP, ConfigError, load_config
from evolve.db import DB_HELP, SchemaVersionError, open_database
from evolve.embedded import EmbeddedServer, EmbeddedServerError
from evolve.events import EventHook
from evolve.families import FamilyError
from evolve.leaderboard_view import format_table, row_json
from evolve.loop import JOIN_LATEST, JoinError, RunSummary, SearchLoop
from evolve.preflight import PreflightError
from evolve.population import Population
from evolve.safe_text import SafeFormatter, safe_text


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="run the search described by a config file",
                              description="Evolutionary search over template families, evaluated on a "
                                          "KCoral server (an embedded one when no --remote is given).")
    p.add_argument("config", help="run config: a TOML file, or a built-in config's name (kda-cpu-small, kda-h200)")
    p.add_argument("--remote", default=None, help="KCoral server URL (default: $KCORAL_REMOTE, then the "
                                                   "config's remote.url, else an embedded server)")
    p.add_argument("--db", default=None, help=DB_HELP)
    p.add_argument("--resume", action="store_true",
                   help="continue this workload's last dead run: retry its interrupted evaluations")
    p.add_argument("--join", nargs="?", const=JOIN_LATEST, default=None, metavar="RUN",
                   help="work on a live run (id RUN, default: the workload's newest live run) with the processes "
                        "already on it, on this or other hosts sharing the database: each claims its own "
                        "candidates; the run ends when the last one leaves")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=SET_HELP)
    p.add_argument("--max-evals", type=int, default=None, help="override budget.max_evals")
    p.add_argument("--hours", type=float, default=None, help="override budget.hours")
    p.add_argument("--on-event", metavar="CMD", default=None,
                   help="shell command run on promotion, abort and finish; it gets the event as JSON "
                        "on stdin and in $EVOLVE_EVENT_JSON, its kind in $EVOLVE_EVENT")
    add_json_flag(p)
    p.set_defaults(func=main)


EXIT_ABORTED = 3  # the run stopped itself: preflight failed, or the circuit breaker tripped


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(args: argparse.Namespace) -> int:
    # Log records quote candidates (failures, render errors): their controls are escaped.
    handler = logging.StreamHandler()
    handler.setFormatter(SafeFormatter("evolve: %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    if args.max_evals is not None and args.max_evals < 1:
        print("evolve run: error: --max-evals must be at least 1", file=sys.stderr)
        return 2
    if args.hours is not None and args.hours <= 0:
        print("evolve run: error: --hours must be positive", file=sys.stderr)
        return 2
    if args.join is not None and args.resume:
        print("evolve run: error: --join works on a live run and --resume continues a dead one: pick one",
              file=sys.stderr)
        return 2
    if args.join not in (None, JOIN_LATEST) and not str(args.join).isdigit():
        print(f"evolve run: error: --join takes a run id, not {args.join!r}", file=sys.stderr)
        return 2
    try:
        config = load_config(args.config, args.overrides).with_budget(args.max_evals, args.hours)
        config.load_families()  # fail on a bad family before a server starts
    except (ConfigError, FamilyError) as exc:
        print(f"evolve run: error: {exc}", file=sys.stderr)
        return 2
    try:
        db = open_database(args.db)
    except SchemaVersionError as exc:
        print(f"evolve run: error: {exc}", file=sys.stderr)
        return 2
    pop = Population(db)
    # A scheduler's SIGTERM stops the run like Ctrl-C: the run is marked interrupted.
    signal.signal(signal.SIGTERM, _interrupt)
    url = args.remote or os.environ.get("KCORAL_REMOTE") or config.remote.url
    server = nullcontext(url) if url else EmbeddedServer(cpu_workers=config.remote.embedded_cpu_workers,
                                                         workload=config.workload_dir)
    try:
        with server as server_url:
            if not url:
                print(f"evolve: embedded server at {server_url}", file=sys.stderr)
            # One attempt per call: the pipeline owns the retries (evolve.pipeline.errors).
            with Client(server_url, retries=1) as client:
                summary = SearchLoop(config, client, pop, resume=args.resume, join=args.join,
                                     events=EventHook(args.on_event)).run()
    except JoinError as exc:
        print(f"evolve run: error: {exc}", file=sys.stderr)
        return 2
    except EmbeddedServerError as exc:
        print(safe_text(f"evolve run: error: {exc}"), file=sys.stderr)
        return 1
    except RemoteError as exc:   # the server's words may quote a candidate's output
        print(safe_text(f"evolve run: error: the server at {url or 'the embedded server'} failed: {exc}"),
              file=sys.stderr)
        return 1
    except PreflightError as exc:
        for problem in exc.problems:
            print(f"evolve run: preflight: {problem}", file=sys.stderr)
        print("evolve run: aborted before the first candidate (preflight failed)", file=sys.stderr)
        return EXIT_ABORTED
    except KeyboardInterrupt:
        print("\nevolve run: interrupted; continue with --resume", file=sys.stderr)
        return 130
    if args.json:
        emit({"summary": summary.model_dump(mode="json"),
              "leaderboard": [row_json(r) for r in pop.leaderboard(summary.workload_id)]})
    else:
        _print_summary(summary, pop)
    if summary.aborted:
        # Last, on stderr: the line a morning reader (or a scheduler's log) sees first.
        # The breaker's reason quotes the failing candidates' message.
        print(safe_text(f"evolve run: run {summary.run_id} {summary.stopped_because}"), file=sys.stderr)
        return EXIT_ABORTED
    return 0


def _print_summary(summary: RunSummary, pop: Population) -> None:
    who = f" (worker {summary.worker_id}, joined)" if summary.joined else ""
    print(f"run {summary.run_id}{who}: {summary.evaluated} evaluated, {summary.passed} passed, "
          f"{summary.promotions} promoted; stopped: {safe_text(summary.stopped_because)}")
    if summary.gpu_busy is not None:
        print(f"GPU lease held {summary.gpu_busy:.0%} of the run's wall time (the server's count, per GPU)")
    print(format_table(pop.leaderboard(summary.workload_id)))
