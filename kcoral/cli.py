"""`kcoral` command line: one subcommand per module in `kcoral.commands`.

Each command module exposes `register(subparsers)` (adds its parser and sets
`func`) so that this file only lists names; modules are imported lazily-cheap.
The few option groups that several tools share (server, sends) live here too.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kcoral.client import Client

# subcommand name -> module under kcoral.commands
COMMANDS: dict[str, str] = {
    "status": "status",
    "python": "python",
    "ncu": "ncu",
    "iket": "iket",
    "iket-analyze": "iket_analyze",
    "ncu-metrics": "ncu_metrics",
    "bench": "bench",
    "baseline-cache": "baseline_cache",
}

# Exit statuses of the tools themselves (a remote app's own status passes through).
EXIT_USAGE = 2
EXIT_TIMEOUT = 124  # the remote app ran past its time limit (as timeout(1) does)
EXIT_TOOL_FAILURE = 125  # the server refused or failed the request, or could not be reached
EXIT_INTERRUPTED = 130  # Ctrl-C (as a shell reports SIGINT)


def build_parser() -> argparse.ArgumentParser:
    from kcoral.version import version_text

    parser = argparse.ArgumentParser(prog="kcoral", description="KCoral client tools")
    parser.add_argument("--version", action="version", version=version_text())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMANDS.values():
        qualified = f"kcoral.commands.{module_name}"
        try:
            module = importlib.import_module(qualified)
        except ModuleNotFoundError as exc:
            # A command whose module is not there (yet) is left out; any other missing
            # import is a real error and propagates.
            if exc.name == qualified:
                continue
            raise
        module.register(sub)
    return parser


def add_remote_options(parser: argparse.ArgumentParser) -> None:
    """--remote (default $KCORAL_REMOTE) and --token-file (default $KCORAL_TOKEN)."""
    from kcoral.token import add_token_options

    parser.add_argument("--remote", default=os.environ.get("KCORAL_REMOTE"), metavar="URL",
                        help="server URL (default: $KCORAL_REMOTE)")
    add_token_options(parser)


def add_send_options(parser: argparse.ArgumentParser, default_timeout: float = 600) -> None:
    """--send DIR[:SUBDIR] (repeatable), -e NAME[=VALUE] (repeatable), --timeout S."""
    parser.add_argument("--send", action="append", default=[], metavar="DIR[:SUBDIR]",
                        help="local directory to send (repeatable); :SUBDIR places it there")
    parser.add_argument("-e", "--env", action="append", default=[], metavar="NAME[=VALUE]",
                        help="environment variable for the remote app (repeatable); "
                             "NAME alone takes the local value")
    parser.add_argument("--timeout", type=float, default=default_timeout, metavar="S",
                        help=f"time limit in seconds (default {default_timeout:g})")


def make_client(args: argparse.Namespace) -> "Client":
    from kcoral.client import Client
    from kcoral.errors import ToolInputError
    from kcoral.token import TokenFileError, token_from_args

    if not args.remote:
        raise ToolInputError("no server given: use --remote URL or set KCORAL_REMOTE")
    try:
        token = token_from_args(args)
    except TokenFileError as exc:
        raise ToolInputError(str(exc)) from None
    return Client(args.remote, token=token)


def fail(message: str, code: int = EXIT_TOOL_FAILURE) -> int:
    print(f"kcoral: {message}", file=sys.stderr)
    return code


def echo_run(result: Any) -> None:
    """Print a remote app's stdout and stderr locally, plus what the runner noticed."""
    if result.stdout:
        sys.stdout.write(result.stdout)
        if not result.stdout.endswith("\n"):
            sys.stdout.write("\n")
        sys.stdout.flush()
    if result.stderr:
        sys.stderr.write(result.stderr)
        if not result.stderr.endswith("\n"):
            sys.stderr.write("\n")
    for name, flag in (("stdout", result.stdout_truncated), ("stderr", result.stderr_truncated)):
        if flag:
            print(f"kcoral: remote {name} was truncated (its middle was dropped)", file=sys.stderr)
    for name in result.ignored_env:
        print(f"kcoral: the server ignored {name} from the client", file=sys.stderr)
    sys.stderr.flush()


def exit_status(result: Any) -> int:
    """The remote app's status as a local one: 124 on timeout, 128+N for signal N."""
    if result.timed_out:
        print(f"kcoral: the remote app ran past its time limit and was stopped "
              f"after {result.elapsed_s:.1f} s", file=sys.stderr)
        return EXIT_TIMEOUT
    code = int(result.exit_code)
    if code < 0:
        print(f"kcoral: the remote app was killed by signal {-code}", file=sys.stderr)
        return 128 - code
    return code


def write_local_files(root: str, files: dict[str, bytes]) -> list[str]:
    """Write returned files under ``root`` (paths re-checked here: nothing escapes it)."""
    from kcoral.runners.sandboxed import ArchiveError, PathError, normalize_path

    written = []
    for rel, data in sorted(files.items()):
        try:
            norm = normalize_path(rel, allow_root=True)
        except PathError as exc:
            raise ArchiveError(str(exc)) from None
        target = os.path.join(root, *norm.split("/"))
        current = root
        for part in norm.split("/")[:-1]:  # never create or write under a link
            current = os.path.join(current, part)
            if os.path.islink(current):
                raise ArchiveError(f"refusing to write {rel!r} through the symbolic link {current}")
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        if os.path.islink(target):
            os.unlink(target)  # replace a link rather than write through it
        with open(target, "wb") as fh:
            fh.write(data)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # Everything after a bare `--` is the remote application's argv, untouched.
    app: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, app = argv[:cut], argv[cut + 1 :]
    # Some tools (ncu) pass their unknown options through to the remote program.
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "accepts_extra", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    args.app = app
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    from kcoral.archive import ArchiveError
    from kcoral.errors import NcuError, RemoteError, ToolInputError
    from kcoral.iket import IketError

    try:
        code = args.func(args)
    except (ToolInputError, ArchiveError) as exc:
        return fail(f"error: {exc}", EXIT_USAGE)
    except RemoteError as exc:
        rid = f" (request {exc.request_id})" if exc.request_id else ""
        return fail(f"remote failure [{exc.kind}]{rid}: {exc.message}")
    except (IketError, NcuError, OSError) as exc:
        return fail(f"error: {exc}", 1)
    except KeyboardInterrupt:
        # The interrupted call closed its connection: the server stops the program.
        return fail("interrupted; the remote program is cancelled", EXIT_INTERRUPTED)
    return int(code or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
