"""Where the `kcoral` tools take the bearer token from: `$KCORAL_TOKEN` or a file.

Never from the command line: argv is readable by every local user (`ps`,
`/proc/*/cmdline`) and lands in shell histories and job logs.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .errors import KcoralError

REFUSED_MESSAGE = ("--token is not accepted: a token on the command line is visible to every local user; "
                   "set $KCORAL_TOKEN or give --token-file F")


class TokenFileError(KcoralError, ValueError):
    """The token file cannot be read or is empty."""


class _RefuseToken(argparse.Action):
    """Fails on `--token VALUE` without echoing VALUE (argparse would otherwise take
    `--token` as an abbreviation of `--token-file` and name the token as a file)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        parser.error(REFUSED_MESSAGE)


def add_token_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--token-file", default=None, metavar="F",
                        help="file holding the bearer token (default: $KCORAL_TOKEN)")
    parser.add_argument("--token", nargs="?", action=_RefuseToken, help=argparse.SUPPRESS)


def read_token_file(path: str | Path) -> str:
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise TokenFileError(f"--token-file {path}: {exc.strerror or exc}") from None
    if not token:
        raise TokenFileError(f"--token-file {path}: the file is empty")
    return token


def token_from_args(args: argparse.Namespace) -> str | None:
    """The file's token when --token-file is given; None lets the client use $KCORAL_TOKEN."""
    path = getattr(args, "token_file", None)
    return read_token_file(path) if path else None
