"""Derived numeric tolerances (issue 26: the suite must pass on any machine).

A tolerance in the suite bounds the rounding the compared computation can make; it is not a difference measured
on one machine. The pieces:

* One ulp at a value of size ``s`` is ``eps·s`` (float32: eps = 2^-23 ≈ 1.2e-7; float64: 2^-52 ≈ 2.2e-16). An
  IEEE operation (+ − × ÷ √) rounds to within half an ulp, on every machine alike; the vectorised transcendental
  kernels (exp, log, tanh, ...; SLEEF or MKL, which differ between CPUs and SIMD widths) to within one ulp.
* A sum of ``n`` terms, in whatever order the kernel's SIMD width and thread count give, is within
  ``(n − 1)·(eps/2)·Σ|terms|`` of the exact sum (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed.,
  §4.2), so two orders differ by at most ``(n − 1)·eps·Σ|terms|``; a mean of ``n`` terms of size ``s`` by at most
  ``n·eps·s``.
* Hence :func:`rounding_tol`: ``n`` such roundings (operations along the longest chain plus summed terms) of
  values of size ``scale`` stay within ``n·eps·scale``. A test names its ``n`` and ``scale`` where it uses it.

Where equality is the claim and rounding differs by construction (another batch shape, chunking, order), the
test compares in float64, 2^29 ≈ 5e8 times finer than float32, so that a float64 bound sits many orders below the
size of any real bug (see :func:`adamw_run_tol` for training runs).
"""

from __future__ import annotations

import torch

EPS32 = torch.finfo(torch.float32).eps  # 2^-23 ≈ 1.19e-7
EPS64 = torch.finfo(torch.float64).eps  # 2^-52 ≈ 2.22e-16
ADAM_EPS = 1e-8  # torch.optim.AdamW's default ε, which the trainer keeps

#: accumulation terms on the way to one output (:func:`forward_tol`): layers × (hidden + ≤ 128 keys + MLP) + vocabulary
SHIPPED_TERMS = 4 * (64 + 128 + 192) + 19  # the shipped tiny-sudoku / tiny-sudoku-ar models (hidden 64, MLP 192)
TINY_TERMS = 2 * (32 + 128 + 64) + 19  # save_tiny_checkpoint's random bidirectional Llama (hidden 32, MLP 64)


def rounding_tol(scale: float, n: int, dtype: torch.dtype = torch.float32) -> float:
    """``n`` roundings of values of size ≤ ``scale`` in ``dtype``, each off by ≤ one ulp: ``n·eps·scale``."""
    return n * torch.finfo(dtype).eps * scale


def forward_tol(scale: float, terms: int, dtype: torch.dtype = torch.float64, gain: float = 1e3) -> float:
    """Bound on the difference of one model output of size ≤ ``scale`` computed along two paths that round
    differently (another batch shape or padding, a key/value cache, chunked scoring, a hand-written replay).

    Each output is reached through accumulations of at most ``terms`` products in all (per layer: the hidden
    width, the attended keys and the MLP width; then the vocabulary's log-sum-exp), each off by ≤ one ulp of
    ``scale``; a rounding made early is carried to the output scaled by the later layers, by at most ``gain``
    (1e3: the tiny test models have ≤ 4 stages of operator norm ≤ ~10 — HF's std-0.02 init, the toy denoiser's
    std-0.7 width-16 layers, the AR tests' std-0.6 width-32 ones). Meant for float64, where this stays ≥ 1e4 below
    any difference a bug makes (≥ 1e-4 in log-probs or logits).
    """
    return gain * terms * torch.finfo(dtype).eps * scale


def adamw_run_tol(lr: float, updates: int, terms: int, grad_scale: float = 1.0) -> float:
    """Bound on ``max|θ_a − θ_b|`` for two float64 AdamW runs whose gradients differ only by rounding.

    A gradient entry is a sum of ``terms`` products of size ≤ ``grad_scale``; reordered (another batch split,
    chunking, loss code) it moves by δ ≤ terms·eps·grad_scale. AdamW's update ``lr·m̂/(√v̂ + ε)`` has slope
    ≤ lr/ε in the gradient (at |g| → 0; ε = 1e-8), so each update moves a parameter by ≤ lr·δ/ε more, and the
    ``updates`` add up: ``updates·lr·terms·eps·grad_scale/ε``. (The parameters themselves move by ~lr per update,
    far above this bound in float64: a test checks that where it could be vacuous.)
    """
    return updates * lr * terms * EPS64 * grad_scale / ADAM_EPS
