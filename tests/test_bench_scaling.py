"""The benchmark's scaling section: its tables, plot and command (measurements themselves run
in `gradtape scaling`, not in the test suite)."""

from __future__ import annotations

import pytest

from gradtape.bench import cli, scaling

RESULTS = {
    "notes": ["jax: not installed (memory)"],
    "time_to_native": [
        {
            "workload": "normal_logpdf",
            "time_to_native_s": 1.234,
            "first_call_s": 0.0123,
            "max_call_s": 0.0187,
            "throughput_vs_numpy_tier": 0.81,
        },
        {"workload": "logistic_regression", "error": "boom"},
    ],
    "compile_time": {
        "gradtape": [{"ops": 10, "seconds": 0.21}, {"ops": 100, "seconds": 0.87}],
        "jax": [{"ops": 10, "seconds": 0.09}, {"ops": 100, "seconds": 0.12}],
    },
    "memory": [
        {"method": "gradtape", "n": 1000, "peak_mb": 1.5, "input_mb": 0.01, "traced_peak_mb": 0.12},
        {"method": "autograd", "n": 1000, "peak_mb": 2.5, "input_mb": 0.01, "traced_peak_mb": 0.15},
    ],
    "overhead": [{"method": "gradtape", "us_per_op": 4.25}, {"method": "autograd", "error": "x"}],
    "new_length": [
        {
            "backend": "numpy",
            "new_length_ms": 0.4512,
            "steady_us": 3.21,
            "kb_kept_per_length": 0.25,
            "kept_lengths": 2000,
        },
        {"backend": "numba", "error": "boom"},
    ],
    "recreate": {"steady_us": 2.5, "recreated_us": 7.25, "ratio": 2.9},
    "second_process": [
        {
            "method": "gradtape (llvm)",
            "import_s": 0.5,
            "first_native_after_import_s": 0.125,
            "numba_imported": False,
        },
        {"method": "jax", "import_s": 0.75, "first_native_after_import_s": 0.5},
        {"method": "gradtape (numba)", "error": "boom"},
    ],
    "kernel_memory": {
        "programs": 60,
        "max_kernels": 8,
        "kb_per_program": 123.4,
        "modules_imported": 8,
    },
}


def test_markdown_tables_carry_every_figure():
    text = scaling.markdown(RESULTS)
    assert "| normal_logpdf | 1.23 | 0.012 | 18.7 | 0.81 |" in text
    assert "| logistic_regression | error: boom |" in text
    assert "| 10 | 0.21 | 0.09 |" in text and "| 100 | 0.87 | 0.12 |" in text
    assert "| 1000 | 0.0 | 1.5 | 2.5 |" in text
    assert "| gradtape | 4.25 |" in text and "| autograd | error: x |" in text
    assert "jax: not installed" in text
    assert "| 1000 | 0.1 | 0.1 |" in text  # tracemalloc peaks
    assert "| numpy | 0.451 | 3.21 | 0.25 (over 2000) |" in text
    assert "| numba | error: boom | | |" in text
    assert "| 2.50 | 7.25 | 2.90 |" in text
    assert "| 60 | 8 | 123.4 | 8 |" in text
    assert "| gradtape (llvm) | 0.500 | 0.125 | 0.625 | no |" in text
    assert "| jax | 0.750 | 0.500 | 1.250 | - |" in text
    assert "| gradtape (numba) | error: boom |" in text


@pytest.mark.native
def test_the_second_process_measurement_loads_from_the_cache():
    got, error = scaling._run(scaling._SECOND_PROCESS_GRADTAPE, times=2)
    assert error is None, error
    assert got["from_cache"] and got["generator"] == "llvm" and not got["numba_imported"]
    assert got["first_native_after_import_s"] > 0


def test_the_cost_measurements_run_and_report_their_figures():
    got, error = scaling._run(scaling._NEW_LENGTH, BACKENDS=["numpy"], LENGTHS=5, KEPT_LENGTHS=20)
    assert error is None and got[0]["backend"] == "numpy" and got[0]["new_length_ms"] > 0
    assert got[0]["kept_lengths"] == 20 and "kb_kept_per_length" in got[0]
    got, error = scaling._run(scaling._RECREATE.replace("n=2000", "n=20"))
    assert error is None and got["ratio"] > 0


def test_plot_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    assert scaling.plot(RESULTS, tmp_path / "scaling.png")
    assert (tmp_path / "scaling.png").stat().st_size > 1000


def test_the_command_is_registered():
    args = cli.build_parser().parse_args(["scaling", "--quick", "--out", "somewhere"])
    assert args.handler is scaling.run_scaling_command and args.quick


def test_a_measurement_script_runs_in_a_fresh_process():
    got, error = scaling._run("import json; print(json.dumps({'n': N * 2}))", N=21)
    assert error is None and got == {"n": 42}
    got, error = scaling._run("raise SystemExit('no such peer')")
    assert got is None and "no such peer" in error
