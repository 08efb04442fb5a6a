"""Turn a ``BenchRun`` into tables and files: results.json, results.md and one PNG per workload.

The tables are built once (``build_tables``) as plain strings and then rendered to Markdown here
and to the terminal in ``display``, so the README table and the terminal table never differ.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradtape.bench.runner import ABSENT, OK, SKIPPED, BenchRun, Measurement

COLUMNS = ("N", "method", "median", "×numpy", "×best peer", "1st call", "note")


@dataclass(frozen=True)
class RunContext:
    """Facts about the run that are not measurements: when, how, where and with what."""

    date: str
    command: str
    flags: dict[str, Any]
    machine: dict[str, Any]
    threads: dict[str, Any]
    versions: dict[str, str]
    wall_time_s: float | None = None


@dataclass
class Table:
    """One workload's results as rows of strings, grouped by N (``section_ends``)."""

    workload: str
    title: str
    rows: list[tuple[str, ...]] = field(default_factory=list)
    section_ends: list[int] = field(default_factory=list)
    footnotes: list[str] = field(default_factory=list)


def format_seconds(seconds: float | None) -> str:
    """Three significant digits with a unit: '850 ns', '5.95 µs', '12.5 ms', '1.20 s'."""
    if seconds is None or not math.isfinite(seconds):
        return ""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return _three_digits(seconds / scale, unit)
    return _three_digits(seconds * 1e9, "ns")


def _three_digits(value: float, unit: str) -> str:
    return f"{value:.0f} {unit}" if value >= 100 else f"{value:#.3g} {unit}"


def format_ratio(ratio: float | None) -> str:
    """'0.85×', '12.3×', '410×': enough digits to compare, no more."""
    if ratio is None:
        return ""
    return f"{ratio:.2f}×" if ratio < 10 else f"{ratio:.1f}×" if ratio < 100 else f"{ratio:.0f}×"


def _row(m: Measurement) -> tuple[str, ...]:
    if m.status == OK:
        shown, note = format_seconds(m.median_s), ""
    else:
        shown, note = m.status, m.detail if len(m.detail) <= 70 else m.detail[:69] + "…"
    return (
        str(m.size),
        m.method,
        shown,
        format_ratio(m.ratio_to_numpy),
        format_ratio(m.ratio_to_best_peer),
        format_seconds(m.first_call_s),
        note,
    )


def build_tables(run: BenchRun) -> list[Table]:
    """One table per workload: a row per (N, method) that ran; absent/skipped go to footnotes."""
    tables = []
    for workload in run.workloads:
        table = Table(workload.name, f"{workload.name}: {workload.description}")
        best_peers: list[str] = []
        skipped: dict[str, list[str]] = {}
        for size in run.sizes_of(workload.name):
            row = [m for m in run.measurements if m.workload == workload.name and m.size == size]
            shown = [m for m in row if m.status not in (ABSENT, SKIPPED)]
            table.rows.extend(_row(m) for m in shown)
            if shown:
                table.section_ends.append(len(table.rows) - 1)
            best = next((m.best_peer for m in row if m.best_peer), None)
            best_peers.append(f"N={size}: {best or 'none'}")
            for m in row:
                if m.status == SKIPPED:
                    skipped.setdefault(m.method, []).append(str(size))
        table.footnotes.append(f"N = {workload.size_meaning}. Best peer: {'; '.join(best_peers)}.")
        table.footnotes.extend(
            f"{method} skipped at N = {', '.join(sizes)} (input too large for it)."
            for method, sizes in skipped.items()
        )
        tables.append(table)
    return tables


