"""The confidence the low-confidence and threshold rules rank: float32 where that cannot change a decision, the
float64 softmax of LLaDA's and Fast-dLLM's ``generate`` where it could (dlmrl.models.reveal._confidence)."""

import torch

from dlmrl.models.reveal import _CONFIDENCE_MARGIN, _confidence, reveal_cuts


def float64_confidence(logits, x0):
    # the oracle: LLaDA's generate (ML-GSAI/LLaDA generate.py): softmax in float64, then the chosen token's entry
    return torch.softmax(logits.to(torch.float64), dim=-1).gather(-1, x0[..., None]).squeeze(-1)


def test_far_apart_confidences_keep_the_float64_order_and_value():
    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(4, 6, 5000, generator=g)
    x0 = logits.argmax(-1)
    conf, ref = _confidence(logits, x0), float64_confidence(logits, x0)
    assert conf.dtype == torch.float64
    # float32 logsumexp over 5000 terms: a relative error of a few float32 ulps, far inside the margin
    torch.testing.assert_close(conf, ref, rtol=_CONFIDENCE_MARGIN / 10, atol=0)
    assert torch.equal(conf.argsort(dim=1, stable=True), ref.argsort(dim=1, stable=True))


def test_a_tie_float32_cannot_see_is_decided_in_float64():
    # positions 0 and 1 differ by 1e-9 in the chosen logit: equal in float32, ordered in float64
    g = torch.Generator().manual_seed(1)
    base = 3 * torch.randn(3000, generator=g, dtype=torch.float64)
    logits = torch.stack([base, base.clone(), base - 1.0])[None]  # (1, 3, V) float64
    top = int(base.argmax())
    logits[0, 1, top] += 1e-9
    x0 = torch.full((1, 3), top)
    fast = (logits.float().gather(-1, x0[..., None]).squeeze(-1) - torch.logsumexp(logits.float(), -1)).exp()
    assert fast[0, 0] == fast[0, 1]  # (so the test needs the float64 path)
    conf = _confidence(logits, x0)
    assert torch.equal(conf, float64_confidence(logits, x0))
    assert conf[0, 1] > conf[0, 0]


def test_a_confidence_at_the_threshold_is_decided_in_float64():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 4, 50, generator=g, dtype=torch.float64)
    x0 = logits.argmax(-1)
    ref = float64_confidence(logits, x0)
    tau = float(ref[1, 2])  # row 1 has a confidence exactly at the threshold; row 0 is far from it
    assert (ref[0] - tau).abs().min() > _CONFIDENCE_MARGIN * tau
    conf = _confidence(logits, x0, reveal_cuts(tau, None, 4))
    assert torch.equal(conf[1], ref[1])
    assert conf[1, 2] >= tau


def test_reveal_cuts():
    assert reveal_cuts(0.9, None, 4) == (0.9,)
    assert reveal_cuts(None, 1.0, 3) == (1 - 1 / 2, 1 - 1 / 3, 1 - 1 / 4)  # 1 - f / (n + 1), n = 1 .. Lb
    assert reveal_cuts(None, None, 4) == ()


def test_large_logits_widen_the_margin_and_keep_the_float64_decisions():
    # logits near 4000: float32's log p = logit - logsumexp is off by ~eps32 * 8000 (1e-3), ten times the fixed
    # margin; the row's margin grows with its logits, so every decision near the threshold is made in float64
    from dlmrl.models.reveal import threshold_reveal

    g = torch.Generator().manual_seed(3)
    n, Lb, V = 4096, 4, 200
    logits = torch.full((n, Lb, V), 4000.0 - 40.0)
    a = torch.log(torch.tensor(9.0)) + (torch.rand(n, Lb, generator=g) - 0.5) * 1e-2  # p(x0) = 1 / (1 + e^-a) ~ 0.9
    logits[..., 0] = 4000.0
    logits[..., 1] = 4000.0 - a
    x0 = torch.zeros(n, Lb, dtype=torch.long)
    masked = torch.ones(n, Lb, dtype=torch.bool)
    ref = float64_confidence(logits, x0)
    conf = _confidence(logits, x0, reveal_cuts(0.9, None, Lb))
    assert torch.equal(threshold_reveal(conf, masked, threshold=0.9), threshold_reveal(ref, masked, threshold=0.9))
    assert ((ref - 0.9).abs() < 1e-3).any()  # (decisions within float32's error of the threshold exist)
