"""Tests of ``gradtape bench``: files, statuses, references; fast, and jax/torch are optional."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gradtape as gt
from gradtape.bench import display
from gradtape.bench.cli import main
from gradtape.bench.methods import METHODS, Absent, Method, complex_step, require
from gradtape.bench.report import (
    RunContext,
    build_tables,
    format_seconds,
    header_lines,
    render_markdown,
)
from gradtape.bench.runner import ABSENT, ERROR, OK, SKIPPED, WRONG, RunConfig, run_benchmark
from gradtape.bench.workloads import GRADTAPE, PLANNED_WORKLOADS, WORKLOADS

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TINY = RunConfig(sizes=(10,), repeat=2, min_sample_s=1e-4, budget_s=0.2)


@pytest.fixture(autouse=True)
def restore_environ():
    """``gradtape bench`` pins threads through os.environ; undo that after each test."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def make_method(name: str, call_factory, peer: bool = False) -> Method:
    """A test method whose prepared call is ``call_factory(workload, problem)``."""
    return Method(name, f"test method {name}", call_factory, peer=peer)


def fake_context() -> RunContext:
    return RunContext(
        date="2000-01-01T00:00:00+00:00",
        command="gradtape bench (test)",
        flags={},
        machine={"cpu": "test cpu", "logical_cores": 1, "usable_cores": 1, "platform": "test"},
        threads={"blas": "test"},
        versions={"python": "3", "numpy": np.__version__},
    )


def test_cli_writes_json_markdown_and_png(tmp_path: Path) -> None:
    methods = ["numpy", "hand_numpy", "gradtape", "finite_diff", "complex_step"]
    argv = [
        "bench",
        "--quick",
        "--sizes",
        "10",
        "--workload",
        "sum_exp",
        "--methods",
        *methods,
        "--repeat",
        "2",
        "--out",
        tmp_path,
    ]
    assert main(argv) == 0

    document = json.loads((tmp_path / "results.json").read_text())
    for key in (
        "date",
        "command",
        "flags",
        "machine",
        "threads",
        "versions",
        "timing",
        "workloads",
        "methods",
        "absent",
        "results",
    ):
        assert key in document
    assert document["threads"]["env"]["OMP_NUM_THREADS"] == "1"
    assert document["workloads"]["sum_exp"]["sizes"] == [10]
    results = {r["method"]: r for r in document["results"]}
    assert set(results) == set(methods)
    baseline = results["numpy"]
    assert baseline["status"] == OK and baseline["ratio_to_numpy"] == 1.0
    assert len(baseline["samples_s"]) >= 1 and baseline["median_s"] > 0
    assert results["hand_numpy"]["ratio_to_best_peer"] == 1.0
    assert results["gradtape"]["status"] in (OK, ABSENT, ERROR, WRONG)

    markdown = (tmp_path / "results.md").read_text()
    assert "| N | method | median | ×numpy | ×best peer | 1st call | note |" in markdown
    assert "| 10 | hand_numpy |" in markdown
    assert "Threads: pinned to 1" in markdown
    # the summary: one row per (workload, N), a column per method that ran
    summary = markdown.split("## Summary: median time per call")[1].split("\n## ")[0]
    header, _, row = [line for line in summary.strip().splitlines()][:3]
    ran = [
        m
        for m in methods
        if results[m]["status"] != ABSENT and m not in ("finite_diff", "complex_step")
    ]
    assert header == "| workload | N | " + " | ".join(ran) + " |"
    assert row.startswith("| sum_exp | 10 | ")
    assert row.split(" | ")[2 + ran.index("numpy")] == format_seconds(baseline["median_s"])
    if importlib.util.find_spec("matplotlib") is None:  # plots are optional, like the extra
        assert any(n.startswith("matplotlib not installed: no plots") for n in document["notes"])
    else:
        assert (tmp_path / "sum_exp.png").read_bytes().startswith(PNG_SIGNATURE)


def test_wrong_method_is_reported_and_not_timed() -> None:
    calls = []

    def wrong_gradient(workload, problem):
        def call():
            calls.append(1)
            value, grad = workload.hand_value_and_grad(problem.x, *problem.consts)
            return value, 2 * grad

        return call

    methods = [METHODS["numpy"], METHODS["hand_numpy"], make_method("wrong", wrong_gradient)]
    run = run_benchmark([WORKLOADS["sum_exp"]], methods, TINY)

    wrong = next(m for m in run.measurements if m.method == "wrong")
    assert wrong.status == WRONG and "gradient off" in wrong.detail
    assert wrong.samples_s == [] and wrong.median_s is None and wrong.number == 0
    assert len(calls) == 1  # the checking call only
    markdown = render_markdown(run, fake_context(), build_tables(run))
    assert "| 10 | wrong | WRONG |" in markdown


