"""Constrained beam search over a catalogue of code tuples (semantic IDs) with an autoregressive policy.

A generative recommender ranks items by decoding their IDs with beam search restricted to the prefixes of real
items (a prefix tree), so every candidate is an item of the catalogue (TIGER arXiv 2305.05065 §3.2; GREAM arXiv
2510.20815 decodes its Direct Sequence Recommendation the same way). Level by level, each of the ``W`` beams of
a context is extended by every code the tree allows after its prefix, scored by its cumulative log-probability

    ``s(c_1..c_l) = Σ_{j<=l} log π(tok_j(c_j) | context, tok_1(c_1) .. tok_{j−1}(c_{j−1}))``

(the model's full-vocabulary softmax, not renormalised over the allowed codes), and the ``W`` best extensions are
kept (ties: the smaller code tuple first). With ``W`` at least the number of items the result is every item
ranked by its exact sequence log-probability.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dlmrl.data.encoding import left_pad
from dlmrl.models.policy import position_ids_from_mask

__all__ = ["constrained_beam_search", "next_token_logprobs", "prefix_tree"]


def prefix_tree(items: Sequence[Sequence[int]]) -> dict[tuple[int, ...], list[int]]:
    """``{prefix: sorted codes that may follow it}`` for every proper prefix of the given code tuples.

    Raises:
        ValueError: tuples of different lengths, or none.
    """
    lengths = {len(t) for t in items}
    if len(lengths) != 1:
        raise ValueError(f"the catalogue's code tuples must all have one length, got lengths {sorted(lengths)}")
    tree: dict[tuple[int, ...], set[int]] = {}
    for t in items:
        t = tuple(int(c) for c in t)
        for level in range(len(t)):
            tree.setdefault(t[:level], set()).add(t[level])
    return {p: sorted(codes) for p, codes in tree.items()}


@torch.no_grad()
def next_token_logprobs(policy, contexts: Sequence[Sequence[int]], pad_id: int, batch_size: int = 256) -> torch.Tensor:
    """``log π(· | context)`` after each context: ``(B, V)`` float32 nats (float64 for a float64 model).

    Args:
        policy: an AR policy (:class:`~dlmrl.models.ar.AutoregressivePolicy`: ``model``, ``device``).
        contexts: ``B`` token id lists (each non-empty), left-padded here with ``pad_id``.
        batch_size: rows per forward pass.
    """
    out = []
    for start in range(0, len(contexts), batch_size):
        ids, mask = left_pad(contexts[start : start + batch_size], pad_id, policy.device)  # (b, T)
        logits = policy.model(input_ids=ids, attention_mask=mask.long(), position_ids=position_ids_from_mask(mask),
                              use_cache=False).logits[:, -1]  # (b, V)
        logits = logits if logits.dtype == torch.float64 else logits.float()
        out.append(logits.log_softmax(-1))
    return torch.cat(out) if out else torch.empty(0)


def constrained_beam_search(policy, contexts: Sequence[Sequence[int]], items: Sequence[Sequence[int]],
                            code_token_ids: Sequence[Sequence[int]], beam_size: int, pad_id: int,
                            batch_size: int = 256) -> list[list[tuple[tuple[int, ...], float]]]:
    """The ``beam_size`` best items after each context (module docstring), best first.

    Args:
        policy: an AR policy. contexts: ``B`` token id lists the ID continues (prompt, and any reasoning before it).
        items: the catalogue's code tuples, ``M`` codes each (the search only writes these).
        code_token_ids: ``code_token_ids[l][c]``, the token id of code ``c`` at level ``l``.
        beam_size: ``W >= 1``. pad_id: the padding id. batch_size: rows per forward pass.
    Returns:
        Per context, up to ``W`` ``(code tuple, log-probability in nats)`` pairs, in descending log-probability.
    Raises:
        ValueError: ``beam_size < 1``; a catalogue code without a token id.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    tree = prefix_tree(items)
    levels = len(next(iter(items)))
    for prefix, codes in tree.items():
        level = len(prefix)
        if level >= len(code_token_ids) or max(codes) >= len(code_token_ids[level]):
            raise ValueError(f"code_token_ids has no token for level {level}, code {max(codes)}")
    beams: list[list[tuple[tuple[int, ...], float]]] = [[((), 0.0)] for _ in contexts]
    for level in range(levels):
        rows = [(b, prefix, score) for b, bs in enumerate(beams) for prefix, score in bs]
        seqs = [list(contexts[b]) + [code_token_ids[j][c] for j, c in enumerate(prefix)] for b, prefix, _ in rows]
        logp = next_token_logprobs(policy, seqs, pad_id, batch_size).double().cpu()  # (rows, V)
        grown: list[list[tuple[tuple[int, ...], float]]] = [[] for _ in contexts]
        for r, (b, prefix, score) in enumerate(rows):
            for c in tree[prefix]:
                grown[b].append((prefix + (c,), score + float(logp[r, code_token_ids[level][c]])))
        beams = [sorted(g, key=lambda x: (-x[1], x[0]))[:beam_size] for g in grown]
    return beams
