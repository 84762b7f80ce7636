"""Candidate-derived text made safe to show on the orchestrator's terminal.

Candidates are hostile. Their failure messages, logs and names are stored as they came and
printed by evolve; a raw ESC in them can move the cursor and overwrite lines (a forged
`bench passed`), an OSC sequence can set the window title or the clipboard, and a bidi
override reorders what the reader sees. `safe_text` replaces each such character with a
visible escape (`\\x1b`, `\\u202e`), keeping newlines and tabs. Text shown through Rich must
also not be read as markup: print it as `rich.text.Text(safe_text(...))`.

What is stored in the database stays as it came; only what is shown is changed.
"""
from __future__ import annotations

import logging
import re

# C0 controls but tab and newline; DEL and C1 (0x9b is a one-byte CSI); bidi marks,
# embeddings, overrides and isolates (U+061C, U+200E-F, U+202A-E, U+2066-9).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def safe_text(text: str) -> str:
    """`text` with every terminal control and bidi character shown as an escape."""
    return _UNSAFE.sub(_visible, text)


def safe_line(text: str) -> str:
    """`safe_text` for a one-line context, newlines shown too: a candidate's newline there
    would start a line the reader takes for evolve's own (a forged `#12 bench passed`)."""
    return safe_text(text).replace("\n", "\\n")


class SafeFormatter(logging.Formatter):
    """A log formatter for the terminal: log records quote candidates' messages too."""

    def format(self, record: logging.LogRecord) -> str:
        return safe_text(super().format(record))