def test_absent_and_failing_methods_do_not_stop_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now fails

    def raises(workload, problem):
        def call():
            raise RuntimeError("boom\nsecond line")

        return call

    def missing(workload, problem):
        require("gradtape_no_such_module")
        raise AssertionError("unreachable")

    methods = [
        METHODS["numpy"],
        METHODS["torch"],
        make_method("missing", missing, peer=True),
        make_method("raises", raises),
        METHODS["hand_numpy"],
    ]
    run = run_benchmark(
        [WORKLOADS["eam"]], methods, RunConfig(sizes=(10, 20), repeat=1, min_sample_s=1e-4)
    )

    by_method = {(m.method, m.size): m for m in run.measurements}
    for size in (10, 20):
        assert by_method["torch", size].status == ABSENT
        assert by_method["missing", size].status == ABSENT
        assert by_method["raises", size].status == ERROR
        assert by_method["raises", size].detail == "RuntimeError: boom"
        assert by_method["hand_numpy", size].status == OK
    assert "cannot import torch" in run.absent["torch"]
    assert "gradtape_no_such_module" in run.absent["missing"]
    header = "\n".join(header_lines(run, fake_context()))
    assert "Absent: torch (cannot import torch" in header
    plain = "\n".join(display.plain_table(t) for t in build_tables(run))
    assert "error" in plain and "torch" not in plain  # absent methods are listed, not rowed


def test_plain_text_fallback(capsys: pytest.CaptureFixture) -> None:
    methods = [METHODS["numpy"], METHODS["hand_numpy"]]
    progress = display.PlainProgress(total=2)
    run = run_benchmark([WORKLOADS["sum_exp"]], methods, TINY, progress)
    display.print_report(header_lines(run, fake_context()), build_tables(run), use_rich=False)
    captured = capsys.readouterr()
    assert "[2/2] sum_exp N=10 hand_numpy: " in captured.err
    assert "Threads: pinned to 1" in captured.out
    assert "N   method      median" in captured.out
    assert "10  hand_numpy" in captured.out


