"""Likelihood estimators for uniform-noise discrete diffusion (no mask token): UDLM's continuous-time ELBO.

**Forward process.** Each scored position is corrupted independently, ``q(z_t | x) = Cat(z_t; α_t x + (1 − α_t) u)``
with ``u = 1/N`` on every token of the vocabulary (size ``N``). There is no absorbing state: a corrupted position
may hold any token, the clean one included. We use the **linear schedule** ``α_t = 1 − t``, ``t ∈ (0, 1]``: it is the
corruption NeMo AutoModel's DiffusionGemma SFT recipe trains with (``corrupt_uniform_random`` in
``nemo_automodel/components/datasets/dllm/corruption.py``: one level ``t ~ U(ε, 1)`` per example, a position
replaced w.p. ``t`` by ``randint(0, vocab_size)``, which may land on the clean token, so
``P(z_t = x) = 1 − t + t/N``, i.e. ``α_t = 1 − t``), and it is UDLM's (its continuous-time loss hard-codes the
log-linear schedule ``α_t = 1 − t``, ``α'_t = −1``). DiffusionGemma's decoder takes no time input, so ``t`` enters
a ``denoise`` callable only if the caller wants it to.

**The bound.** With ``x̄ = N α_t x + (1 − α_t) 1`` and ``x̄_θ = N α_t x_θ(z_t, t) + (1 − α_t) 1`` (both ``N`` times a
marginal ``q_t(· | ·)``, so each sums to ``N``), ``i`` the token at ``z_t``, the per-position NELBO integrand is

    ℓ(z_t, t) = (α'_t / (N α_t)) · [ N/x̄_i − N/x̄_θ,i − Σ_{j ≠ i} (x̄_j / x̄_i) · log( x̄_θ,i x̄_j / (x̄_θ,j x̄_i) ) ]  ≥ 0

and ``log p_θ(x) ≥ −∫_0^1 E_{q(z_t | x)} Σ_positions ℓ dt``. With ``α_0 = 1`` (``z_0 = x``: no reconstruction term)
and ``α_1 = 0`` (``q(z_1 | x) = u``, the prior: its KL is 0) the bound has **no boundary terms**. ``p_θ`` is UDLM's
reverse process: the posterior ``q(z_s | z_t, x)`` with ``x_θ(z_t, t)`` plugged in for ``x``, in the limit of
infinitely many steps (a continuous-time Markov chain with rates ``(−α'_t/α_t)(1/N) x̄_θ,j / x̄_θ,i`` from ``i`` to
``j``); it is not the output distribution of DiffusionGemma's entropy-bounded sampler. For a denoiser that ignores
``z_t`` (``x_θ = π``) ``p_θ`` is the exact reversal of the forward process started at ``x ~ π``, so the bound is
tight there: ``ELBO = log p_θ(x) = Σ_i log π_i(x_i)``, the closed form the tests check the quadrature against.

We evaluate the bracket as ``Σ_j ρ_j h(y_j)`` with ``ρ_j = x̄_j/x̄_i``, ``y_j = log(x̄_θ,j/x̄_θ,i) − log ρ_j`` and
``h(y) = e^y − 1 − y ≥ 0`` (algebraically the same: ``Σ_j x̄_j = Σ_j x̄_θ,j = N``); each term is the KL rate of one
jump ``i → j``, so the sum has no cancellation between terms, and ``h`` is taken from its Taylor series where
``|y|`` is small, where ``e^y − 1 − y`` would cancel (``t → 1``, ``α_t → 0``). (dlmrl interpretation: the
rearrangement is ours; the value is UDLM's.)

**Estimators** (per-token ``(B, L)`` terms ``c^i``, nats, ``Σ_i c^i`` the sequence estimate, 0 outside the
completion mask; every completion position contributes in every draw, corrupted or not):

- :class:`UniformDoubleMC`: ``K`` times, one noise draw each (optionally stratified, and with ``t = s^p`` for
  ``s`` uniform: ``p = 1`` is UDLM/Duo's time sampling, ``p = 2`` makes the variance finite, see the class);
- :class:`UniformSDMC`: Gauss–Legendre nodes over ``t`` (or over ``s`` with ``t = s^p``), ``K`` noise draws per
  node;
- :class:`UniformFlatCE`: NeMo AutoModel's flat cross-entropy, **a surrogate, not a bound**.

All take a ``denoise(z_t (K, B, L) long, t (K,) float64) -> logits (K, B, L, N)`` callable, the clean tokens
``x (B, L)`` and a ``completion_mask (B, L)`` (only those positions are noised; the others, e.g. the prompt or given
cells, stay clean), and draw their randomness from an explicit ``torch.Generator`` (or an integer seed) through a
:class:`UniformNoisePlan`, so that several policies can be scored on identical noise (common random numbers).
``denoise`` must be a deterministic function of ``(z_t, t)`` for the bound to hold: a self-conditioned model is one
if its self-conditioning input is fixed (zeros) or computed inside ``denoise`` from a first pass on the same
``z_t`` (dlmrl interpretation: which of the two the policy uses is the caller's decision).

Reference: UDLM, Schiff et al., arXiv 2412.10193 (uniform-noise posterior and the continuous-time ELBO; released
code ``kuleshov-group/discrete-diffusion-guidance``, ``diffusion.py``, the ``diffusion == 'uniform'`` branch of the
continuous-time loss); Duo, Sahoo et al., arXiv 2506.10892 (restates that NELBO for uniform-state diffusion;
``s-sahoo/duo``, ``algo.py``, ``DUO_BASE.nll_per_token``); NeMo AutoModel ``BlockDiffusionCrossEntropyLoss``
(``nemo_automodel/components/loss/dllm_loss.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from dlmrl.estimators.configurable import ConfigurableEstimator, SamplerSettings
from dlmrl.estimators.quadrature import gauss_legendre_unit
from dlmrl.estimators.scoring import Estimate, as_generator
from dlmrl.estimators.validation import OptionError, check_positive_int, check_unit_interval

#: ``denoise(z_t (K, B, L) long, t (K,) float64) -> logits (K, B, L, N)``: the clean-token prediction's logits.
Denoiser = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

#: Below this |y| the bracket's ``h(y) = e^y − 1 − y`` comes from its Taylor series (to y^9): there the direct
#: form loses ~2·eps/|y| relative (≤ 40 eps at 0.05), the truncated series ~2·|y|^8/10! (≤ 3e-17 at 0.05).
_SERIES_BELOW = 0.05
_SERIES = tuple(1.0 / math.factorial(k) for k in range(2, 10))  # 1/2!, 1/3!, ..., 1/9!


class UniformSchedule(Protocol):
    """A noise schedule of the uniform process: ``α_t`` decreasing from ``α_0 = 1`` to ``α_1 = 0``.

    Each method maps a float64 tensor of times to a float64 tensor of the same shape. ``noise(t) = 1 − α_t`` is a
    method of its own so that a schedule can return it without the rounding of ``1 − α_t`` near ``t = 0``.
    """

    def alpha(self, t: torch.Tensor) -> torch.Tensor: ...

    def noise(self, t: torch.Tensor) -> torch.Tensor: ...

    def dalpha(self, t: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class LinearSchedule:
    """``α_t = 1 − t``, ``1 − α_t = t``, ``α'_t = −1``: a position is replaced w.p. ``t`` by a uniform token.

    Reference: UDLM arXiv 2412.10193 (log-linear schedule of its continuous-time uniform loss); NeMo AutoModel
    ``corrupt_uniform_random`` (DiffusionGemma SFT corruption, ``t ~ U(ε, 1)``).
    """

    def alpha(self, t: torch.Tensor) -> torch.Tensor:
        return 1.0 - t

    def noise(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def dalpha(self, t: torch.Tensor) -> torch.Tensor:
        return -torch.ones_like(t)


LINEAR = LinearSchedule()


def _compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    """float64 stays float64; every other floating dtype (bf16, fp16, fp32) is computed in float32."""
    return torch.float64 if tensor.dtype == torch.float64 else torch.float32


def _check_times(t: torch.Tensor, where: str) -> None:
    if not bool(((t > 0) & (t <= 1)).all()):
        bad = t[~((t > 0) & (t <= 1))].flatten()[0].item()
        raise ValueError(f"{where}: diffusion times must lie in (0, 1], got {bad!r}")


def _h_times_rho(y: torch.Tensor, log_rho: torch.Tensor) -> torch.Tensor:
    """``ρ · h(y) = ρ (e^y − 1 − y)`` with ``ρ = exp(log_rho)``, elementwise and without cancellation.

    Direct branch ``exp(log ρ + y) − ρ − ρ y`` (``exp(log ρ + y) = x̄_θ,j / x̄_θ,i`` never overflows); series branch
    ``ρ y² Σ_k y^(k−2)/k!`` for ``|y| < 0.05``, on ``y`` clamped to that range so that the branch not taken stays
    finite and its gradient is 0, not NaN.
    """
    rho = torch.exp(log_rho)
    direct = torch.exp(log_rho + y) - rho - rho * y
    ys = y.clamp(-_SERIES_BELOW, _SERIES_BELOW)
    poly = torch.full_like(ys, _SERIES[-1])
    for c in reversed(_SERIES[:-1]):
        poly = poly * ys + c
    series = rho * ys * ys * poly
    return torch.where(y.abs() < _SERIES_BELOW, series, direct)


def uniform_nelbo_integrand(
    log_x_theta: torch.Tensor,
    z_t: torch.Tensor,
    x: torch.Tensor,
    t: torch.Tensor | float,
    schedule: UniformSchedule = LINEAR,
) -> torch.Tensor:
    """The per-position integrand ``ℓ(z_t, t) ≥ 0`` (nats per unit time) of UDLM's continuous-time NELBO.

    ``ℓ = (α'_t/(N α_t)) [N/x̄_i − N/x̄_θ,i − Σ_{j≠i} (x̄_j/x̄_i) log(x̄_θ,i x̄_j / (x̄_θ,j x̄_i))]`` with
    ``x̄ = N α_t x + (1 − α_t)``, ``x̄_θ = N α_t x_θ + (1 − α_t)``, ``i`` the token of ``z_t`` (module docstring).
    ``log p_θ(x) ≥ −∫_0^1 E_{z_t ~ q(·|x)} Σ_positions ℓ(z_t, t) dt``; no boundary terms for a schedule with
    ``α_0 = 1`` and ``α_1 = 0``. ``ℓ = 0`` when ``x_θ`` is the one-hot ``x`` (a perfect denoiser), and ``ℓ = 0`` at
    ``α_t = 0`` (its limit; the formula there reads 0/0).

    Args:
        log_x_theta: ``(..., L, N)`` log-probabilities of the clean-token prediction ``x_θ(z_t, t)`` (a
            ``log_softmax`` of the logits; ``-inf`` entries allowed, so an exactly one-hot prediction is
            representable). Log-probabilities, not probabilities, so that ``log x̄_θ`` is taken as
            ``log(1 − α_t) + log1p(r·x_θ)`` with ``log(r·x_θ) = log r + log x_θ``, free of underflow.
        z_t: ``(..., L)`` long noisy tokens (broadcastable against ``log_x_theta[..., 0]``).
        x: ``(..., L)`` long clean tokens, broadcastable against ``z_t``.
        t: diffusion time(s) in ``(0, 1]``: a float or a tensor broadcastable against ``z_t`` (e.g. ``(K, 1, 1)``
            for ``z_t (K, B, L)``).
        schedule: ``α_t`` (default :data:`LINEAR`, ``α_t = 1 − t``).
    Returns:
        ``(..., L)`` tensor, float64 if ``log_x_theta`` is float64, else float32: ``ℓ`` at each position (nats per
        unit time; the NELBO integrand, ≥ 0). Differentiable in ``log_x_theta``.
    Raises:
        ValueError: shapes that do not broadcast, a token outside ``[0, N)``, or a time outside ``(0, 1]``.

    Reference: UDLM arXiv 2412.10193 (continuous-time ELBO for uniform noise; code
    ``kuleshov-group/discrete-diffusion-guidance`` ``diffusion.py``); Duo arXiv 2506.10892 (the same NELBO;
    ``s-sahoo/duo`` ``algo.py`` ``DUO_BASE.nll_per_token``).
    """
    n = log_x_theta.shape[-1]
    dtype = _compute_dtype(log_x_theta)
    device = log_x_theta.device
    logp = log_x_theta.to(dtype)
    try:
        shape = torch.broadcast_shapes(tuple(logp.shape[:-1]), tuple(z_t.shape), tuple(x.shape))
    except RuntimeError as err:
        raise ValueError(
            f"uniform_nelbo_integrand: log_x_theta (..., L, N) = {tuple(log_x_theta.shape)}, z_t {tuple(z_t.shape)} "
            f"and x {tuple(x.shape)} do not broadcast"
        ) from err
    for name, tokens in (("z_t", z_t), ("x", x)):
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= n):
            raise ValueError(f"uniform_nelbo_integrand: {name} holds a token outside [0, {n}) (N = log_x_theta's last dim)")
    t64 = torch.as_tensor(t, dtype=torch.float64, device=device)
    _check_times(t64, "uniform_nelbo_integrand")
    alpha, noise, dalpha = schedule.alpha(t64), schedule.noise(t64), schedule.dalpha(t64)
    positive = alpha > 0
    # log r, r = N α / (1 − α): x̄_θ,j = (1 − α)(1 + r x_θ,j); -inf at α = 0 (then every term below is exactly 0)
    log_r = (math.log(n) + torch.log(alpha) - torch.log(noise)).to(dtype)
    coef = torch.where(positive, -dalpha / (n * torch.where(positive, alpha, torch.ones_like(alpha))), 0.0).to(dtype)
    log_r = log_r.broadcast_to(shape)
    coef = coef.broadcast_to(shape)
    logp = logp.broadcast_to((*shape, n))
    z_t = z_t.broadcast_to(shape)
    x = x.broadcast_to(shape)
    zero = torch.zeros((), dtype=dtype, device=device)
    # L_θ,j = log(x̄_θ,j / (1 − α)) = log1p(r x_θ,j), and the clean side by the same elementwise op on a tensor of
    # the same shape (the one-hot x as log-probs): a one-hot x_θ then gives bit-identical values and ℓ = 0 exactly
    # (a separate, smaller call could round log1p(r) 1 ulp differently in a vectorised kernel)
    vocab = torch.arange(n, device=device)
    one_hot_log = torch.where(vocab == x[..., None], zero, float("-inf"))  # (..., L, N)
    lt = torch.logaddexp(zero, log_r[..., None] + logp)  # (..., L, N)
    l_true = torch.logaddexp(zero, log_r[..., None] + one_hot_log)  # log1p(r) at j = x, 0 elsewhere
    lt_i = torch.gather(lt, -1, z_t[..., None])  # (..., L, 1)
    log_rho = l_true - torch.gather(l_true, -1, z_t[..., None])  # log(x̄_j / x̄_i)
    y = (lt - lt_i) - log_rho  # log(x̄_θ,j / x̄_θ,i) − log(x̄_j / x̄_i); exactly 0 at j = i
    bracket = _h_times_rho(y, log_rho).sum(-1)  # (..., L), ≥ 0 termwise
    return coef * bracket


@dataclass
class UniformNoisePlan:
    """The randomness of one uniform-noise estimate: times, their weights and the noisy canvases.

    Attributes:
        t: ``(S,)`` float64 diffusion times in ``(0, 1]`` (one per draw, shared by the batch's rows).
        weights: ``(S,)`` float64 weight of each draw (quadrature weight × Jacobian of the time map / draws per
            node); the ELBO estimate is ``−Σ_s weights_s · ℓ(z_t[s], t_s)`` summed over scored positions.
        z_t: ``(S, B, L)`` long noisy canvases (clean outside the completion mask).
        corrupted: ``(S, B, L)`` bool, positions whose token was redrawn (the draw may equal the clean token).
    """

    t: torch.Tensor
    weights: torch.Tensor
    z_t: torch.Tensor
    corrupted: torch.Tensor

    @property
    def num_draws(self) -> int:
        return int(self.t.shape[0])


def _check_inputs(x: torch.Tensor, completion_mask: torch.Tensor, vocab_size: int) -> None:
    check_positive_int(vocab_size, "vocab_size")
    if x.dim() != 2 or tuple(completion_mask.shape) != tuple(x.shape):
        raise ValueError(
            f"x must be (B, L) long with completion_mask of the same shape, got x {tuple(x.shape)} and "
            f"completion_mask {tuple(completion_mask.shape)}"
        )
    if x.numel() and (int(x.min()) < 0 or int(x.max()) >= vocab_size):
        raise ValueError(f"x holds a token outside [0, vocab_size = {vocab_size})")


def sample_uniform_noise(
    x: torch.Tensor,
    completion_mask: torch.Tensor,
    t: torch.Tensor,
    vocab_size: int,
    generator: torch.Generator | int | None = None,
    schedule: UniformSchedule = LINEAR,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``z_t ~ q(· | x)`` at each time: a completion position is redrawn uniformly w.p. ``1 − α_t``.

    The redrawn token is uniform over all ``vocab_size`` tokens, the clean one included (as NeMo AutoModel's
    ``corrupt_uniform_random`` and UDLM's ``q_xt``), so ``P(z_t = x) = α_t + (1 − α_t)/N``.

    Args:
        x: ``(B, L)`` long clean tokens.
        completion_mask: ``(B, L)`` bool, positions that may be noised (the others stay clean).
        t: ``(S,)`` float64 times in ``(0, 1]``.
        vocab_size: ``N``.
        generator: ``torch.Generator`` (or an integer seed) for the draws; the draws are made on its device.
        schedule: ``α_t``.
    Returns:
        ``(z_t (S, B, L) long, corrupted (S, B, L) bool)`` on ``x``'s device.
    """
    generator = as_generator(generator, x.device)
    gen_device = generator.device if generator is not None else torch.device("cpu")
    s = t.shape[0]
    shape = (s, *x.shape)
    u = torch.rand(shape, generator=generator, device=gen_device, dtype=torch.float64).to(x.device)
    tokens = torch.randint(0, vocab_size, shape, generator=generator, device=gen_device).to(x.device)
    noise = schedule.noise(t.to(torch.float64)).to(x.device)  # (S,)
    corrupted = (u < noise[:, None, None]) & completion_mask.bool()[None]
    z_t = torch.where(corrupted, tokens.to(x.dtype), x[None])
    return z_t, corrupted


def _chunks(num_draws: int, micro_batch: int | None) -> list[slice]:
    if micro_batch is not None and (isinstance(micro_batch, bool) or not isinstance(micro_batch, int) or micro_batch < 1):
        raise ValueError(f"micro_batch must be an integer >= 1 or None, got {micro_batch!r}")
    size = num_draws if micro_batch is None else micro_batch
    return [slice(a, min(a + size, num_draws)) for a in range(0, num_draws, max(size, 1))]


def _denoise_log_probs(denoise: Denoiser, z_t: torch.Tensor, t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``log_softmax(denoise(z_t, t))`` in the compute dtype, after checking the logits' shape."""
    logits = denoise(z_t, t)
    if tuple(logits.shape) != (*z_t.shape, vocab_size):
        raise ValueError(
            f"denoise returned logits of shape {tuple(logits.shape)}; expected (K, B, L, N) = "
            f"{(*z_t.shape, vocab_size)} (N = vocab_size)"
        )
    return torch.log_softmax(logits.to(_compute_dtype(logits)), dim=-1)


def uniform_draw_terms(
    denoise: Denoiser,
    plan: UniformNoisePlan,
    x: torch.Tensor,
    completion_mask: torch.Tensor,
    vocab_size: int,
    schedule: UniformSchedule = LINEAR,
    micro_batch: int | None = None,
) -> torch.Tensor:
    """Each draw's weighted ELBO terms ``−weights_s · ℓ(z_t[s], t_s)`` at the completion positions.

    Args:
        denoise: ``(z_t (k, B, L), t (k,)) -> logits (k, B, L, N)``, called on chunks of ``micro_batch`` draws.
        plan: the draws (:class:`UniformNoisePlan`).
        x, completion_mask: ``(B, L)`` clean tokens and the positions scored.
        vocab_size: ``N``.
        schedule: ``α_t`` (the one the plan was drawn with).
        micro_batch: draws per ``denoise`` call (``None``: all at once).
    Returns:
        ``(S, B, L)`` tensor (float64 for float64 logits, else float32), nats, 0 outside ``completion_mask``;
        its sum over ``S`` is the per-token estimate. Differentiable in the denoiser's parameters.
    """
    _check_inputs(x, completion_mask, vocab_size)
    if tuple(plan.z_t.shape[1:]) != tuple(x.shape):
        raise ValueError(f"plan z_t (S, B, L) = {tuple(plan.z_t.shape)} does not match x (B, L) = {tuple(x.shape)}")
    scored = completion_mask.bool()
    parts = []
    for sl in _chunks(plan.num_draws, micro_batch):
        t = plan.t[sl]
        logp = _denoise_log_probs(denoise, plan.z_t[sl], t, vocab_size)  # (k, B, L, N)
        ell = uniform_nelbo_integrand(logp, plan.z_t[sl], x, t.to(logp.device)[:, None, None], schedule)
        w = plan.weights[sl].to(ell.device, ell.dtype)
        parts.append(torch.where(scored[None], -w[:, None, None] * ell, 0.0))
    return torch.cat(parts) if parts else torch.zeros((0, *x.shape), device=x.device)


class _UniformEstimator(ConfigurableEstimator):
    """Shared part of the uniform-noise ELBO estimators: draw a :class:`UniformNoisePlan`, score it."""

    schedule: ClassVar[UniformSchedule] = LINEAR

    def times(self, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(t (S,), weights (S,))`` float64."""
        raise NotImplementedError

    def make_plan(
        self,
        x: torch.Tensor,
        completion_mask: torch.Tensor,
        vocab_size: int,
        generator: torch.Generator | int | None = None,
    ) -> UniformNoisePlan:
        """Draw the times, then one noisy canvas per time (``x``, ``completion_mask`` ``(B, L)``; ``vocab_size``
        ``N``; ``generator`` a ``torch.Generator`` or an integer seed)."""
        _check_inputs(x, completion_mask, vocab_size)
        generator = as_generator(generator, x.device)
        t, weights = self.times(generator)
        z_t, corrupted = sample_uniform_noise(x, completion_mask, t, vocab_size, generator, self.schedule)
        return UniformNoisePlan(t=t, weights=weights, z_t=z_t, corrupted=corrupted)

    def score(
        self,
        denoise: Denoiser,
        plan: UniformNoisePlan,
        x: torch.Tensor,
        completion_mask: torch.Tensor,
        vocab_size: int,
        micro_batch: int | None = None,
    ) -> Estimate:
        """The ELBO estimate on a given plan: :class:`~dlmrl.estimators.scoring.Estimate` with ``sequence (B,)``
        and ``per_token (B, L)`` (nats; every term ≤ 0) and ``nfe`` = the plan's draws."""
        terms = uniform_draw_terms(denoise, plan, x, completion_mask, vocab_size, self.schedule, micro_batch)
        per_token = terms.sum(0)
        return Estimate(sequence=per_token.sum(-1), per_token=per_token, nfe=plan.num_draws)

    def estimate(
        self,
        denoise: Denoiser,
        x: torch.Tensor,
        completion_mask: torch.Tensor,
        vocab_size: int,
        generator: torch.Generator | int | None = None,
        micro_batch: int | None = None,
    ) -> Estimate:
        """Draw a fresh plan and score it (:meth:`make_plan`, :meth:`score`)."""
        plan = self.make_plan(x, completion_mask, vocab_size, generator)
        return self.score(denoise, plan, x, completion_mask, vocab_size, micro_batch)

    def nfe_for(self, length: int) -> int:
        return self.nfe


def _uniform_draws(shape: tuple[int, ...], generator: torch.Generator | None) -> torch.Tensor:
    gen_device = generator.device if generator is not None else torch.device("cpu")
    return torch.rand(shape, generator=generator, device=gen_device, dtype=torch.float64).cpu()


def _check_time_exponent(value: object) -> None:
    check_positive_int(value, "time_exponent")


@dataclass(frozen=True)
class UniformDoubleMC(_UniformEstimator):
    """Unbiased ELBO estimate from ``K`` random times with one noisy canvas each; ``K`` forward passes per sequence.

    ``ELBO ≈ −(1/K) Σ_k p s_k^(p−1) Σ_i ℓ_i(z_k, t_k)`` with ``t_k = s_k^p``, ``s_k ~ U(0, 1]`` i.i.d. (or
    stratified, ``s_k = (k − u_k)/K``, one per stratum ``((k−1)/K, k/K]``), ``z_k ~ q(· | x)`` at ``t_k``.

    ``time_exponent = 1`` is plain ``t ~ U(0, 1]``, UDLM's and Duo's time sampling (without their ``t ≥ ε``
    truncation, which biases the bound): its variance is **infinite**. Near ``t = 0`` a position is corrupted w.p.
    ``≈ t`` and then ``ℓ ≈ (1/t) log(1/t)``, so ``E[ℓ² | t] ∼ log²(1/t)/t``, which is not integrable at 0 (the
    mean, ``∼ log(1/t)``, is). The estimate still converges and, its tail being ``∼ y^-2 log² y``, is
    asymptotically normal, but slowly. ``time_exponent = 2`` (the default) draws ``t = s²`` with weight ``2s``:
    then ``E[(2s ℓ)² | s] ∼ log²(1/s)``, integrable, so the variance is finite. (dlmrl interpretation: the time
    map is ours; any ``p ≥ 2`` keeps the estimate unbiased with finite variance.)

    Args:
        num_samples: ``K`` (>= 1).
        stratified: one ``s`` per stratum.
        time_exponent: ``p`` (integer >= 1; default 2).

    Reference: UDLM arXiv 2412.10193 and Duo arXiv 2506.10892 (Monte Carlo over ``t`` of the continuous-time
    NELBO; their ``antithetic_sampling`` is the stratified option with one shared offset); GDPO arXiv 2510.08554
    §3 (double Monte Carlo).
    """

    num_samples: int = 3
    stratified: bool = False
    time_exponent: int = 2
    name = "uniform_double_mc"
    nfe_formula = "K (num_samples)"
    FLAT_KEYS = frozenset({"num_nodes", "samples_per_node", "stratified"})
    KEY_OF: ClassVar[Mapping[str, str]] = {"num_samples": "estimator.samples_per_node"}

    @classmethod
    def flat_options(cls, flat: Mapping, sampling: SamplerSettings | None = None) -> dict:
        """``num_samples = num_nodes · samples_per_node`` (the masked ``double_mc``'s rule); ``stratified`` as is."""
        out = {k: flat[k] for k in ("stratified",) if k in flat}
        if "num_nodes" in flat and "samples_per_node" in flat:
            out["num_samples"] = flat["num_nodes"] * flat["samples_per_node"]
        return out

    def __post_init__(self) -> None:
        check_positive_int(self.num_samples, "num_samples")
        _check_time_exponent(self.time_exponent)
        if not isinstance(self.stratified, bool):
            raise OptionError("stratified", f"stratified must be true or false, got {self.stratified!r}")

    @property
    def nfe(self) -> int:
        """Forward passes per sequence: K."""
        return self.num_samples

    def times(self, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``t = s^p`` and weights ``p s^(p−1)/K`` for ``K`` uniform (or stratified) ``s`` in ``(0, 1]``."""
        k, p = self.num_samples, self.time_exponent
        u = _uniform_draws((k,), generator)  # [0, 1)
        if self.stratified:
            s = (torch.arange(1, k + 1, dtype=torch.float64) - u) / k  # ((k−1)/K, k/K]
        else:
            s = 1.0 - u  # (0, 1]
        return s**p, p * s ** (p - 1) / k


@dataclass(frozen=True)
class UniformSDMC(_UniformEstimator):
    """Gauss–Legendre quadrature over time, Monte Carlo over the noise: ``N·K`` forward passes per sequence.

    ``ELBO ≈ −Σ_n w_n (1/K) Σ_k Σ_i ℓ_i(z_{n,k}, t_n)`` with Gauss–Legendre nodes ``s_n`` and weights on ``[0, 1]``,
    ``t_n = s_n^p`` and ``w_n = ω_n p s_n^(p−1)`` (``p = 1``: nodes in ``t`` directly, as the masked ``sdmc``).
    Its expectation is the quadrature of ``g(t) = E_z Σ_i ℓ_i``, which is biased: unlike the masked integrand
    (a polynomial in ``t``), ``g`` has a ``log(1/t)`` singularity at ``t = 0`` (a corruption near ``t = 0`` costs
    ``≈ log(1/t)``), so the bias falls only algebraically with ``N`` (about ``N^-2`` for ``p = 1``; the map
    ``t = s²`` turns the singularity into ``s log s`` and the rate into about ``N^-4``).

    Args:
        num_nodes: ``N`` quadrature nodes (>= 1).
        samples_per_node: ``K`` noisy canvases per node (>= 1).
        time_exponent: ``p`` (integer >= 1; default 1).

    Reference: GDPO arXiv 2510.08554 §4 (SDMC) applied to UDLM's continuous-time NELBO (arXiv 2412.10193).
    """

    num_nodes: int = 3
    samples_per_node: int = 1
    time_exponent: int = 1
    name = "uniform_sdmc"
    nfe_formula = "N·K (num_nodes · samples_per_node)"

    def __post_init__(self) -> None:
        check_positive_int(self.num_nodes, "num_nodes")
        check_positive_int(self.samples_per_node, "samples_per_node")
        _check_time_exponent(self.time_exponent)

    @property
    def nfe(self) -> int:
        """Forward passes per sequence: N·K."""
        return self.num_nodes * self.samples_per_node

    def nodes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(t_n (N,), w_n (N,))`` float64: the node times and their weights (``Σ_n w_n = 1``)."""
        s, omega = gauss_legendre_unit(self.num_nodes)
        p = self.time_exponent
        return s**p, omega * p * s ** (p - 1)

    def times(self, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Each node repeated ``K`` times (node-major), weight ``w_n / K``."""
        t, w = self.nodes()
        k = self.samples_per_node
        return t.repeat_interleave(k), w.repeat_interleave(k) / k


FLAT_CE_SUPPORTS = ("all", "corrupted")


@dataclass(frozen=True)
class UniformFlatCE(_UniformEstimator):
    """NeMo AutoModel's flat cross-entropy for DiffusionGemma: **a surrogate, not a bound on log p(x)**.

    ``S ≈ (1/K) Σ_k Σ_{i ∈ support_k} log p_θ(x_i | z_k)`` with ``t_k ~ U(ε, 1)`` i.i.d. and ``z_k ~ q(· | x)`` at
    ``t_k`` (``α_t = 1 − t``); no ``1/t`` or any other weight. ``support``:

    - ``all`` (default): every completion position, corrupted or not: what NeMo AutoModel's
      ``BlockDiffusionCrossEntropyLoss`` sums (its docstring: the loss support is the full canvas, "NOT
      noise-gated", matching Google's ``target_mask = canvas_mask``; its strategy calls the corrupted-only support
      "the loss-support bug");
    - ``corrupted``: only the positions whose token was redrawn (``corrupt_uniform_random``'s ``noise_mask``; its
      docstring still says "mean cross-entropy over corrupted tokens").

    NeMo divides by the number of supervised tokens (a mean); we keep the sum over positions, so that the
    per-token terms add up to a sequence score like the ELBO estimators' (dlmrl interpretation). NeMo draws one
    ``t`` per example; here a draw's ``t`` is shared by the batch's rows (common random numbers across policies).

    Args:
        num_samples: ``K`` (>= 1).
        eps: ``ε``, the lowest corruption level (NeMo's default 1e-3), in ``[0, 1)``.
        support: ``all`` or ``corrupted``.

    Reference: NeMo AutoModel ``nemo_automodel/components/loss/dllm_loss.py`` (``BlockDiffusionCrossEntropyLoss``)
    and ``components/datasets/dllm/corruption.py`` (``corrupt_uniform_random``).
    """

    num_samples: int = 3
    eps: float = 1e-3
    support: str = "all"
    name = "uniform_flat_ce"
    nfe_formula = "K (num_samples)"
    FLAT_KEYS = frozenset({"num_nodes", "samples_per_node"})
    KEY_OF: ClassVar[Mapping[str, str]] = {"num_samples": "estimator.samples_per_node"}

    @classmethod
    def flat_options(cls, flat: Mapping, sampling: SamplerSettings | None = None) -> dict:
        """``num_samples = num_nodes · samples_per_node``."""
        if "num_nodes" in flat and "samples_per_node" in flat:
            return {"num_samples": flat["num_nodes"] * flat["samples_per_node"]}
        return {}

    def __post_init__(self) -> None:
        check_positive_int(self.num_samples, "num_samples")
        check_unit_interval(self.eps, "eps", high_open=True)
        if self.support not in FLAT_CE_SUPPORTS:
            raise OptionError("support", f"support must be one of {FLAT_CE_SUPPORTS}, got {self.support!r}")

    @property
    def nfe(self) -> int:
        """Forward passes per sequence: K."""
        return self.num_samples

    def notes(self) -> dict[str, str]:
        return {"bound": "a surrogate (flat cross-entropy), not a bound on log p(x)"}

    def times(self, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``t = ε + (1 − ε) u`` in ``[ε, 1)``, ``u ~ U[0, 1)`` (NeMo's draw), weight ``1/K``."""
        k = self.num_samples
        u = _uniform_draws((k,), generator)
        return self.eps + (1.0 - self.eps) * u, torch.full((k,), 1.0 / k, dtype=torch.float64)

    def score(
        self,
        denoise: Denoiser,
        plan: UniformNoisePlan,
        x: torch.Tensor,
        completion_mask: torch.Tensor,
        vocab_size: int,
        micro_batch: int | None = None,
    ) -> Estimate:
        """``Σ_s weights_s · log p_θ(x | z_t[s])`` at the support positions: ``Estimate`` with ``sequence (B,)``,
        ``per_token (B, L)`` (nats, ≤ 0) and ``nfe`` = the plan's draws."""
        _check_inputs(x, completion_mask, vocab_size)
        scored = completion_mask.bool()
        per_token = None
        for sl in _chunks(plan.num_draws, micro_batch):
            logp = _denoise_log_probs(denoise, plan.z_t[sl], plan.t[sl], vocab_size)  # (k, B, L, N)
            logp_x = torch.gather(logp, -1, x[None, ..., None].expand(logp.shape[0], -1, -1, 1)).squeeze(-1)
            support = scored[None] & (plan.corrupted[sl] if self.support == "corrupted" else True)
            w = plan.weights[sl].to(logp_x.device, logp_x.dtype)
            part = torch.where(support, w[:, None, None] * logp_x, 0.0).sum(0)
            per_token = part if per_token is None else per_token + part
        if per_token is None:
            per_token = torch.zeros(x.shape, device=x.device)
        return Estimate(sequence=per_token.sum(-1), per_token=per_token, nfe=plan.num_draws)
