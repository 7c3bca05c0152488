"""Exact uniform-noise ELBO on a tiny vocabulary: every noise state enumerated, a graded quadrature over time.

For a row with ``n`` completion positions and a vocabulary of ``N`` tokens, the ``N^n`` noisy canvases ``z`` and
their probabilities ``q_t(z | x) = Π_i (α_t [z_i = x_i] + (1 − α_t)/N)`` make the expectation over the noise exact:

    g_i(t) = E_{z ~ q_t(·|x)} ℓ_i(z, t) = Σ_z q_t(z | x) ℓ_i(z, t)          (ℓ: :func:`uniform_nelbo_integrand`)

and the ELBO is ``−∫_0^1 Σ_i g_i(t) dt``. The time integral is not a polynomial quadrature's: ``g`` has a
``log(1/t)`` singularity at ``t = 0`` (a corruption at small ``t`` costs ``≈ (1/t) log(1/t)`` and happens
w.p. ``≈ t``), and for a denoiser that ignores ``t`` it is otherwise analytic, with singularities at
``t* = N x_θ,j / (N x_θ,j − 1)`` (where ``x̄_θ,j = 0``), i.e. ``t* ≤ 0`` or ``t* ≥ 1 + 1/(N − 1)``: near ``t = 1``
for a large vocabulary. :func:`graded_gauss_legendre` therefore uses composite Gauss–Legendre on panels graded
geometrically towards both ends (``[2^-(k+1), 2^-k]`` and their mirror images, ``k < P``, plus ``[0, 2^-P]`` and
``[1 − 2^-P, 1]``), ``n`` nodes each:

- on a panel ``[a, 2a]`` the nearest singularity is at least ``a`` from its nearer end (it lies outside
  ``(0, 1)``), so the panel sits in a Bernstein ellipse of parameter ``ρ ≥ 3 + √8 ≈ 5.8`` around it and the
  ``n``-point error is at most ``(64/15) (a/2) M ρ^(−2n) / (ρ² − 1)`` with ``M`` the bound of ``g`` on that ellipse
  (Trefethen, *Approximation Theory and Approximation Practice*, Thm 19.3, scaled to the panel): about
  ``5.8^-20 ≈ 5e-16`` relative for ``n = 10``;
- the panel ``[0, h]`` (``h = 2^-P``) holds ``∫_0^h g ≈ h (c log(1/h) + d)``, integrated with an error of order
  ``h log(1/h) / n²`` (Gauss–Legendre on a logarithmic endpoint singularity): ``≈ 3e-13 · c`` for ``P = 40``,
  ``n = 10``;

so the default rule (``P = 40``, ``n = 10``: 820 nodes) is exact to ~1e-12 nats for a tiny vocabulary and a
denoiser smooth in ``t``. :func:`uniform_exact_elbo` also reports an a-posteriori error estimate, ``|Q_n − Q_⌈n/2⌉|``
(the same panels with half the nodes), which bounds ``|Q_n − I|`` whenever the rule converges geometrically
(then ``|Q_⌈n/2⌉ − I| ≫ |Q_n − I|``).

Besides the continuous-time value, this module gives the discrete-time grid ELBO with ``T`` steps and the ``T``-step
model's exact log-likelihood (a forward pass over the ``N^n`` states): ``ELBO_T ≤ log p_T(x)`` for every ``T``, and
``ELBO_T`` tends to the continuous ELBO as ``T → ∞``; and the exact expectation of NeMo AutoModel's flat
cross-entropy surrogate.

Reference: UDLM arXiv 2412.10193 (the uniform-noise posterior and the grid and continuous-time ELBOs); Duo arXiv
2506.10892; NeMo AutoModel ``corrupt_uniform_random`` / ``BlockDiffusionCrossEntropyLoss``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from dlmrl.estimators.configurable import ConfigurableEstimator
from dlmrl.estimators.quadrature import gauss_legendre_unit
from dlmrl.estimators.scoring import Estimate
from dlmrl.estimators.uniform_elbo import (
    FLAT_CE_SUPPORTS,
    LINEAR,
    Denoiser,
    UniformSchedule,
    _check_inputs,
    _check_times,
    _denoise_log_probs,
    uniform_nelbo_integrand,
)
from dlmrl.estimators.validation import check_positive_int

DEFAULT_MAX_STATES = 4096
DEFAULT_CANVASES_PER_CALL = 8192


def graded_gauss_legendre(panels: int = 40, nodes_per_panel: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """Composite Gauss–Legendre on ``[0, 1]``, panels graded geometrically towards both ends.

    Panels ``[0, 2^-P]``, ``[2^-(k+1), 2^-k]`` for ``k = P−1, ..., 1``, then their mirror images ``1 − ·`` up to
    ``[1 − 2^-P, 1]`` (``2P`` panels in all), ``n`` Gauss–Legendre nodes each (module docstring: error analysis).

    Args:
        panels: ``P`` (>= 1): the innermost panels have width ``2^-P``.
        nodes_per_panel: ``n`` (>= 1).
    Returns:
        ``(t (2P·n,) float64 ascending in (0, 1), w (2P·n,) float64)``, ``Σ w = 1``.
    Raises:
        OptionError: ``panels`` or ``nodes_per_panel`` not an integer >= 1.
    """
    check_positive_int(panels, "panels")
    check_positive_int(nodes_per_panel, "nodes_per_panel")
    s, omega = gauss_legendre_unit(nodes_per_panel)
    # left half: edges 0, 2^-P, ..., 1/4, 1/2
    edges = [0.0] + [2.0 ** (-k) for k in range(panels, 0, -1)]
    ts, ws = [], []
    for a, b in itertools.pairwise(edges):
        ts.append(a + (b - a) * s)
        ws.append((b - a) * omega)
    left_t, left_w = torch.cat(ts), torch.cat(ws)
    # right half: 1 − (mirror image), built from the small widths so the nodes near 1 keep their digits in 1 − t
    right_t = torch.flip(1.0 - left_t, [0])
    right_w = torch.flip(left_w, [0])
    return torch.cat([left_t, right_t]), torch.cat([left_w, right_w])


def _states(
    x: torch.Tensor, completion_mask: torch.Tensor, vocab_size: int, max_states: int
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Every noise state of each row, padded to the longest row.

    Returns ``(z (S, B, L) long, valid (S, B) bool, lengths)`` with ``S = N^(max n_b)``: state ``s`` of row ``b``
    writes the first ``n_b`` base-``N`` digits of ``s`` into the row's completion positions (in order) and is
    valid when its other digits are 0, so each of the row's ``N^(n_b)`` states appears exactly once.
    """
    allowed = completion_mask.bool()
    lengths = allowed.sum(-1).tolist()
    n_max = max(lengths, default=0)
    num = vocab_size**n_max
    if num > max_states:
        raise ValueError(
            f"exact enumeration needs N^n = {vocab_size}^{n_max} = {num} noise states per time > max_states = "
            f"{max_states}; use a shorter canvas or a smaller vocabulary (or the Monte Carlo estimators)"
        )
    codes = torch.arange(num)
    digits = (codes[:, None] // (vocab_size ** torch.arange(n_max))) % vocab_size  # (S, n_max)
    z = x[None].expand(num, -1, -1).clone().cpu()  # (S, B, L)
    valid = torch.ones(num, x.shape[0], dtype=torch.bool)
    for b, n in enumerate(lengths):
        positions = allowed[b].nonzero()[:, 0].cpu()
        z[:, b, positions] = digits[:, :n].to(z.dtype)
        valid[:, b] = (digits[:, n:] == 0).all(-1)
    return z.to(x.device), valid.to(x.device), lengths


def _position_probs(z: torch.Tensor, x: torch.Tensor, allowed: torch.Tensor, t: torch.Tensor, vocab_size: int,
                    schedule: UniformSchedule) -> torch.Tensor:
    """``(T, S, B, L)`` float64: ``q_t(z_i | x_i)`` at the completion positions, 1 elsewhere."""
    t = t.to(torch.float64).to(z.device)
    alpha, noise = schedule.alpha(t), schedule.noise(t)
    stay = (alpha + noise / vocab_size)[:, None, None, None]
    move = (noise / vocab_size)[:, None, None, None]
    match = (z == x[None])[None]  # (1, S, B, L)
    probs = torch.where(match, stay, move)
    return torch.where(allowed[None, None], probs, torch.ones((), dtype=torch.float64, device=z.device))


def _for_each_time(denoise: Denoiser, z: torch.Tensor, t: torch.Tensor, vocab_size: int, canvases_per_call: int):
    """Yield ``(slice of t, log-probs (T_c, S, B, L, N))``: the denoiser on every state at every time, in calls of
    at most ``canvases_per_call`` canvases (``K = T_c·S`` draws of the batch's rows each)."""
    num = z.shape[0]
    per_call = max(1, canvases_per_call // max(num, 1))
    for a in range(0, t.shape[0], per_call):
        sl = slice(a, min(a + per_call, t.shape[0]))
        tc = t[sl]
        zz = z[None].expand(tc.shape[0], -1, -1, -1).reshape(-1, *z.shape[1:])  # (T_c·S, B, L)
        tt = tc.repeat_interleave(num)  # (T_c·S,)
        logp = _denoise_log_probs(denoise, zz, tt, vocab_size)
        yield sl, logp.reshape(tc.shape[0], num, *logp.shape[1:])


def expected_integrand(
    denoise: Denoiser,
    x: torch.Tensor,
    completion_mask: torch.Tensor,
    vocab_size: int,
    t: torch.Tensor,
    schedule: UniformSchedule = LINEAR,
    max_states: int = DEFAULT_MAX_STATES,
    canvases_per_call: int = DEFAULT_CANVASES_PER_CALL,
) -> torch.Tensor:
    """``g_i(t) = E_{z ~ q_t(·|x)} ℓ_i(z, t)`` exactly, by enumerating every noise state of each row.

    Args:
        denoise: ``(z (K, B, L), t (K,)) -> logits (K, B, L, N)``; called with ``K = T_c · N^n`` canvases (every
            state at ``T_c`` times) per call.
        x: ``(B, L)`` long clean tokens; completion_mask ``(B, L)`` bool, the positions noised and scored.
        vocab_size: ``N``.
        t: ``(T,)`` float64 times in ``(0, 1]``.
        schedule: ``α_t``.
        max_states: refuse rows with more than this many noise states ``N^n``.
        canvases_per_call: the most canvases per ``denoise`` call (at least one time's states).
    Returns:
        ``(T, B, L)`` float64 (for float64 logits; float32 otherwise), nats per unit time, ≥ 0, 0 outside the mask.
    Raises:
        ValueError: ``N^n > max_states`` for some row, a time outside ``(0, 1]``, or bad shapes.
    """
    _check_inputs(x, completion_mask, vocab_size)
    t = torch.as_tensor(t, dtype=torch.float64)
    _check_times(t, "expected_integrand")
    allowed = completion_mask.bool()
    z, valid, _ = _states(x, allowed, vocab_size, max_states)
    out = []
    for sl, logp in _for_each_time(denoise, z, t, vocab_size, canvases_per_call):
        tc = t[sl].to(logp.device)
        ell = uniform_nelbo_integrand(logp, z[None], x, tc[:, None, None, None], schedule)  # (T_c, S, B, L)
        q = _position_probs(z, x, allowed, tc, vocab_size, schedule).prod(-1) * valid[None]  # (T_c, S, B)
        out.append((q[..., None].to(ell.dtype) * torch.where(allowed, ell, 0.0)).sum(1))
    return torch.cat(out)


@dataclass
class UniformExactELBO:
    """The exact ELBO and the quadrature's a-posteriori error estimate.

    Attributes:
        estimate: ``sequence (B,)``, ``per_token (B, L)`` (nats), ``nfe`` = canvases scored per row.
        error_estimate: ``(B,)`` float64 ``|Q_n − Q_⌈n/2⌉|`` per sequence (nats).
    """

    estimate: Estimate
    error_estimate: torch.Tensor


def uniform_exact_elbo(
    denoise: Denoiser,
    x: torch.Tensor,
    completion_mask: torch.Tensor,
    vocab_size: int,
    panels: int = 40,
    nodes_per_panel: int = 10,
    schedule: UniformSchedule = LINEAR,
    max_states: int = DEFAULT_MAX_STATES,
    canvases_per_call: int = DEFAULT_CANVASES_PER_CALL,
) -> UniformExactELBO:
    """The continuous-time ELBO ``−∫_0^1 Σ_i g_i(t) dt``: exact expectation over the noise, graded quadrature in t.

    Args:
        denoise, x, completion_mask, vocab_size, schedule, max_states, canvases_per_call: as
            :func:`expected_integrand`.
        panels, nodes_per_panel: the rule :func:`graded_gauss_legendre` (``P``, ``n``); the error estimate reruns
            the panels with ``⌈n/2⌉`` nodes.
    Returns:
        :class:`UniformExactELBO`; ``per_token`` ≤ 0, 0 outside the mask; rows with no completion position give 0.
    Raises:
        ValueError: as :func:`expected_integrand`.

    Reference: UDLM arXiv 2412.10193 (continuous-time ELBO); quadrature: module docstring.
    """
    t, w = graded_gauss_legendre(panels, nodes_per_panel)
    tc, wc = graded_gauss_legendre(panels, max(1, math.ceil(nodes_per_panel / 2)))
    kw = {"schedule": schedule, "max_states": max_states, "canvases_per_call": canvases_per_call}
    g = expected_integrand(denoise, x, completion_mask, vocab_size, torch.cat([t, tc]), **kw)  # (T + T_c, B, L)
    fine, coarse = g[: t.shape[0]], g[t.shape[0]:]
    per_token = -(w.to(g.device, g.dtype)[:, None, None] * fine).sum(0)
    coarse_tok = -(wc.to(g.device, g.dtype)[:, None, None] * coarse).sum(0)
    error = (per_token.sum(-1) - coarse_tok.sum(-1)).abs().double()
    n_max = int(completion_mask.bool().sum(-1).max()) if x.numel() else 0
    nfe = t.shape[0] * vocab_size**n_max
    return UniformExactELBO(Estimate(sequence=per_token.sum(-1), per_token=per_token, nfe=nfe), error)


@dataclass(frozen=True)
class UniformExact(ConfigurableEstimator):
    """Exact enumeration of the uniform-noise ELBO, as an estimator (for analysis: ``(2P·n) · N^n`` passes).

    Args:
        panels, nodes_per_panel: the graded Gauss–Legendre rule (:func:`graded_gauss_legendre`).
        max_states: refuse rows with more than this many noise states ``N^n``.

    Reference: UDLM arXiv 2412.10193 (continuous-time ELBO), by enumeration (:func:`uniform_exact_elbo`).
    """

    panels: int = 40
    nodes_per_panel: int = 10
    max_states: int = DEFAULT_MAX_STATES
    name = "uniform_exact"
    nfe_formula = "2·panels·nodes_per_panel · N^L (every noise state at every node)"
    trainable = False  # (exponential in L: for analysis)

    def __post_init__(self) -> None:
        check_positive_int(self.panels, "panels")
        check_positive_int(self.nodes_per_panel, "nodes_per_panel")
        check_positive_int(self.max_states, "max_states")

    @property
    def nfe(self) -> None:
        """Depends on the canvas and the vocabulary: ``2P·n · N^L``."""
        return None

    def nfe_for(self, length: int) -> None:
        return None  # (the vocabulary size is known only at the call)

    def estimate(
        self,
        denoise: Denoiser,
        x: torch.Tensor,
        completion_mask: torch.Tensor,
        vocab_size: int,
        generator: torch.Generator | int | None = None,
        micro_batch: int | None = None,
    ) -> Estimate:
        """:func:`uniform_exact_elbo`'s estimate (``generator`` unused; ``micro_batch``: canvases per call)."""
        return uniform_exact_elbo(
            denoise, x, completion_mask, vocab_size, self.panels, self.nodes_per_panel,
            max_states=self.max_states, canvases_per_call=micro_batch or DEFAULT_CANVASES_PER_CALL,
        ).estimate


def expected_flat_ce(
    denoise: Denoiser,
    x: torch.Tensor,
    completion_mask: torch.Tensor,
    vocab_size: int,
    eps: float = 1e-3,
    support: str = "all",
    num_nodes: int = 16,
    max_states: int = DEFAULT_MAX_STATES,
    canvases_per_call: int = DEFAULT_CANVASES_PER_CALL,
) -> torch.Tensor:
    """The expectation of :class:`~dlmrl.estimators.uniform_elbo.UniformFlatCE` (one draw), exactly.

    ``E_{t ~ U(ε, 1)} E_{z, c} Σ_i [i ∈ support] log p_θ(x_i | z)`` with ``α_t = 1 − t``: the noise by enumeration;
    for ``support = 'corrupted'``, ``P(i corrupted, z) = (t/N) Π_{k≠i} q_t(z_k | x_k)`` (a redraw lands on any
    token w.p. ``1/N``). Over ``t``, Gauss–Legendre with ``num_nodes`` nodes on ``[ε, 1]``: exact for a denoiser
    that ignores ``t`` once ``2·num_nodes − 1 ≥ n`` (the integrand is then a polynomial of degree ``n`` in ``t``).

    Returns:
        ``(B, L)`` per-token expectation (nats, ≤ 0; 0 outside the mask).
    Raises:
        ValueError: an unknown ``support``, ``N^n > max_states``.

    Reference: NeMo AutoModel ``corrupt_uniform_random`` and ``BlockDiffusionCrossEntropyLoss``.
    """
    if support not in FLAT_CE_SUPPORTS:
        raise ValueError(f"support must be one of {FLAT_CE_SUPPORTS}, got {support!r}")
    _check_inputs(x, completion_mask, vocab_size)
    allowed = completion_mask.bool()
    s, omega = gauss_legendre_unit(num_nodes)
    t = eps + (1.0 - eps) * s
    z, valid, _ = _states(x, allowed, vocab_size, max_states)
    total = None
    for sl, logp in _for_each_time(denoise, z, t, vocab_size, canvases_per_call):
        tc = t[sl]
        logp_x = torch.gather(logp, -1, x[None, None, ..., None].expand(*logp.shape[:-1], 1)).squeeze(-1)
        qi = _position_probs(z, x, allowed, tc, vocab_size, LINEAR)  # (T_c, S, B, L)
        q = qi.prod(-1, keepdim=True) * valid[None, ..., None]  # (T_c, S, B, 1)
        if support == "corrupted":
            weight = q / qi * (tc.to(q.device) / vocab_size)[:, None, None, None]
        else:
            weight = q.expand_as(qi)
        part = (omega[sl].to(q.device)[:, None, None, None] * weight.to(logp_x.dtype)
                * torch.where(allowed, logp_x, 0.0)).sum((0, 1))
        total = part if total is None else total + part
    return total


def uniform_posterior(probs: torch.Tensor, z_t: torch.Tensor, alpha_s: float, alpha_t: float) -> torch.Tensor:
    """``q(z_s | z_t, x)`` for ``s < t`` with ``probs`` in place of the one-hot ``x`` (UDLM's plug-in reverse step).

    ``∝ [α_{t|s} [z_s = z_t] + (1 − α_{t|s})/N] · [α_s x_{z_s} + (1 − α_s)/N]`` with ``α_{t|s} = α_t/α_s``: Bayes'
    rule with the marginal ``q_s(· | x)``; it equals UDLM's closed form ``[N α_t z_t⊙x + (α_{t|s} − α_t) z_t +
    (α_s − α_t) x + (α_s − α_t)(1 − α_s)/(N α_s)] / [N α_t⟨z_t, x⟩ + 1 − α_t]``.

    Args:
        probs: ``(..., N)`` float64 clean-token distribution (one-hot ``x`` or the denoiser's ``x_θ``).
        z_t: ``(...)`` long.
        alpha_s, alpha_t: ``1 ≥ α_s > α_t ≥ 0``.
    Returns:
        ``(..., N)`` float64 distribution over ``z_s``.

    Reference: UDLM arXiv 2412.10193 (uniform-noise posterior, from MDLM's interpolating framework).
    """
    n = probs.shape[-1]
    a_ts = alpha_t / alpha_s
    stay = torch.nn.functional.one_hot(z_t, n).to(probs.dtype)
    forward = a_ts * stay + (1.0 - a_ts) / n  # q(z_t | z_s = j) as a function of j
    prior = alpha_s * probs + (1.0 - alpha_s) / n  # q_s(j | x)
    joint = forward * prior
    return joint / joint.sum(-1, keepdim=True)


def _grid(steps: int, schedule: UniformSchedule) -> tuple[torch.Tensor, torch.Tensor]:
    check_positive_int(steps, "steps")
    t = torch.arange(steps + 1, dtype=torch.float64) / steps  # t_0 = 0, ..., t_T = 1
    return t, schedule.alpha(t)


def discrete_time_elbo(
    denoise: Denoiser,
    x: torch.Tensor,
    completion_mask: torch.Tensor,
    vocab_size: int,
    steps: int,
    schedule: UniformSchedule = LINEAR,
    max_states: int = DEFAULT_MAX_STATES,
    canvases_per_call: int = DEFAULT_CANVASES_PER_CALL,
) -> torch.Tensor:
    """The ``T``-step grid ELBO ``−Σ_k E_{q(z_{t_k}|x)} Σ_i KL(q(z_{t_{k−1},i} | z_{t_k}, x) ‖ p_θ(z_{t_{k−1},i} | z_{t_k}))``.

    Grid ``t_k = k/T``; ``p_θ`` is :func:`uniform_posterior` with ``x_θ(z_{t_k}, t_k)``. With ``α_1 = 0`` the prior
    term ``KL(q(z_1|x) ‖ u)`` is 0, and with ``α_0 = 1`` the last step's KL is ``−log p_θ(z_0 = x | z_{t_1})`` (the
    reconstruction term), so this is the whole bound: ``≤ log p_T(x)`` (:func:`discrete_time_log_likelihood`).
    It tends to :func:`uniform_exact_elbo` as ``T → ∞``.

    Returns:
        ``(B, L)`` float64 per-token terms (nats, ≤ 0; 0 outside the mask).

    Reference: UDLM arXiv 2412.10193 (the discrete-time ELBO of uniform-noise diffusion).
    """
    _check_inputs(x, completion_mask, vocab_size)
    allowed = completion_mask.bool()
    z, valid, _ = _states(x, allowed, vocab_size, max_states)
    t_grid, a_grid = _grid(steps, schedule)
    x_hot = torch.nn.functional.one_hot(x, vocab_size).to(torch.float64)  # (B, L, N)
    total = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    t_hi = t_grid[1:]  # the upper time of each step, k = 1..T
    for sl, logp in _for_each_time(denoise, z, t_hi, vocab_size, canvases_per_call):
        for j, k in enumerate(range(sl.start + 1, sl.stop + 1)):
            a_s, a_t = float(a_grid[k - 1]), float(a_grid[k])
            probs = logp[j].to(torch.float64).exp()  # (S, B, L, N)
            q_post = uniform_posterior(x_hot[None].expand_as(probs), z, a_s, a_t)
            p_post = uniform_posterior(probs, z, a_s, a_t)
            kl = torch.where(q_post > 0, q_post * (q_post.log() - p_post.log()), 0.0).sum(-1)  # (S, B, L)
            q = _position_probs(z, x, allowed, t_grid[k : k + 1], vocab_size, schedule)[0].prod(-1) * valid
            total = total - (q[..., None] * torch.where(allowed, kl, 0.0)).sum(0)
    return total


def discrete_time_log_likelihood(
    denoise: Denoiser,
    x: torch.Tensor,
    completion_mask: torch.Tensor,
    vocab_size: int,
    steps: int,
    schedule: UniformSchedule = LINEAR,
    max_states: int = DEFAULT_MAX_STATES,
    canvases_per_call: int = DEFAULT_CANVASES_PER_CALL,
) -> torch.Tensor:
    """``log p_T(x)`` of the ``T``-step model, exactly: a forward pass over the ``N^n`` states of each row.

    ``z_1`` uniform over the row's states, then ``T`` factorised reverse steps ``p_θ(z_{t_{k−1}} | z_{t_k})``
    (:func:`uniform_posterior` with ``x_θ``, the positions independent given ``z_{t_k}``); ``p_T(x)`` is the
    probability of the clean canvas at ``t_0 = 0``.

    Returns:
        ``(B,)`` float64 (nats, ≤ 0); 0 for a row with no completion position.

    Reference: UDLM arXiv 2412.10193 (the reverse process ``p_θ``).
    """
    _check_inputs(x, completion_mask, vocab_size)
    allowed = completion_mask.bool()
    z, valid, lengths = _states(x, allowed, vocab_size, max_states)
    t_grid, a_grid = _grid(steps, schedule)
    rows = []
    for b, n in enumerate(lengths):
        idx = valid[:, b].nonzero()[:, 0]  # the row's N^n states
        pos = allowed[b].nonzero()[:, 0]
        zb = z[idx][:, b][:, pos]  # (S_b, n) the states' tokens at the row's positions
        clean = int((zb == x[b, pos][None]).all(-1).nonzero()[0, 0])
        v = torch.full((idx.shape[0],), float(vocab_size) ** -n, dtype=torch.float64, device=x.device)
        rows.append((idx, pos, zb, clean, v))
    # run the steps from t_T = 1 down to t_1; the denoiser is needed at the step's upper time
    ks = list(range(steps, 0, -1))
    t_hi = t_grid[torch.tensor(ks)]
    for sl, logp in _for_each_time(denoise, z, t_hi, vocab_size, canvases_per_call):
        for j, k in enumerate(ks[sl]):
            a_s, a_t = float(a_grid[k - 1]), float(a_grid[k])
            probs = logp[j].to(torch.float64).exp()  # (S, B, L, N)
            for b, (idx, pos, zb, clean, v) in enumerate(rows):
                if pos.numel() == 0:
                    continue
                post = uniform_posterior(probs[idx][:, b][:, pos], zb, a_s, a_t)  # (S_b, n, N)
                # M[z, z'] = Π_i post[z, i, z'_i]: the positions move independently given z
                m = torch.stack([post[:, i, zb[:, i]] for i in range(pos.numel())], -1).prod(-1)  # (S_b, S_b)
                rows[b] = (idx, pos, zb, clean, v @ m)
    return torch.stack(
        [torch.log(v[clean]) if pos.numel() else torch.zeros((), dtype=torch.float64) for _, pos, _, clean, v in rows]
    )
