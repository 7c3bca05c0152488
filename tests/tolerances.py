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


#: accumulation terms on the way to one output (:func:`forward_tol`): layers × (hidden + ≤ 128 keys + MLP) + vocabulary
SHIPPED_TERMS = 4 * (64 + 128 + 192) + 19  # the shipped tiny-sudoku / tiny-sudoku-ar models (hidden 64, MLP 192)
TINY_TERMS = 2 * (32 + 128 + 64) + 19  # save_tiny_checkpoint's random bidirectional Llama (hidden 32, MLP 64)
TOY_TERMS = 6 * 16 + 64 + 8  # tests/conftest.py's ToyDenoiser: width-16 q, k, v, mix, head; ≤ 64 keys; 8 tokens
#: An ELBO-like quantity (an estimate, an S(m), a per-token contribution) is a combination of log-probs, all ≤ 0, with
#: non-negative weights: its error is at most the same combination of the log-probs' errors, so a float64 toy-policy
#: value compared along two paths is within this relative tolerance (forward_tol per unit of |value|): ≈ 3.7e-11.
TOY_ELBO_RTOL = forward_tol(scale=1.0, terms=TOY_TERMS)
#: MaskPlan weights are float32 (1/(k·C(n, k)), n/k, ... rounded): against hand-computed float64 weights each is within
#: half a float32 ulp relative, and so is an ELBO-like combination of one sign (see TOY_ELBO_RTOL): ≈ 6e-8
WEIGHT_RTOL = EPS32 / 2
#: a plan weight (w·n/k/K and the like) against its float64 formula: ≤ 3 float32 operations and the float32 store
WEIGHT_OPS_RTOL = rounding_tol(scale=1, n=4)  # ≈ 4.8e-7
#: Gauss-Legendre nodes and weights (scipy's roots_legendre, numpy's leggauss) are within a few ulps of the exact ones
#: (measured ≤ 1.3 ulps for n ≤ 3), (x + 1)/2 and ω/2 round once more: 64 ulps of 1 leaves room for another
#: LAPACK/libm (≈ 1.4e-14)
NODE_TOL = rounding_tol(scale=1, n=64, dtype=torch.float64)