def test_planned_workload_is_not_faked(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(PLANNED_WORKLOADS, "future_model", "planned: waits for a feature")
    assert main(["bench", "--workload", "future_model", "--out", str(tmp_path)]) == 2
    assert "future_model: planned" in capsys.readouterr().err
    assert not (tmp_path / "results.json").exists()


def test_rnn_scan_runs_each_system_with_its_own_loop() -> None:
    """gradtape and JAX run their scan, the rest the Python loop; every gradient checks out."""
    workload = WORKLOADS["rnn_scan"]
    problem = workload.problem(6)
    scan_tape = str(gt.trace(workload.numpy_function(problem, GRADTAPE), problem.x))
    loop_tape = str(gt.trace(workload.numpy_function(problem), problem.x))
    assert " scan" in scan_tape and loop_tape.count(" tanh ") == 6
    assert " scan" not in loop_tape and scan_tape.count(" tanh ") == 0

    names = [
        "numpy",
        "hand_numpy",
        "gradtape",
        "gradtape_compiled",
        "gradtape_unrolled",
        "jax_jit",
        "torch",
        "autograd",
        "finite_diff",
    ]
    methods = [METHODS[name] for name in names]
    run = run_benchmark(
        [workload, WORKLOADS["sum_exp"]],
        methods,
        RunConfig(sizes=(6,), repeat=1, min_sample_s=1e-4, budget_s=0.1),
    )
    status = {(m.workload, m.method): m.status for m in run.measurements}
    for name in ("numpy", "hand_numpy", "gradtape", "gradtape_compiled", "gradtape_unrolled"):
        assert status["rnn_scan", name] == OK
    for name in ("jax_jit", "torch", "autograd"):  # optional peers
        assert status["rnn_scan", name] in (OK, ABSENT)
    assert status["rnn_scan", "finite_diff"] == SKIPPED  # len(x) = 1024
    assert ("sum_exp", "gradtape_unrolled") not in status  # only where there is a loop variant
    assert status["sum_exp", "gradtape"] == OK


@pytest.mark.parametrize("workload", WORKLOADS.values(), ids=WORKLOADS.keys())
def test_references_agree_with_complex_step_and_loop_kernel(workload) -> None:
    """The hand gradients are the yardstick of every method, so check them independently."""
    problem = workload.problem(7)
    value, grad = workload.hand_value_and_grad(problem.x, *problem.consts)
    _, numeric_grad = complex_step(workload.numpy_function(problem), problem.x)
    loop_value, loop_grad = workload.loop_kernel(problem.x, *problem.consts)
    assert value == pytest.approx(float(workload.numpy_function(problem)(problem.x)), rel=1e-12)
    np.testing.assert_allclose(grad, numeric_grad, rtol=1e-10)
    assert loop_value == pytest.approx(value, rel=1e-12)
    np.testing.assert_allclose(loop_grad, grad, rtol=1e-12)


def test_import_does_not_load_bench_or_heavy_systems() -> None:
    """``import gradtape`` stays light; the CLI module itself defers the heavy imports too."""
    code = (
        "import sys, gradtape\n"
        "heavy = sys.argv[1:]\n"
        "print([m for m in heavy if m in sys.modules])\n"
        "import gradtape.bench.cli\n"
        "print([m for m in heavy[1:] if m in sys.modules])\n"
    )
    heavy = ["gradtape.bench", "jax", "torch", "autograd", "matplotlib", "rich"]
    out = subprocess.run(
        [sys.executable, "-c", code, *heavy], capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["[]", "[]"]


QUICK_ARGS = ["bench", "--quick", "--sizes", "10", "--workload", "sum_exp", "--repeat", "1"]


def test_json_flag_prints_the_results_document(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = [*QUICK_ARGS, "--methods", "numpy", "hand_numpy", "--json", "--out", tmp_path]
    assert main(argv) == 0
    captured = capsys.readouterr()
    document = json.loads(captured.out)  # stdout is the JSON document alone
    assert document == json.loads((tmp_path / "results.json").read_text())
    assert {r["method"] for r in document["results"]} == {"numpy", "hand_numpy"}
    assert document["flags"]["json"] is True
    assert "Wrote " in captured.err and "[2/2]" in captured.err


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_plots_are_written_when_peers_are_missing_and_name_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now fails
    monkeypatch.setitem(sys.modules, "jax", None)
    methods = ["numpy", "hand_numpy", "torch", "jax_jit"]
    assert main([*QUICK_ARGS, "--methods", *methods, "--out", tmp_path]) == 0
    document = json.loads((tmp_path / "results.json").read_text())
    assert set(document["absent"]) == {"torch", "jax_jit"}
    assert (tmp_path / "sum_exp.png").read_bytes().startswith(PNG_SIGNATURE)
    from gradtape.bench.report import absent_line
    from gradtape.bench.runner import BenchRun

    run = BenchRun(TINY, [], [], absent=document["absent"])
    assert absent_line(run) in (
        "not run (absent): torch, jax_jit",
        "not run (absent): jax_jit, torch",
    )


def test_without_matplotlib_the_run_says_why_there_are_no_plots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    assert main([*QUICK_ARGS, "--methods", "numpy", "--out", tmp_path]) == 0
    assert not list(tmp_path.glob("*.png"))
    captured = capsys.readouterr()
    assert "matplotlib not installed: no plots written" in captured.err
    assert 'pip install matplotlib, or "gradtape[bench]"' in " ".join(captured.out.split())


def test_progress_is_not_buffered_when_redirected(tmp_path: Path) -> None:
    """Redirected to a pipe, each progress line arrives while the benchmark still runs."""
    code = "import sys; from gradtape.bench.cli import main; sys.exit(main())"
    argv = [*QUICK_ARGS, "--sizes", "10", "20", "--methods", "numpy", "hand_numpy"]
    process = subprocess.Popen(
        [sys.executable, "-c", code, *argv, "--out", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = process.stderr.readline()
        still_running = process.poll() is None
        rest, _ = process.communicate(timeout=240)
    finally:
        process.kill()
    assert first.startswith("[1/4] sum_exp N=10"), first
    assert still_running, "the first progress line arrived only when the run ended"
    assert process.returncode == 0
    assert "sum_exp" in rest


def test_the_nan_safe_cost_is_the_interleaved_ratio_of_the_two_numba_builds():
    from gradtape.bench.report import nan_safe_cost_lines
    from gradtape.bench.runner import BenchRun, Measurement

    def measured(method, size, median, ratio=None):
        return Measurement("eam", size, method, OK, median_s=median, interleaved_ratio=ratio)

    run = BenchRun(TINY, [WORKLOADS["eam"]], [METHODS["gradtape_numba"]])
    assert nan_safe_cost_lines(run) == []
    run.measurements += [measured("gradtape_numba", 10, 1.05e-5), measured("numpy", 10, 3e-5)]
    assert nan_safe_cost_lines(run) == []  # the plain build did not run
    run.measurements.append(measured("gradtape_numba_plain", 10, 1e-5))
    assert nan_safe_cost_lines(run) == []  # nor were the two timed in turn
    run.measurements[-1].interleaved_ratio = 1.03  # not the ratio of the medians (1.05)
    (line,) = [text for text in nan_safe_cost_lines(run) if text]
    assert "numba backend" in line and line.endswith("eam N=10: 1.03×.")
    run.measurements.append(measured("gradtape_compiled_plain", 10, 1e-5, 0.98))
    numpy_line, numba_line = [text for text in nan_safe_cost_lines(run) if text]
    assert "numpy backend (gradtape_compiled / gradtape_compiled_plain" in numpy_line
    assert numpy_line.endswith("eam N=10: 0.98×.") and numba_line == line


def test_paired_methods_are_timed_in_turn(monkeypatch):
    from gradtape.bench import runner
    from gradtape.bench.methods import Method
    from gradtape.bench.runner import Measurement, RunConfig

    order = []
    safe = Method("safe", "", lambda w, p: None)
    plain = Method("plain", "", lambda w, p: None, interleaved_with="safe")
    other = Method("other", "", lambda w, p: None)
    row = [
        Measurement("eam", 10, "safe", OK, number=2, samples_s=[9.0], median_s=9.0),
        Measurement("eam", 10, "plain", OK, number=3, samples_s=[1.0], median_s=1.0),
        Measurement("eam", 10, "other", OK, number=1, samples_s=[5.0], median_s=5.0),
    ]
    calls = {name: (lambda name=name: order.append(name)) for name in ("safe", "plain", "other")}
    runner.interleave_pairs(row, calls, [safe, plain, other], RunConfig(repeat=4))
    # one sample of each per round: 2 calls of safe, then 3 of plain, four rounds
    assert order == (["safe"] * 2 + ["plain"] * 3) * 4
    assert len(row[0].samples_s) == len(row[1].samples_s) == 4
    assert row[0].median_s != 9.0 and row[1].median_s != 1.0
    assert row[2].samples_s == [5.0] and row[2].interleaved_ratio is None
    assert row[1].interleaved_ratio > 0

    # the ratio is the median of the per-round ratios, not the ratio of the medians
    monkeypatch.setattr(runner, "time_in_turn", lambda *a: ([1.0, 2.0, 9.0], [1.0, 1.0, 10.0]))
    runner.interleave_pairs(row, calls, [safe, plain, other], RunConfig(repeat=3))
    assert row[1].interleaved_ratio == 1.0
    assert (row[0].median_s, row[1].median_s) == (2.0, 1.0)

    # a pair whose partner failed or did not run is left as it was
    row[0].status, samples = "error", list(row[1].samples_s)
    del calls["safe"]
    runner.interleave_pairs(row, calls, [safe, plain, other], RunConfig(repeat=3))
    assert row[1].samples_s == samples


NATIVE = pytest.mark.native


@pytest.mark.parametrize(
    "method", ["gradtape_compiled_plain", pytest.param("gradtape_numba_plain", marks=NATIVE)]
)
def test_the_plain_build_restores_the_setting(monkeypatch, method):
    monkeypatch.setenv("GRADTAPE_NAN_SAFE", "1")
    prepare = METHODS[method].prepare
    workload = WORKLOADS["normal_logpdf"]
    problem = workload.problem(10)
    try:
        call = prepare(workload, problem)
    except Absent as exc:  # without Numba the method is absent
        pytest.skip(f"numba backend: {exc}")
    value, grad = call()
    _, expected = gt.value_and_grad(workload.numpy_function(problem))(problem.x)
    np.testing.assert_allclose(grad, expected, rtol=1e-12)
    assert os.environ["GRADTAPE_NAN_SAFE"] == "1"
