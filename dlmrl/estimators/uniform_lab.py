"""The variance lab for the uniform-noise ELBO estimators: exact bias, variance and MSE by enumerating noise states.

For a denoiser ``x_θ(z, ·)`` that ignores the time (DiffusionGemma's decoder has no time input) and a row with
``n`` scored positions over a vocabulary of ``N`` tokens, the denoiser's log-probabilities on **every** noise state
``z`` (``N^n`` canvases, one forward pass each) make a :class:`StateTable`; from it every uniform estimator's
mean and variance are finite sums over states and one-dimensional integrals over time:

- ``L(z, t) = Σ_i ℓ_i(z, t)`` (:func:`~dlmrl.estimators.uniform_elbo.uniform_nelbo_integrand`);
  ``g(t) = E_{q_t} L`` and ``m₂(t) = E_{q_t} L²`` by enumeration (:func:`integrand_moments`);
- :class:`~dlmrl.estimators.uniform_elbo.UniformDoubleMC` (``K`` draws, ``t = s^p``, weight ``w(s) = p s^(p−1)``):
  mean ``−∫_0^1 w g(s^p) ds`` (the ELBO: unbiased); one draw's second moment ``∫_0^1 w² m₂(s^p) ds``, so the
  variance is ``(∫ w² m₂ − (∫ w g)²)/K`` i.i.d. and ``Σ_k [(1/K) ∫_{I_k} w² m₂ − (∫_{I_k} w g)²]`` stratified
  (``I_k = ((k−1)/K, k/K]``). For ``p = 1`` it is **infinite** (``m₂(t) ∼ log²(1/t)/t`` as ``t → 0``: the class
  docstring), reported as ``inf``; for ``p ≥ 2`` the integrand ``w² m₂`` has at most a ``log²(1/s)`` singularity
  at ``s = 0``, integrated by composite Gauss–Legendre on pieces split at the strata, graded geometrically towards
  ``s = 0`` and ``s = 1`` on the pieces that touch them (:func:`double_mc_moments`; the rule of
  :func:`~dlmrl.estimators.uniform_exact.graded_gauss_legendre`);
- :class:`~dlmrl.estimators.uniform_elbo.UniformSDMC` (fixed nodes ``t_n``, weights ``w_n``, ``K`` canvases per
  node): mean ``−Σ_n w_n g(t_n)``, variance ``Σ_n (w_n²/K) (m₂(t_n) − g(t_n)²)``: no time integral at all;
- :class:`~dlmrl.estimators.uniform_elbo.UniformFlatCE` (``t ~ U(ε, 1)``, ``Y = Σ_{i ∈ support} log x_θ,i(x_i)``):
  given ``z`` the corruption flags are independent, ``P(i corrupted | z) = (t/N)/q_t(z_i | x_i)``, so ``E[Y | t]``
  and ``E[Y² | t]`` are finite sums over states, each a polynomial of degree ``≤ n`` in ``t``: Gauss–Legendre with
  ``⌈(n+1)/2⌉`` nodes is exact; variance ``(E Y² − (E Y)²)/K``. Its "bias" is its expectation minus the ELBO
  (a surrogate, not a bound).

The target is :func:`~dlmrl.estimators.uniform_exact.uniform_exact_elbo` on the same table (its own quadrature in
``t``, with its a-posteriori error estimate). Sampled figures (independent draws of each estimator, evaluated by
table lookup, :func:`table_denoiser`) check the exact ones (``check_max_abs_z``, ``check_variance_ratio``) and
state the standard error of the sampled bias.

Records carry the masked lab's fields (:data:`dlmrl.estimators.analysis.RECORD_FIELDS`; ``masking`` is ``None``,
``t_range`` the flat CE's ``[ε, 1]``) plus ``time_exponent``, ``support``, ``std``, ``sampled_bias_se`` and
``target_error``; :func:`uniform_summary_table` prints them.

Reference: UDLM arXiv 2412.10193 (continuous-time uniform-noise ELBO); Duo arXiv 2506.10892; NeMo AutoModel
``BlockDiffusionCrossEntropyLoss`` (flat cross-entropy); GDPO arXiv 2510.08554 §4 (the masked lab's comparison of
double Monte Carlo and SDMC at equal NFE, which this mirrors).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch

from dlmrl.estimators.lab_report import _cell
from dlmrl.estimators.quadrature import gauss_legendre_unit
from dlmrl.estimators.uniform_elbo import (
    LINEAR,
    Denoiser,
    UniformDoubleMC,
    UniformFlatCE,
    UniformNoisePlan,
    UniformSDMC,
    _check_inputs,
    uniform_draw_terms,
    uniform_nelbo_integrand,
)
from dlmrl.estimators.uniform_exact import (
    DEFAULT_MAX_STATES,
    _position_probs,
    _states,
    graded_gauss_legendre,
    uniform_exact_elbo,
)

#: elements (times × states × rows × positions × vocabulary) per vectorised integrand evaluation
_CHUNK_ELEMENTS = 1 << 21


@dataclass
class StateTable:
    """The denoiser's log-probabilities on every noise state of each row.

    Attributes:
        x: ``(B, L)`` long clean tokens; completion_mask ``(B, L)`` bool (the positions noised and scored).
        z: ``(S, B, L)`` long states (``S = N^(max n_b)``; state ``s`` of row ``b`` holds the base-``N`` digits of
            ``s`` at the row's completion positions, in order); valid ``(S, B)`` bool (the row's own ``N^(n_b)``).
        log_probs: ``(S, B, L, N)`` float64 ``log x_θ(z)`` (log-softmax of the denoiser's logits).
        vocab_size: ``N``.
        forward_passes: canvases the denoiser scored to build the table (``S`` per row).
    """

    x: torch.Tensor
    completion_mask: torch.Tensor
    z: torch.Tensor
    valid: torch.Tensor
    log_probs: torch.Tensor
    vocab_size: int
    forward_passes: int


def state_table(denoise: Denoiser, x: torch.Tensor, completion_mask: torch.Tensor, vocab_size: int,
                max_states: int = DEFAULT_MAX_STATES, canvases_per_call: int = 1024) -> StateTable:
    """Run ``denoise`` once on every noise state of each row (at ``t = 1``: the denoiser must ignore ``t``).

    Args:
        denoise: ``(z (K, B, L) long, t (K,) float64) -> logits (K, B, L, N)``, independent of ``t``.
        x: ``(B, L)`` long; completion_mask ``(B, L)`` bool; vocab_size ``N``.
        max_states: refuse rows with more than this many states ``N^n``.
        canvases_per_call: states per ``denoise`` call.
    Returns:
        :class:`StateTable`.
    Raises:
        ValueError: ``N^n > max_states``, bad shapes or tokens, logits of the wrong shape.
    """
    _check_inputs(x, completion_mask, vocab_size)
    z, valid, _ = _states(x, completion_mask.bool(), vocab_size, max_states)
    parts = []
    for a in range(0, z.shape[0], canvases_per_call):
        zz = z[a:a + canvases_per_call]
        with torch.no_grad():
            logits = denoise(zz, torch.ones(zz.shape[0], dtype=torch.float64))
        if tuple(logits.shape) != (*zz.shape, vocab_size):
            raise ValueError(f"denoise returned logits of shape {tuple(logits.shape)}; expected "
                             f"{(*zz.shape, vocab_size)}")
        parts.append(torch.log_softmax(logits.double(), -1))
    return StateTable(x=x, completion_mask=completion_mask.bool(), z=z, valid=valid, log_probs=torch.cat(parts),
                      vocab_size=vocab_size, forward_passes=int(z.shape[0]))


def table_denoiser(table: StateTable) -> Denoiser:
    """``denoise(z, t)`` by lookup in ``table`` (its log-probabilities as logits; ``t`` ignored): any canvas that
    equals ``x`` outside the completion mask, as the estimators' plans do. ``(K, B, L) -> (K, B, L, N)`` float64."""
    n = table.vocab_size
    mask = table.completion_mask
    rank = torch.cumsum(mask.long(), -1) - 1  # position's rank among the row's completion positions
    place = torch.where(mask, torch.tensor(n, dtype=torch.float64) ** rank.double(), 0.0).long()  # (B, L)
    rows = torch.arange(table.x.shape[0])

    def denoise(z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        code = (z.cpu() * place).sum(-1)  # (K, B)
        return table.log_probs[code, rows[None]]

    return denoise


def _time_chunks(table: StateTable, num_times: int) -> int:
    s, b, length, n = table.log_probs.shape
    return max(1, _CHUNK_ELEMENTS // max(1, s * b * length * n))


def integrand_moments(table: StateTable, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``g(t) = E_{z ~ q_t} Σ_i ℓ_i(z, t)`` and ``m₂(t) = E_{z ~ q_t} (Σ_i ℓ_i(z, t))²`` per row, exactly.

    Args:
        table: :class:`StateTable`. t: ``(T,)`` float64 times in ``(0, 1]``.
    Returns:
        ``(g (T, B), m2 (T, B))`` float64 (nats per unit time, and its square).
    """
    t = torch.as_tensor(t, dtype=torch.float64)
    allowed = table.completion_mask
    g, m2 = [], []
    step = _time_chunks(table, t.shape[0])
    for a in range(0, t.shape[0], step):
        tc = t[a:a + step]
        logp = table.log_probs[None].expand(tc.shape[0], *table.log_probs.shape)  # (T_c, S, B, L, N), a view
        ell = uniform_nelbo_integrand(logp, table.z[None], table.x, tc[:, None, None, None], LINEAR)
        total = torch.where(allowed, ell, 0.0).sum(-1)  # (T_c, S, B)
        q = _position_probs(table.z, table.x, allowed, tc, table.vocab_size, LINEAR).prod(-1) * table.valid[None]
        g.append((q * total).sum(1))
        m2.append((q * total * total).sum(1))
    return torch.cat(g), torch.cat(m2)


def _piece_rule(a: Fraction, b: Fraction, panels: int, nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Nodes and weights on ``[a, b]`` (fractions of the unit interval): Gauss–Legendre panels graded
    geometrically towards an end at 0 or 1 (``[a, a + h 2^-P], ..., [a + h/2, b]`` with ``h = b − a``; both ends
    for ``[0, 1]``), else one panel of ``2·nodes`` nodes (the integrand is analytic on a piece away from 0 and 1)."""
    lo, hi = float(a), float(b)
    if a == 0 and b == 1:
        return graded_gauss_legendre(panels, nodes)
    if a != 0 and b != 1:
        s, w = gauss_legendre_unit(2 * nodes)
        return lo + (hi - lo) * s, (hi - lo) * w
    x, omega = gauss_legendre_unit(nodes)
    edges = [0.0] + [2.0 ** (-k) for k in range(panels, -1, -1)]  # 0, 2^-P, ..., 1/2, 1 (graded towards 0)
    u = torch.cat([e0 + (e1 - e0) * x for e0, e1 in itertools.pairwise(edges)])
    wu = torch.cat([(e1 - e0) * omega for e0, e1 in itertools.pairwise(edges)])
    if a != 0:  # graded towards b = 1: mirrored, keeping the small widths' digits in 1 − s
        return hi - (hi - lo) * torch.flip(u, [0]), (hi - lo) * torch.flip(wu, [0])
    return lo + (hi - lo) * u, (hi - lo) * wu


@dataclass(frozen=True)
class Moments:
    """An estimator's exact mean and variance per row: ``mean (B,)`` and ``variance (B,)`` float64 (nats, nats²;
    ``inf`` where the variance is infinite)."""

    mean: np.ndarray
    variance: np.ndarray


def double_mc_moments(table: StateTable, est: UniformDoubleMC, panels: int = 24, nodes: int = 6,
                      cache: dict | None = None, breaks: Sequence[Fraction] = ()) -> Moments:
    """:class:`~dlmrl.estimators.uniform_elbo.UniformDoubleMC`'s exact mean and variance (module docstring).

    The integrals over ``s`` are split into pieces at the strata ``k/K`` and at ``breaks`` (the lab passes every
    budget's strata, so that a piece is integrated once for all estimators, kept in ``cache``, a dict shared by
    calls on the same table); a piece touching ``s = 0`` (the ``log²(1/s)`` singularity) or ``s = 1`` (for a
    large vocabulary, ``g`` has a singularity just beyond ``t = 1``) gets Gauss–Legendre panels graded towards
    that end (``panels``, ``nodes`` per panel), the others ``2·nodes`` nodes.
    """
    cache = {} if cache is None else cache
    k, p = est.num_samples, est.time_exponent
    edges = [Fraction(j, k) for j in range(k + 1)] if est.stratified else [Fraction(0), Fraction(1)]
    points = sorted({*edges, *(Fraction(b) for b in breaks if 0 < b < 1)})
    pieces = {}
    for a, b in itertools.pairwise(points):
        key = (a, b, p, panels, nodes)
        if key not in cache:
            s, ws = _piece_rule(a, b, panels, nodes)
            g, m2 = integrand_moments(table, s**p)
            w = p * s ** (p - 1)
            cache[key] = (((ws * w)[:, None] * g).sum(0).numpy(), ((ws * w * w)[:, None] * m2).sum(0).numpy())
        pieces[(a, b)] = cache[key]
    first = []  # per stratum: (∫ w g, ∫ w² m₂) (B,), the sum of its pieces
    for a, b in itertools.pairwise(edges):
        inside = [v for (lo, hi), v in pieces.items() if a <= lo and hi <= b]
        first.append((sum(v[0] for v in inside), sum(v[1] for v in inside)))
    mean = -sum(f[0] for f in first)
    if p == 1:
        return Moments(mean, np.full_like(mean, math.inf))
    if est.stratified:
        var = sum(m2 / k - m1**2 for m1, m2 in first)
    else:
        var = (first[0][1] - first[0][0] ** 2) / k
    return Moments(mean, np.maximum(var, 0.0))


def sdmc_moments(table: StateTable, est: UniformSDMC) -> Moments:
    """:class:`~dlmrl.estimators.uniform_elbo.UniformSDMC`'s exact mean ``−Σ w_n g(t_n)`` and variance
    ``Σ_n (w_n²/K)(m₂(t_n) − g(t_n)²)``."""
    t, w = est.nodes()
    g, m2 = integrand_moments(table, t)
    mean = -(w[:, None] * g).sum(0)
    var = ((w * w / est.samples_per_node)[:, None] * (m2 - g * g)).sum(0)
    return Moments(mean.numpy(), np.maximum(var.numpy(), 0.0))


def flat_ce_moments(table: StateTable, est: UniformFlatCE) -> Moments:
    """:class:`~dlmrl.estimators.uniform_elbo.UniformFlatCE`'s exact mean and variance (module docstring)."""
    x, allowed, n = table.x, table.completion_mask, table.vocab_size
    lengths = allowed.sum(-1)
    nodes = int(lengths.max()) // 2 + 1 if x.numel() else 1  # 2m − 1 ≥ n: exact for degree n
    s, omega = gauss_legendre_unit(nodes)
    t = est.eps + (1.0 - est.eps) * s
    logp_x = torch.gather(table.log_probs, -1, x[None, ..., None].expand(table.z.shape[0], -1, -1, 1)).squeeze(-1)
    a = torch.where(allowed, logp_x, 0.0)  # (S, B, L)
    qi = _position_probs(table.z, x, allowed, t, n, LINEAR)  # (T, S, B, L)
    q = qi.prod(-1) * table.valid[None]  # (T, S, B)
    if est.support == "all":
        y = a.sum(-1)[None]  # (1, S, B)
        ey, ey2 = (q * y).sum(1), (q * y * y).sum(1)
    else:
        pi = torch.where(allowed, (t / n)[:, None, None, None] / qi, 0.0)  # P(corrupted | z), (T, S, B, L)
        m1 = (pi * a).sum(-1)  # E[Y | z]
        # E[Y² | z] = (Σ π a)² + Σ π(1 − π) a²: independent Bernoulli flags given z
        ey, ey2 = (q * m1).sum(1), (q * (m1 * m1 + (pi * (1 - pi) * a * a).sum(-1))).sum(1)
    mean = (omega[:, None] * ey).sum(0)
    second = (omega[:, None] * ey2).sum(0)
    var = (second - mean * mean) / est.num_samples
    return Moments(mean.numpy(), np.maximum(var.numpy(), 0.0))


def exact_moments(table: StateTable, est, cache: dict | None = None, breaks: Sequence[Fraction] = ()) -> Moments:
    """Dispatch to :func:`double_mc_moments` (with ``cache`` and ``breaks``), :func:`sdmc_moments` or
    :func:`flat_ce_moments`.

    Raises:
        TypeError: another estimator."""
    if isinstance(est, UniformDoubleMC):
        return double_mc_moments(table, est, cache=cache, breaks=breaks)
    if isinstance(est, UniformSDMC):
        return sdmc_moments(table, est)
    if isinstance(est, UniformFlatCE):
        return flat_ce_moments(table, est)
    raise TypeError(f"no exact moments for {type(est).__name__}")


# ---------------------------------------------------------------- the lab


@dataclass
class UniformLabBatch:
    """Rows scored together: ``denoise`` (t-independent), clean ``x (B, L)``, ``completion_mask (B, L)``, the
    vocabulary ``N`` and a label ``length`` (scored positions per row); optionally the ``(B, P)`` prompt the
    denoiser conditions on (``prompt_ids``, ``prompt_mask``; for the record)."""

    length: int
    denoise: Denoiser
    x: torch.Tensor
    completion_mask: torch.Tensor
    vocab_size: int
    prompt_ids: torch.Tensor | None = None
    prompt_mask: torch.Tensor | None = None


@dataclass
class UniformLabConfig:
    """Settings of :func:`run_uniform_lab`: budgets (NFE), sampled repetitions per estimator, seed, the flat CE's
    ``ε``, the state limit, and the exact ELBO's graded rule (``panels``, ``nodes_per_panel``:
    :func:`~dlmrl.estimators.uniform_exact.uniform_exact_elbo`; its error estimate is reported)."""

    budgets: tuple[int, ...] = (1, 2, 3, 4, 8)
    repetitions: int = 2000
    seed: int = 0
    eps: float = 1e-3
    max_states: int = DEFAULT_MAX_STATES
    panels: int = 30
    nodes_per_panel: int = 8


def uniform_lab_estimators(nfe: int, eps: float = 1e-3) -> list:
    """The estimators compared at budget ``nfe`` (canvas passes per sequence): double MC with ``t ~ U(0, 1]``
    (``p = 1``, UDLM/Duo's draw: infinite variance), with ``t = s²`` (``p = 2``, the default), stratified ``p = 2``;
    SDMC with ``nfe`` nodes in ``t`` (``p = 1``) and in ``s`` (``p = 2``); the flat CE surrogate on all positions
    (NeMo's support) and on the corrupted ones."""
    return [
        UniformDoubleMC(nfe, time_exponent=1),
        UniformDoubleMC(nfe, time_exponent=2),
        UniformDoubleMC(nfe, stratified=True, time_exponent=2),
        UniformSDMC(nfe, 1, time_exponent=1),
        UniformSDMC(nfe, 1, time_exponent=2),
        UniformFlatCE(nfe, eps=eps, support="all"),
        UniformFlatCE(nfe, eps=eps, support="corrupted"),
    ]


def uniform_label(rec_or_est) -> str:
    """``uniform_double_mc[p=2,strat]``, ``uniform_sdmc[p=1]``, ``uniform_flat_ce[all]``, ... for an estimator or
    a record."""
    if isinstance(rec_or_est, dict):
        name, p, strat, support = (rec_or_est["estimator"], rec_or_est.get("time_exponent"),
                                   rec_or_est.get("stratified"), rec_or_est.get("support"))
    else:
        name, p = rec_or_est.name, getattr(rec_or_est, "time_exponent", None)
        strat, support = getattr(rec_or_est, "stratified", None), getattr(rec_or_est, "support", None)
    parts = [f"p={p}"] if p is not None else []
    if strat:
        parts.append("strat")
    if support is not None:
        parts.append(support)
    return f"{name}[{','.join(parts)}]"


def _describe(est) -> dict:
    return {"estimator": est.name, "masking": None, "nodes": getattr(est, "num_nodes", None),
            "samples_per_node": getattr(est, "samples_per_node", None),
            "num_samples": getattr(est, "num_samples", None), "stratified": getattr(est, "stratified", None),
            "t_range": [est.eps, 1.0] if isinstance(est, UniformFlatCE) else None, "p_mask_prompt": None,
            "merge": None, "nfe": est.nfe, "time_exponent": getattr(est, "time_exponent", None),
            "support": getattr(est, "support", None)}


def _mean(xs) -> float:
    xs = np.asarray(list(xs), dtype=np.float64)
    return float(xs.mean()) if xs.size else float("nan")


def run_uniform_lab(batches: Sequence[UniformLabBatch], cfg: UniformLabConfig | None = None,
                    estimators_for: Callable[[int], list] | None = None,
                    progress: Callable[[str], None] | None = None) -> list[dict]:
    """Measure every estimator of ``estimators_for(nfe)`` at each budget on each batch against the exact ELBO.

    Args:
        batches: :class:`UniformLabBatch` list (e.g. one per length).
        cfg: :class:`UniformLabConfig`.
        estimators_for: budget → estimators (default :func:`uniform_lab_estimators` with ``cfg.eps``).
        progress: called with a line of text as work proceeds.
    Returns:
        One record per (batch, estimator), averaged over the batch's rows: ``bias`` (signed mean − ELBO),
        ``bias_sq``, ``variance``, ``std`` (root of the mean variance), ``mse = bias_sq + variance`` (exact;
        ``inf`` variance for ``p = 1`` double MC), the ``sampled_*`` figures from ``cfg.repetitions`` draws
        (``sampled_bias_se``: the standard error of ``sampled_bias``), ``check_max_abs_z`` (sampled vs exact mean,
        in standard errors) and ``check_variance_ratio``; ``target_error`` the exact ELBO's quadrature error
        estimate (nats, max over rows).
    Raises:
        ValueError: a row with more than ``cfg.max_states`` noise states.
    """
    cfg = cfg or UniformLabConfig()
    say = progress or (lambda _: None)
    estimators_for = estimators_for or (lambda nfe: uniform_lab_estimators(nfe, cfg.eps))
    records = []
    for bi, batch in enumerate(batches):
        table = state_table(batch.denoise, batch.x, batch.completion_mask, batch.vocab_size, cfg.max_states)
        lookup = table_denoiser(table)
        exact = uniform_exact_elbo(lookup, batch.x, batch.completion_mask, batch.vocab_size,
                                   cfg.panels, cfg.nodes_per_panel, max_states=cfg.max_states)
        target = exact.estimate.sequence.double().numpy()
        say(f"L={batch.length}: {batch.x.shape[0]} rows, {table.forward_passes} states per row, exact ELBO "
            f"{target.mean():.4f} (quadrature error <= {float(exact.error_estimate.max()):.2g})")
        gen = torch.Generator().manual_seed(cfg.seed * 1000 + bi)
        cache: dict = {}
        breaks = sorted({Fraction(j, k) for k in cfg.budgets for j in range(1, k)})  # every budget's strata
        for nfe in cfg.budgets:
            for est in estimators_for(nfe):
                m = exact_moments(table, est, cache, breaks)
                vals = sampled_values(est, lookup, batch, cfg.repetitions, gen)  # (R, B)
                bias = m.mean - target
                var_r = vals.var(0, ddof=1)
                sbias = vals.mean(0) - target
                rec = {"length": batch.length, **_describe(est), "rows": int(batch.x.shape[0]),
                       "target": "exact", "target_error": float(exact.error_estimate.max()),
                       "infinite_variance": bool(np.isinf(m.variance).any()),
                       "bias": _mean(bias), "bias_sq": _mean(bias**2), "variance": _mean(m.variance),
                       "mse": _mean(bias**2 + m.variance), "repetitions": cfg.repetitions,
                       "sampled_bias": _mean(sbias), "sampled_variance": _mean(var_r),
                       "sampled_mse": _mean(sbias**2 + var_r),
                       "sampled_bias_se": math.sqrt(_mean(var_r) / cfg.repetitions / max(1, batch.x.shape[0])),
                       "values": None, "gaps": None}
                rec["std"] = math.sqrt(rec["variance"])
                ok = np.isfinite(m.variance) & (m.variance > 1e-12 * (1.0 + target**2))
                rec["check_max_abs_z"] = (float(np.abs((vals.mean(0)[ok] - m.mean[ok])
                                                       / np.sqrt(m.variance[ok] / cfg.repetitions)).max())
                                          if ok.any() else float("nan"))
                rec["check_variance_ratio"] = _mean(var_r[ok] / m.variance[ok]) if ok.any() else float("nan")
                records.append(rec)
        say(f"L={batch.length}: done")
    return records


def sampled_values(est, denoise: Denoiser, batch: UniformLabBatch, reps: int, generator: torch.Generator,
                   micro_batch: int = 4096) -> np.ndarray:
    """``reps`` independent estimates per row, ``(reps, B)`` float64: ``reps`` plans drawn one after another from
    ``generator`` (:meth:`make_plan`, as :meth:`estimate` draws them), scored in one pass over their concatenated
    draws (``micro_batch`` draws per ``denoise`` call) and summed plan by plan."""
    x, mask, n = batch.x, batch.completion_mask.bool(), batch.vocab_size
    plans = [est.make_plan(x, mask, n, generator) for _ in range(reps)]
    plan = UniformNoisePlan(t=torch.cat([p.t for p in plans]), weights=torch.cat([p.weights for p in plans]),
                            z_t=torch.cat([p.z_t for p in plans]), corrupted=torch.cat([p.corrupted for p in plans]))
    if isinstance(est, UniformFlatCE):
        parts = []
        for a in range(0, plan.num_draws, micro_batch):
            sl = slice(a, a + micro_batch)
            logp = torch.log_softmax(denoise(plan.z_t[sl], plan.t[sl]).double(), -1)
            logp_x = torch.gather(logp, -1, x[None, ..., None].expand(logp.shape[0], -1, -1, 1)).squeeze(-1)
            support = mask[None] & (plan.corrupted[sl] if est.support == "corrupted" else True)
            parts.append(torch.where(support, plan.weights[sl, None, None] * logp_x, 0.0).sum(-1))
        per_draw = torch.cat(parts)
    else:
        per_draw = uniform_draw_terms(denoise, plan, x, mask, n, est.schedule, micro_batch).sum(-1)  # (R·S, B)
    return per_draw.double().reshape(reps, -1, x.shape[0]).sum(1).numpy()


UNIFORM_TABLE_ORDER = ("uniform_double_mc[p=1]", "uniform_double_mc[p=2]", "uniform_double_mc[p=2,strat]",
                       "uniform_sdmc[p=1]", "uniform_sdmc[p=2]", "uniform_flat_ce[all]",
                       "uniform_flat_ce[corrupted]")


def uniform_summary_table(records: Sequence[dict], budgets: Sequence[int] | None = None) -> str:
    """A Markdown table, one line per (L, NFE, estimator): bias, standard deviation and MSE against the exact ELBO
    (nats; exact figures plain, ``inf`` where infinite; ``~`` a sampled one) and the sampled bias with its
    standard error. ``budgets`` default: every NFE present."""
    present = sorted({r["nfe"] for r in records})
    budgets = list(budgets) if budgets is not None else present
    order = {name: i for i, name in enumerate(UNIFORM_TABLE_ORDER)}
    rows = sorted((r for r in records if r["nfe"] in budgets),
                  key=lambda r: (r["length"], r["nfe"], order.get(uniform_label(r), len(order))))
    lines = ["| L | NFE | estimator | bias | std | MSE | sampled bias ± SE |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        std = dict(r, variance=r.get("std"), sampled_variance=(None if r.get("sampled_variance") is None
                                                               else math.sqrt(r["sampled_variance"])))
        sb, se = r.get("sampled_bias"), r.get("sampled_bias_se")
        sampled = "—" if sb is None or se is None else f"{sb:.3g} ± {se:.2g}"
        lines.append(f"| {r['length']} | {r['nfe']} | {uniform_label(r)} | {_cell(r, 'bias')} | "
                     f"{_cell(std, 'variance')} | {_cell(r, 'mse')} | {sampled} |")
    return "\n".join(lines)
