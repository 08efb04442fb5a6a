"""The ``gradtape`` command line: ``gradtape bench ...`` and ``gradtape cache [--clear]``.

Only this module is imported at startup; jax, torch, numba and autograd are imported by the
benchmark methods on first use, after ``pin_threads`` has set their thread environment.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from gradtape.bench import display, sampling, scaling
from gradtape.bench.environment import (
    machine,
    now_utc,
    pin_threads,
    runtime_thread_counts,
    versions,
)
from gradtape.bench.methods import METHODS, select_methods
from gradtape.bench.report import (
    NO_MATPLOTLIB,
    RunContext,
    build_tables,
    header_lines,
    results_document,
    write_outputs,
)
from gradtape.bench.runner import RunConfig, count_steps, run_benchmark
from gradtape.bench.workloads import PLANNED_WORKLOADS, WORKLOADS, select_workloads

QUICK_REPEAT, FULL_REPEAT = 5, 7
QUICK_BUDGET_S, FULL_BUDGET_S = 0.5, 10.0


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``gradtape`` parser with its subcommands."""
    parser = argparse.ArgumentParser(prog="gradtape", description="gradtape command line tools.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    bench = commands.add_parser(
        "bench",
        help="benchmark gradients: gradtape vs hand-written, numba, jax, torch, autograd",
        description="Time value-and-gradient of small NumPy workloads with every available "
        "method, after checking each gradient against a hand-written one.",
    )
    bench.add_argument(
        "--quick", action="store_true", help="small sizes and few repeats (well under 2 minutes)"
    )
    bench.add_argument(
        "--workload",
        dest="workloads",
        nargs="+",
        action="extend",
        metavar="NAME",
        choices=[*WORKLOADS, *PLANNED_WORKLOADS],
        help=f"workloads to run (default: all of {', '.join(WORKLOADS)})",
    )
    bench.add_argument(
        "--sizes",
        nargs="+",
        type=positive_int,
        metavar="N",
        help="sizes N for every selected workload (default: per workload)",
    )
    bench.add_argument(
        "--methods",
        nargs="+",
        action="extend",
        metavar="NAME",
        choices=list(METHODS),
        help=f"methods to run (default: all of {', '.join(METHODS)})",
    )
    bench.add_argument(
        "--out",
        type=Path,
        default=Path("bench-results"),
        help="directory for results.json, results.md and plots (default: bench-results)",
    )
    bench.add_argument(
        "--repeat",
        type=positive_int,
        metavar="K",
        help=f"timing samples per measurement (default: {QUICK_REPEAT} "
        f"with --quick, else {FULL_REPEAT})",
    )
    bench.add_argument(
        "--json",
        action="store_true",
        help="print the results document (what results.json holds) to stdout instead of the "
        "tables, for CI dashboards; progress stays on stderr",
    )
    sampling.add_arguments(bench)
    bench.set_defaults(handler=run_bench_command)
    cache = commands.add_parser(
        "cache",
        help="show or clear the numba backend's kernel cache",
        description="Show where the numba backend's kernel cache is and how much it holds; "
        "--clear removes every cached kernel (they are compiled again when next needed).",
    )
    cache.add_argument("--clear", action="store_true", help="remove every cached kernel")
    cache.set_defaults(handler=run_cache_command)
    scaling.add_parser(commands)
    return parser


def run_cache_command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``gradtape cache [--clear]``: the kernel cache's place and size; clear it."""
    from gradtape.compile.numba import cache

    if args.clear:
        print(f"removed {cache.clear()} cached kernel modules")
    directory, count, size = cache.usage()
    if directory is None:
        print("kernel cache: disabled (GRADTAPE_CACHE=0)")
    else:
        print(f"kernel cache: {directory}: {count} modules, {size / 2**20:.1f} MB")
    return 0


def run_bench_command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``gradtape bench``: pin threads, run, write the files, print the tables."""
    if args.sampling:
        return sampling.run(args)
    threads = pin_threads()
    date, started = now_utc(), time.perf_counter()
    requested = args.workloads or []
    for name in requested:
        if name in PLANNED_WORKLOADS:
            print(f"{name}: {PLANNED_WORKLOADS[name]}; not run", file=sys.stderr)
    runnable = [name for name in requested if name in WORKLOADS]
    if requested and not runnable:
        print("no runnable workload selected", file=sys.stderr)
        return 2
    workloads = select_workloads(runnable)
    methods = select_methods(args.methods)
    config = RunConfig(
        quick=args.quick,
        sizes=tuple(args.sizes) if args.sizes else None,
        repeat=args.repeat or (QUICK_REPEAT if args.quick else FULL_REPEAT),
        budget_s=QUICK_BUDGET_S if args.quick else FULL_BUDGET_S,
    )
    use_rich = display.rich_available()
    # rich draws its progress bar only on a terminal: redirected, plain lines show progress
    live_progress = use_rich and sys.stderr.isatty()
    total = count_steps(workloads, methods, config)
    with display.progress_display(total, live_progress) as sink:
        run = run_benchmark(workloads, methods, config, sink)
    threads["after_run"] = runtime_thread_counts()
    # the output directory is this machine's path: the recorded results name it by its role
    flags = {
        k: "OUT_DIR" if k == "out" else str(v) if isinstance(v, Path) else v
        for k, v in vars(args).items()
        if k != "handler"
    }
    context = RunContext(
        date=date,
        command=shlex.join(["gradtape", *_without_out_dir(argv)]),
        flags=flags,
        machine=machine(),
        threads=threads,
        versions=versions(),
        wall_time_s=time.perf_counter() - started,
    )
    paths = write_outputs(run, context, args.out)
    if args.json:
        print(json.dumps(results_document(run, context), indent=1, allow_nan=False))
    else:
        display.print_report(header_lines(run, context), build_tables(run), use_rich)
    if NO_MATPLOTLIB in run.notes:
        print(NO_MATPLOTLIB, file=sys.stderr)
    print(
        f"\nWrote {', '.join(str(p) for p in paths)}", file=sys.stderr if args.json else sys.stdout
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gradtape`` script; ``argv`` defaults to ``sys.argv[1:]``."""
    for stream in (sys.stdout, sys.stderr):  # lines appear as they are printed, also redirected
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)
    argv = [str(arg) for arg in (sys.argv[1:] if argv is None else argv)]
    args = build_parser().parse_args(argv)
    return args.handler(args, argv)


def _without_out_dir(argv: Sequence[str]) -> list[str]:
    """The command line with the --out directory replaced by OUT_DIR (no machine paths)."""
    out, skip = [], False
    for a in argv:
        if skip:
            out.append("OUT_DIR")
            skip = False
        elif a == "--out":
            out.append(a)
            skip = True
        elif a.startswith("--out="):
            out.append("--out=OUT_DIR")
        else:
            out.append(a)
    return out
