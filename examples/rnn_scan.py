"""Train a small tanh RNN to predict a noisy sine wave one step ahead, looping with ``gt.scan``.

Run: python examples/rnn_scan.py [n_steps] [sequence_length]

The recurrence is a ``gt.scan`` whose body closes over the parameters (a dict of arrays), so the
body is recorded once however long the sequence is, and gradients reach every parameter.
``gt.compile(gt.value_and_grad(loss))`` turns the whole forward and backward pass, loop
included, into generated NumPy code; Adam then takes a few hundred steps, each on a fresh
window of the wave (random phase, new noise; same length, so nothing is recorded again). The loss
on a held-out window is compared with two yardsticks: predicting "same as now" (persistence) and
the noise floor.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

import gradtape as gt

HIDDEN = 16
PERIOD = 20.0
NOISE = 0.1
Params = dict[str, np.ndarray]


def loss(params: Params, inputs: np.ndarray, targets: np.ndarray) -> Any:
    """Mean squared error of the one-step-ahead predictions of the RNN over the sequence."""

    def step(h: Any, input_and_target: Any) -> tuple[Any, Any]:
        x, target = input_and_target
        h = np.tanh(params["W"] @ h + params["U"] * x + params["b"])
        return h, (params["v"] @ h + params["c"] - target) ** 2

    _, squared_errors = gt.scan(step, np.zeros(HIDDEN), (inputs, targets))
    return np.mean(squared_errors)


def noisy_sine(length: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A window of the wave at a random phase: inputs x_0..x_{T-1} and targets x_1..x_T."""
    t = rng.uniform(0.0, PERIOD) + np.arange(length + 1)
    wave = np.sin(2 * np.pi * t / PERIOD) + NOISE * rng.standard_normal(length + 1)
    return wave[:-1], wave[1:]


def init_params(rng: np.random.Generator) -> Params:
    return {
        "W": rng.normal(scale=0.5 / np.sqrt(HIDDEN), size=(HIDDEN, HIDDEN)),
        "U": rng.standard_normal(HIDDEN),
        "b": np.zeros(HIDDEN),
        "v": rng.normal(scale=1.0 / np.sqrt(HIDDEN), size=HIDDEN),
        "c": np.zeros(()),
    }


class Adam:
    """The Adam optimiser on a dict of arrays."""

    def __init__(self, params: Params, learning_rate: float = 0.02, beta1: float = 0.9,
                 beta2: float = 0.999, eps: float = 1e-8) -> None:
        self.learning_rate, self.beta1, self.beta2, self.eps = learning_rate, beta1, beta2, eps
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}
        self.t = 0

    def update(self, params: Params, grads: Params) -> Params:
        self.t += 1
        new = {}
        for k, g in grads.items():
            self.m[k] = self.beta1 * self.m[k] + (1 - self.beta1) * g
            self.v[k] = self.beta2 * self.v[k] + (1 - self.beta2) * g * g
            m_hat = self.m[k] / (1 - self.beta1**self.t)
            v_hat = self.v[k] / (1 - self.beta2**self.t)
            new[k] = params[k] - self.learning_rate * m_hat / (np.sqrt(v_hat) + self.eps)
        return new


def main(n_steps: int = 300, sequence_length: int = 100, seed: int = 0,
         print_every: int = 50) -> dict[str, Any]:
    """Train, printing the loss; returns the loss history and the final test figures."""
    rng = np.random.default_rng(seed)
    test_inputs, test_targets = noisy_sine(sequence_length, rng)
    params = init_params(rng)
    value_and_grad = gt.compile(gt.value_and_grad(loss))
    optimizer = Adam(params)

    history = []
    started = time.perf_counter()
    for step in range(n_steps):
        value, grads = value_and_grad(params, *noisy_sine(sequence_length, rng))
        history.append(float(value))
        if step % print_every == 0 or step == n_steps - 1:
            recent = history[-print_every:]
            print(f"step {step:>4}: training loss {np.mean(recent):.5f} "
                  f"(mean over the last {len(recent)} window(s))")
        params = optimizer.update(params, grads)
    seconds = time.perf_counter() - started

    test_loss = float(loss(params, test_inputs, test_targets))
    persistence = float(np.mean((test_targets - test_inputs) ** 2))
    print(f"{n_steps} Adam steps on a sequence of {sequence_length} in {seconds:.2f} s "
          f"({seconds / n_steps * 1e3:.2f} ms per value and gradient, compiled)")
    print(f"test loss {test_loss:.5f}; predicting 'same as now' {persistence:.5f}; "
          f"noise floor about {NOISE**2:.5f}")
    return {"history": history, "test_loss": test_loss, "persistence_loss": persistence,
            "params": params, "seconds": seconds}


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:3]))
