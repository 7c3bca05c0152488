"""The sampler's draw (dlmrl.models.gumbel.drawn_tokens): greedy, the argmax of the logits with the mask token at
-inf, taken without copying the logits; with a temperature, the noise applied to the masked copy."""

import torch

from dlmrl.models.gumbel import drawn_tokens


def masked_argmax(logits, mask_id):  # the oracle: what the samplers computed before (a masked copy)
    choice = logits.clone()
    choice[..., mask_id] = float("-inf")
    return choice.argmax(dim=-1)


def test_greedy_draw_equals_the_masked_copy_argmax_with_the_mask_on_top_and_ties():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 7, generator=g)
    mask_id = 4
    logits[0, 0, mask_id] = 10.0  # the mask token is the argmax: redone without it
    logits[1, 1, [2, mask_id, 6]] = 10.0  # a tie with the mask after another token: the first maximum is kept
    logits[2, 2, [mask_id, 5]] = 10.0  # a tie with the mask first: the next maximum, 5
    x0 = drawn_tokens(logits, mask_id, 0.0)
    assert torch.equal(x0, masked_argmax(logits, mask_id))
    assert (x0 != mask_id).all() and (x0[0, 0], x0[1, 1], x0[2, 2]) != (mask_id, mask_id, mask_id)
    assert (int(x0[1, 1]), int(x0[2, 2])) == (2, 5)
    assert logits[0, 0, mask_id] == 10.0  # (the logits are left as they were)


def test_a_temperature_noises_the_masked_copy():
    logits = torch.zeros(2, 3, 4)
    seen = []

    def noise(choice):
        seen.append(choice)
        return choice + torch.arange(4.0)  # (a deterministic "noise": the last token wins unless it is the mask)

    x0 = drawn_tokens(logits, 3, 1.0, noise)
    assert (x0 == 2).all() and torch.isinf(seen[0][..., 3]).all() and (logits == 0).all()