def header_lines(run: BenchRun, context: RunContext) -> list[str]:
    """The lines above the tables: date, command, machine, threads, versions, method, absent."""
    machine, threads = context.machine, context.threads
    used = {"python", "numpy"} | {
        system for m in run.methods if m.name not in run.absent for system in m.systems
    }
    versions = ", ".join(f"{k} {v}" for k, v in context.versions.items() if k in used)
    blas = threads.get("blas")
    blas_text = (
        ", ".join(f"{pool['api']} {pool['num_threads']}" for pool in blas)
        if isinstance(blas, list)
        else str(blas)
    )
    after_run_text = ", ".join(f"{k} {v}" for k, v in threads.get("after_run", {}).items()) or "-"
    peers = ", ".join(m.name for m in run.methods if m.peer)
    lines = [
        f"Date: {context.date}",
        f"Command: {context.command} (wall time {format_seconds(context.wall_time_s)})",
        f"Machine: {machine['cpu']}, {machine['logical_cores']} logical cores "
        f"({machine['usable_cores']} usable), {machine['platform']}",
        "Threads: pinned to 1 for every system (OMP/OPENBLAS/MKL/NUMBA_NUM_THREADS=1, "
        "XLA_FLAGS single-threaded Eigen, torch.set_num_threads(1) when loaded; "
        f"BLAS via threadpoolctl: {blas_text}; counts read after the run: {after_run_text})",
        f"Versions: {versions}",
        f"Timing: median of up to {run.config.repeat} samples, each ≥ "
        f"{run.config.min_sample_s * 1e3:g} ms of back-to-back calls (timeit, GC off), after a "
        "warm-up (for gradtape's methods: until kernels and loop drivers compiling in the "
        "background are ready); every method computes value and gradient, checked against the "
        "hand-written NumPy gradient before it is timed (WRONG = not timed).",
        f"Columns: ×numpy = time / plain f(x) (value only); ×best peer = time / fastest correct "
        f"of {peers}; 1st call = first call alone, with tracing and JIT compilation (the jax_jit "
        "compile time), not in the median.",
    ]
    lines.extend(f"Absent: {name} ({reason})" for name, reason in run.absent.items())
    lines.extend(f"Note: {note}" for note in run.notes)
    return lines


def _markdown_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


# methods left out of the summary: the numerical baselines are far off every other scale
SUMMARY_LEFT_OUT = ("finite_diff", "complex_step")


def summary_table(run: BenchRun) -> list[str]:
    """Markdown lines of one table: a row per (workload, N), a column per method that ran,
    each cell the median time per call ('error'/'WRONG' when the method failed there)."""
    methods = [
        m.name
        for m in run.methods
        if m.name not in SUMMARY_LEFT_OUT
        and any(x.method == m.name and x.status not in (ABSENT, SKIPPED) for x in run.measurements)
    ]
    lines = [
        _markdown_row(["workload", "N", *methods]),
        _markdown_row([":---", "---:", *("---:" for _ in methods)]),
    ]
    for workload in run.workloads:
        for size in run.sizes_of(workload.name):
            cells = {
                m.method: format_seconds(m.median_s) if m.status == OK else m.status
                for m in run.measurements
                if m.workload == workload.name and m.size == size
            }
            row = [cells.get(name, "") for name in methods]
            lines.append(_markdown_row([workload.name, str(size), *row]))
    return lines


PLAIN_PRODUCT_BUILDS = {"gradtape_compiled_plain": "numpy", "gradtape_numba_plain": "numba"}
"""Methods that build a compiled gradient with plain products, and their backend."""


def nan_safe_cost_lines(run: BenchRun) -> list[str]:
    """Markdown lines: what the NaN-safe products of derivative rules cost on each backend, as
    the compiled gradient's time over the same build with plain products
    (``gradtape_compiled_plain``, ``gradtape_numba_plain``), the two timed in turn (the median
    of the per-round ratios), per workload and N where both ran. Empty when no pair ran."""
    ratios = {
        (m.method, m.workload, m.size): m.interleaved_ratio
        for m in run.measurements
        if m.method in PLAIN_PRODUCT_BUILDS and m.status == OK and m.interleaved_ratio
    }
    lines = []
    for plain, backend in PLAIN_PRODUCT_BUILDS.items():
        cells = [
            f"{workload.name} N={size}: {format_ratio(ratios[plain, workload.name, size])}"
            for workload in run.workloads
            for size in run.sizes_of(workload.name)
            if (plain, workload.name, size) in ratios
        ]
        if cells:
            lines += [
                "",
                f"NaN-safe products, {backend} backend ({plain.removesuffix('_plain')} / "
                f"{plain}: the same compiled gradient with plain products, timed in turn; "
                "median of per-round ratios): " + ", ".join(cells) + ".",
            ]
    return lines


def render_markdown(run: BenchRun, context: RunContext, tables: Sequence[Table]) -> str:
    """results.md: the header as a list, a summary table of medians (workloads by methods),
    then each workload's table, footnotes and plot."""
    parts = ["# gradtape benchmark", ""]
    parts.extend(f"- {line}" for line in header_lines(run, context))
    parts += ["", "## Summary: median time per call", ""]
    parts.extend(summary_table(run))
    parts.extend(nan_safe_cost_lines(run))
    for table in tables:
        parts += ["", f"## {table.workload}", "", f"`{table.title}`", ""]
        parts.append(_markdown_row(COLUMNS))
        parts.append(_markdown_row(["---:", ":---", "---:", "---:", "---:", "---:", ":---"]))
        parts.extend(_markdown_row(row) for row in table.rows)
        parts.append("")
        parts.extend(table.footnotes)
        parts += ["", f"![{table.workload}]({table.workload}.png)"]
    return "\n".join(parts) + "\n"


