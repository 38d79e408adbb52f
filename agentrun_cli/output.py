"""How every command prints: `-o table|json|jsonl`, tables with headers, notes on stderr.

Temporal's convention: `table` (the default) is for people, `json` is one JSON
document (an array for a list), `jsonl` is one compact JSON object a line (for
`jq -c`, streams and `--follow`). Messages are rendered by protobuf's
json_format with the proto field names, so the JSON keys are the API's.

A command module plugs in with three calls:

    output.emit(args, message, lines)              # one object: its lines, or its JSON
    output.emit_list(args, items, COLUMNS, empty)  # a list: a table, an array or lines
    output.emit_stream(args, events, line)         # a stream: a line or a JSON object each

Tables are drawn by rich, with colour only when stdout is a terminal and
NO_COLOR is unset; piped, a table is plain aligned text (upper-case headers,
two spaces between columns, no trailing blanks), stable for `awk` and `grep`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from agentrun_cli import render

FORMATS = ("table", "json", "jsonl")


def add_options(parser: argparse.ArgumentParser, defaults: bool) -> None:
    """`-o/--output` and its old spelling `--json` (= `-o json`)."""
    parser.add_argument(
        "-o",
        "--output",
        choices=FORMATS,
        default=None if defaults else argparse.SUPPRESS,
        help="table (default), json (one document) or jsonl (one object a line)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=False if defaults else argparse.SUPPRESS,
        help="the same as -o json",
    )


def settle(args: argparse.Namespace) -> None:
    """Fix `args.output` (and `args.json`, true for both JSON forms) after parsing."""
    chosen = getattr(args, "output", None)
    args.output = chosen or ("json" if getattr(args, "json", False) else "table")
    args.json = args.output != "table"


def fmt(args: argparse.Namespace) -> str:
    return getattr(args, "output", None) or ("json" if getattr(args, "json", False) else "table")


def note(text: str) -> None:
    """A message for the person at the terminal, on stderr: stdout stays data."""
    print(text, file=sys.stderr, flush=True)


# --- one object --------------------------------------------------------------


def emit(args: argparse.Namespace, value: Any, lines: Iterable[str]) -> None:
    """`value` as JSON (indented for json, one line for jsonl), else the readable `lines`."""
    form = fmt(args)
    if form == "table":
        for line in lines:
            print(line)
    elif form == "jsonl" and isinstance(value, list):
        for item in value:
            print(render.to_json(item), flush=True)
    else:
        print(render.to_json(value, indent=2 if form == "json" else None), flush=True)


def emit_stream(args: argparse.Namespace, items: Iterable[Any], line: Callable[[Any], str]) -> None:
    """Each item as it comes: one JSON object a line (json or jsonl), else `line(item)`."""
    for item in items:
        print(line(item) if fmt(args) == "table" else render.to_json(item), flush=True)


# --- lists -------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """One table column: its header, how to get a cell from an item, how to show it."""

    header: str
    cell: Callable[[Any], Any]
    right: bool = False
    style: Callable[[Any], str] | None = None
    """The rich style of a cell (terminal only), from the item."""


def emit_list(
    args: argparse.Namespace, items: Sequence[Any], columns: Sequence[Column], empty: str
) -> None:
    """A list: a table with headers, one JSON array, or one JSON object a line.

    `empty` says why nothing is listed and what to do; it goes to stderr (a
    table on stdout stays empty, an empty JSON list stays `[]`).
    """
    form = fmt(args)
    if form == "json":
        print(render.to_json(list(items), indent=2), flush=True)
    elif form == "jsonl":
        for item in items:
            print(render.to_json(item), flush=True)
    elif items:
        print_table(items, columns)
    if not items:
        note(empty)


def colour() -> bool:
    """Colour (and rich's boxes) only on a terminal, and never with NO_COLOR set."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def print_table(items: Sequence[Any], columns: Sequence[Column]) -> None:
    rows = [[_text(c.cell(item)) for c in columns] for item in items]
    if colour():
        _rich_table(items, rows, columns)
    else:
        for line in plain_table(rows, columns):
            print(line)
    sys.stdout.flush()


def plain_table(rows: Sequence[Sequence[str]], columns: Sequence[Column]) -> list[str]:
    """Aligned text: upper-case headers, two spaces between columns, no trailing blanks."""
    table = [[c.header.upper() for c in columns], *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
    out = []
    for row in table:
        cells = [
            cell.rjust(w) if col.right else cell.ljust(w)
            for cell, w, col in zip(row, widths, columns, strict=True)
        ]
        out.append("  ".join(cells).rstrip())
    return out


def _rich_table(items: Sequence[Any], rows: list[list[str]], columns: Sequence[Column]) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, header_style="bold", pad_edge=False)
    for c in columns:
        table.add_column(c.header.upper(), justify="right" if c.right else "left", no_wrap=True)
    for item, row in zip(items, rows, strict=True):
        styles = [c.style(item) if c.style else "" for c in columns]
        table.add_row(
            *(
                f"[{s}]{_escape(v)}[/]" if s else _escape(v)
                for v, s in zip(row, styles, strict=True)
            )
        )
    # Only called when stdout is a terminal and NO_COLOR is unset (colour()).
    Console(highlight=False, force_terminal=True).print(table)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _text(value: Any) -> str:
    text = "-" if value is None or value == "" else str(value)
    return " ".join(text.split()) if "\n" in text or "\t" in text else text
