"""Terminal output: a progress display while the benchmark runs, then the tables.

Uses ``rich`` when it is installed and plain lines otherwise.  Progress goes to stderr and the
tables to stdout, so ``gradtape bench > table.txt`` keeps only the tables.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

from gradtape.bench.report import COLUMNS, Table, format_seconds
from gradtape.bench.runner import OK, ProgressSink


def rich_available() -> bool:
    """Whether rich can be imported (the plain-text fallback is used otherwise)."""
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


class PlainProgress:
    """One line per finished measurement: '[12/144] eam N=100 torch: 41.2 µs'."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total, self.count, self.label = total, 0, ""
        self.stream = stream if stream is not None else sys.stderr

    def begin(self, label: str) -> None:
        self.label = label

    def done(self, measurement: Any) -> None:
        self.count += 1
        outcome = (
            format_seconds(measurement.median_s) if measurement.status == OK else measurement.status
        )
        print(f"[{self.count}/{self.total}] {self.label}: {outcome}", file=self.stream, flush=True)


class RichProgress:
    """A rich progress bar whose description is the measurement under way."""

    def __init__(self, progress: Any, total: int) -> None:
        self.progress = progress
        self.task = progress.add_task("starting", total=total)

    def begin(self, label: str) -> None:
        self.progress.update(self.task, description=label)

    def done(self, measurement: Any) -> None:
        self.progress.advance(self.task)


@contextmanager
def progress_display(total: int, use_rich: bool) -> Iterator[ProgressSink]:
    """A progress sink for ``run_benchmark``, shown on stderr for the duration of the block."""
    if not use_rich:
        yield PlainProgress(total)
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("{task.description:<40}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        yield RichProgress(progress, total)


def print_report(header: Sequence[str], tables: Sequence[Table], use_rich: bool) -> None:
    """Print the header lines and every table to stdout."""
    if not use_rich:
        print("\n".join(header))
        for table in tables:
            print(f"\n{table.title}\n{plain_table(table)}")
            print("\n".join(table.footnotes))
        return
    from rich.console import Console
    from rich.table import Table as RichTable

    console = Console()
    for line in header:
        console.print(line, highlight=False, markup=False)
    for table in tables:
        rich_table = RichTable(title=table.title, title_justify="left", show_lines=False)
        for name in COLUMNS:
            rich_table.add_column(
                name, justify="left" if name in ("method", "note") else "right", overflow="fold"
            )
        for index, row in enumerate(table.rows):
            rich_table.add_row(*row, end_section=index in table.section_ends)
        console.print()
        console.print(rich_table)
        for note in table.footnotes:
            console.print(note, highlight=False, markup=False)


def plain_table(table: Table) -> str:
    """The table in fixed-width columns, for terminals without rich."""
    widths = [max(len(row[i]) for row in (COLUMNS, *table.rows)) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(COLUMNS, widths, strict=True))]
    lines += [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in table.rows
    ]
    return "\n".join(line.rstrip() for line in lines)
