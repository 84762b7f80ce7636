"""The leaderboard's columns, defined once: the terminal table, the JSON rows and the HTML
report all read `COLUMNS`, so a column added here shows up in each of them."""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from evolve.db.records import LeaderboardRow
from evolve.safe_text import safe_text


def _fmt(value: float | int | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def short_dir(directory: str | None) -> str:
    # Generated candidates live in gen/<digest>/: a short digest names them well enough.
    return PurePath(directory).name[:12] if directory else "-"


def short_card(device: str | None) -> str:
    # "NVIDIA H100 80GB HBM3" -> "H100 80GB HBM3": the maker is the same on every row.
    if not device:
        return "-"
    return device.removeprefix("NVIDIA ").strip() or device


def on_card(rows: Sequence[LeaderboardRow], card: str) -> list[LeaderboardRow]:
    """The rows whose bench ran on a card whose name holds `card` (any case; "H200" matches
    "NVIDIA H200"), ranked again among themselves."""
    want = card.casefold()
    kept = [r for r in rows if r.device and want in r.device.casefold()]
    return [r.model_copy(update={"rank": i}) for i, r in enumerate(kept, start=1)]


def cards_note(rows: Sequence[LeaderboardRow]) -> str | None:
    """A warning where the rows' benches ran on more than one kind of card."""
    cards = sorted({r.device for r in rows if r.device})
    if len(cards) < 2:
        return None
    names = ", ".join(short_card(c) for c in cards)
    return (f"these benches ran on {len(cards)} kinds of card ({names}): speedups compare only within one "
            f"(--card {short_card(cards[0]).split()[0]})")


@dataclass(frozen=True)
class Column:
    key: str                                  # the JSON key: a LeaderboardRow field or property
    header: str
    cell: Callable[[LeaderboardRow], str]     # the text shown in the table and the report
    numeric: bool = False                     # right-aligned
    in_text: bool = True                      # the terminal table leaves out what is too wide


COLUMNS: tuple[Column, ...] = (
    Column("rank", "rank", lambda r: str(r.rank), numeric=True),
    Column("candidate_id", "id", lambda r: str(r.candidate_id), numeric=True),
    Column("name", "name", lambda r: r.name or short_dir(r.directory)),
    Column("ms", "ms", lambda r: _fmt(r.ms, ".4f"), numeric=True),
    Column("baseline_ms", "baseline ms", lambda r: _fmt(r.baseline_ms, ".4f"), numeric=True),
    Column("speedup", "speedup", lambda r: f"{r.speedup:.3f}x", numeric=True),
    Column("spread", "spread", lambda r: ("-" if r.spread is None else f"{r.spread:.1%}") + (" noisy" if r.noisy else "")),
    Column("confirmed", "confirmed", lambda r: ("✓ best" if r.best else "✓") if r.confirmed else ""),
    Column("excessive_sectors", "excess sectors", lambda r: _fmt(r.excessive_sectors, ",d"), numeric=True),
    Column("device", "card", lambda r: short_card(r.device)),
    Column("source", "origin", lambda r: r.source),
    Column("directory", "directory", lambda r: r.directory, in_text=False),
)


def row_json(row: LeaderboardRow) -> dict[str, Any]:
    """The row as JSON: the columns' keys first (in table order), then every other field."""
    doc = row.model_dump(mode="json")
    doc["source"] = row.source
    return {**{c.key: doc[c.key] for c in COLUMNS}, **doc}


def format_table(rows: Sequence[LeaderboardRow]) -> str:
    """A plain-text table of the columns marked for the terminal."""
    columns = [c for c in COLUMNS if c.in_text]
    header = [c.header for c in columns]
    # Names and directories may be an agent's choice: no terminal controls through.
    body = [[safe_text(c.cell(r)) for c in columns] for r in rows]
    widths = [max(len(h), *(len(line[i]) for line in body)) if body else len(h) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if col.numeric else c.ljust(w)
                         for col, c, w in zip(columns, cells, widths)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(b) for b in body)])


def to_json(rows: Sequence[LeaderboardRow]) -> str:
    return json.dumps([row_json(r) for r in rows], indent=2)
