"""The clipped surrogate (PPO arXiv 1707.06347 Eq. 7; DAPO arXiv 2503.14476 decoupled ε_low / ε_high; dual
clip for A < 0) and its per-token flags."""

from __future__ import annotations

import pytest
import torch

from dlmrl.objectives.clipping import clipped_surrogate
from tests.objectives.util import close

T, F = True, False
# ratios below, inside and above [0.8, 1.2]; row 0 has A > 0, row 1 has A < 0
RATIO = [[0.5, 0.9, 1.5], [0.5, 1.1, 1.5]]
ADV = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])


def run(**kw):
    ratio = torch.tensor(RATIO, requires_grad=True)
    out = clipped_surrogate(ratio, ADV, kw.pop("eps_low", 0.2), kw.pop("eps_high", 0.2), **kw)
    out.surrogate.sum().backward()
    return out, ratio.grad


def test_flags_per_token_both_signs():
    out, grad = run()
    # A>0: r=0.5 -> min(0.5, 0.8) = 0.5 (not clipped); 0.9; r=1.5 -> min(1.5, 1.2) = 1.2 (clipped high)
    # A<0: r=0.5 -> min(-0.5, -0.8) = -0.8 (clipped low); -1.1; r=1.5 -> min(-1.5, -1.2) = -1.5 (not clipped)
    assert close(out.surrogate, [[0.5, 0.9, 1.2], [-0.8, -1.1, -1.5]])
    assert out.clipped_low.tolist() == [[F, F, F], [T, F, F]]
    assert out.clipped_high.tolist() == [[F, F, T], [F, F, F]]
    assert out.capped.tolist() == [[F, F, F], [F, F, F]]
    # clipped tokens get zero gradient, the others A
    assert grad.tolist() == [[1.0, 1.0, 0.0], [0.0, -1.0, -1.0]]


def test_dual_clip_bounds_negative_advantage_tokens():
    out, grad = run(dual_clip=1.3)
    # A<0, r=1.5 > c: max(-1.5, 1.3 * -1) = -1.3, constant in r
    assert close(out.surrogate, [[0.5, 0.9, 1.2], [-0.8, -1.1, -1.3]])
    assert out.capped.tolist() == [[F, F, F], [F, F, T]]
    assert grad.tolist() == [[1.0, 1.0, 0.0], [0.0, -1.0, 0.0]]
    out, _ = run(dual_clip=3.0)
    assert out.surrogate[1, 2].item() == pytest.approx(-1.5) and not out.capped.any()


def test_delta_caps_the_unclipped_ratio():
    out, grad = run(delta=1.4)
    # A<0, r=1.5: min(min(1.5, 1.4) * -1, 1.2 * -1) = -1.4; A>0, r=1.5: min(1.4, 1.2) = 1.2 (clipped high)
    assert close(out.surrogate, [[0.5, 0.9, 1.2], [-0.8, -1.1, -1.4]])
    assert out.capped.tolist() == [[F, F, F], [F, F, T]]
    assert out.clipped_high.tolist() == [[F, F, T], [F, F, F]]
    assert grad.tolist() == [[1.0, 1.0, 0.0], [0.0, -1.0, 0.0]]


def test_per_token_ranges():
    eps_low = torch.tensor([[0.2, 0.2, 0.2], [0.6, 0.2, 0.2]])
    eps_high = torch.tensor([[0.2, 0.2, 0.6], [0.2, 0.2, 0.2]])
    out, grad = run(eps_low=eps_low, eps_high=eps_high)
    # row 1 token 0: lower bound 0.4 < 0.5, not clipped; row 0 token 2: upper bound 1.6 > 1.5
    assert close(out.surrogate, [[0.5, 0.9, 1.5], [-0.5, -1.1, -1.5]])
    assert not out.clipped_low.any() and not out.clipped_high.any()
    assert grad.tolist() == [[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]]


def test_invalid_arguments():
    r, a = torch.ones(1, 2), torch.ones(1, 2)
    with pytest.raises(ValueError, match="dual_clip"):
        clipped_surrogate(r, a, 0.2, 0.2, dual_clip=1.0)
    with pytest.raises(ValueError, match="delta"):
        clipped_surrogate(r, a, 0.2, 0.2, delta=0.9)
    with pytest.raises(ValueError, match="eps_low"):
        clipped_surrogate(r, a, -0.1, 0.2)
    with pytest.raises(ValueError, match="eps_high"):
        clipped_surrogate(r, a, 0.2, torch.ones(3))
    with pytest.raises(ValueError, match="match"):
        clipped_surrogate(r, torch.ones(2), 0.2, 0.2)


def test_a_ratio_exactly_on_a_clip_bound_gets_the_whole_gradient_as_trl_and_verl():
    """r = 1 − ε in float32 with A = −1 (and r = 1 + ε with A = +1): the surrogate's gradient is −1 (+1), as
    ``torch.clamp`` gives in TRL and verl; a ``minimum(maximum(r, lo), hi)`` clip splits it (−0.75)."""
    lo = (torch.tensor([1.0]) - torch.tensor([0.2])).requires_grad_(True)
    hi = (torch.tensor([1.0]) + torch.tensor([0.2])).requires_grad_(True)
    clipped_surrogate(lo, torch.tensor([-1.0]), 0.2, 0.2).surrogate.sum().backward()
    clipped_surrogate(hi, torch.tensor([1.0]), 0.2, 0.2).surrogate.sum().backward()
    assert lo.grad.item() == -1.0 and hi.grad.item() == 1.0


def test_clip_ratio_passes_the_whole_gradient_at_a_bound_on_any_torch():
    """torch 2.14's clamp splits the gradient at a bound (1/2 with tensor bounds, 0 with scalar ones); dlmrl's rule
    is torch <= 2.13's: 1 inside [lo, hi] with the bounds included, 0 outside."""
    from dlmrl.objectives.clipping import clip_ratio

    r = torch.tensor([0.5, 0.8, 1.0, 1.2, 1.5], requires_grad=True)
    out = clip_ratio(r, 0.8, 1.2)
    out.sum().backward()
    assert out.tolist() == pytest.approx([0.8, 0.8, 1.0, 1.2, 1.2]) and r.grad.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]