def _finite_or_none(value: Any) -> Any:
    return value if not isinstance(value, float) or math.isfinite(value) else None


def results_document(run: BenchRun, context: RunContext) -> dict[str, Any]:
    """Everything for results.json: raw samples, medians, ratios, versions, machine, flags."""
    config = run.config
    return {
        "schema_version": 1,
        "date": context.date,
        "command": context.command,
        "wall_time_s": context.wall_time_s,
        "flags": context.flags,
        "machine": context.machine,
        "threads": context.threads,
        "versions": context.versions,
        "timing": {
            "statistic": "median of samples; a sample is the mean of `number` back-to-back calls",
            "repeat": config.repeat,
            "min_sample_s": config.min_sample_s,
            "budget_s": config.budget_s,
            "seed": config.seed,
        },
        "workloads": {
            w.name: {
                "description": w.description,
                "size_meaning": w.size_meaning,
                "sizes": run.sizes_of(w.name),
            }
            for w in run.workloads
        },
        "methods": {
            m.name: {
                "description": m.description,
                "peer": m.peer,
                "rtol": m.rtol,
                "max_input_size": m.max_input_size,
                "absent": run.absent.get(m.name),
            }
            for m in run.methods
        },
        "absent": run.absent,
        "notes": run.notes,
        "results": [
            {k: _finite_or_none(v) for k, v in m.to_json().items()} for m in run.measurements
        ],
    }


NO_MATPLOTLIB = (
    'matplotlib not installed: no plots written (pip install matplotlib, or "gradtape[bench]")'
)


def absent_line(run: BenchRun) -> str:
    """'not run (absent): jax_jit, torch', or '' when every method ran."""
    return f"not run (absent): {', '.join(run.absent)}" if run.absent else ""


def write_plots(run: BenchRun, out_dir: Path) -> list[Path]:
    """One log-log PNG per workload (time vs N, a line per method); none if no matplotlib.

    Written whatever methods ran: a plot names the methods that were absent (a peer that is
    not installed) below its axes, so a plot without JAX's line says why. Without matplotlib
    the run's notes say that no plots were written and how to get them.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        run.notes.append(NO_MATPLOTLIB)
        return []
    missing = absent_line(run)
    markers = "os^vD<>pP*Xh"
    colors = [*(f"C{i}" for i in range(10)), "navy", "maroon"]
    written = []
    for workload in run.workloads:
        figure = Figure(figsize=(7.5, 4.8), layout="constrained")
        FigureCanvasAgg(figure)
        axes = figure.add_subplot()
        for index, method in enumerate(run.methods):
            points = [
                (m.size, m.median_s)
                for m in run.measurements
                if m.workload == workload.name and m.method == method.name and m.median_s
            ]
            if points:
                sizes, times = zip(*points, strict=True)
                axes.plot(
                    sizes,
                    times,
                    marker=markers[index % len(markers)],
                    label=method.name,
                    color="black" if method.name == "numpy" else colors[index % len(colors)],
                    linestyle="--" if method.name == "numpy" else "-",
                )
        axes.set(
            xscale="log",
            yscale="log",
            title=workload.name,
            xlabel=f"N = {workload.size_meaning}",
            ylabel="median time per call [s]",
        )
        axes.grid(True, which="both", alpha=0.3)
        if missing:
            figure.text(0.01, 0.005, missing, fontsize="x-small", va="bottom", wrap=True)
        if axes.lines:
            axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
        path = out_dir / f"{workload.name}.png"
        figure.savefig(path, dpi=110)
        written.append(path)
    return written


def write_outputs(run: BenchRun, context: RunContext, out_dir: Path) -> list[Path]:
    """Write results.json, results.md and the plots into ``out_dir``; return the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = write_plots(run, out_dir)
    json_path, markdown_path = out_dir / "results.json", out_dir / "results.md"
    json_path.write_text(
        json.dumps(results_document(run, context), indent=1, allow_nan=False), encoding="utf-8"
    )
    markdown_path.write_text(render_markdown(run, context, build_tables(run)), encoding="utf-8")
    return [json_path, markdown_path, *plots]
