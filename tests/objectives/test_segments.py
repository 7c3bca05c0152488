"""Segments: sentence ids from delimiters, per-segment means, delimiter tokens of a vocabulary."""

from __future__ import annotations

import pytest
import torch

from dlmrl.objectives.segments import delimiter_token_ids, segment_mean, sentence_segments
from tests.objectives.util import close

T, F = True, False


def test_a_delimiter_closes_its_sentence():
    is_delim = torch.tensor([[F, F, T, F, F, T], [T, F, F, F, F, F]])
    mask = torch.tensor([[T] * 6, [T, T, T, F, F, F]])
    ids = sentence_segments(is_delim, mask)
    assert ids.tolist() == [[0, 0, 0, 1, 1, 1], [0, 1, 1, -1, -1, -1]]
    # a delimiter on a padding position is ignored
    ids = sentence_segments(torch.tensor([[F, F, F, T]]), torch.tensor([[T, T, F, F]]))
    assert ids.tolist() == [[0, 0, -1, -1]]


def test_segment_mean_by_hand_and_padding_ignored():
    values = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]], requires_grad=True)
    ids = torch.tensor([[0, 0, 1, 1, 0, 2]])
    out = segment_mean(values, torch.ones(1, 6, dtype=torch.bool), ids)
    # segment 0: (1 + 2 + 5)/3; segment 1: (3 + 4)/2; segment 2: 6
    assert close(out, [[8 / 3, 8 / 3, 3.5, 3.5, 8 / 3, 6.0]])
    out.sum().backward()
    # each token appears in its segment's n outputs with weight 1/n
    assert close(values.grad, [[1.0] * 6])

    values = torch.tensor([[1.0, 2.0, 3.0, 4.0, float("inf"), float("nan")]], requires_grad=True)
    mask = torch.tensor([[T, T, T, T, F, F]])
    out = segment_mean(values, mask, ids)
    assert close(out, [[1.5, 1.5, 3.5, 3.5, 0.0, 0.0]])
    out.sum().backward()
    assert close(values.grad, [[1.0, 1.0, 1.0, 1.0, 0.0, 0.0]])


def test_segment_errors():
    with pytest.raises(ValueError, match=">= 0"):
        segment_mean(torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool), torch.tensor([[0, -1]]))
    with pytest.raises(ValueError, match="bool"):
        segment_mean(torch.zeros(1, 2), torch.ones(1, 2), torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="shape"):
        sentence_segments(torch.zeros(1, 3, dtype=torch.bool), torch.ones(1, 2, dtype=torch.bool))


class FakeTokenizer:
    def __init__(self):
        self.vocab = ["a", "b.", "?", "\n", " ,", "[EOS]", "c! ", "d"]
        self.all_special_ids = [5]

    def __len__(self):
        return len(self.vocab)

    def decode(self, ids):
        return "".join(self.vocab[i] for i in ids)


def test_delimiter_token_ids():
    assert delimiter_token_ids(FakeTokenizer()).tolist() == [1, 2, 3, 6]
    assert delimiter_token_ids(FakeTokenizer(), subsentence=True).tolist() == [1, 2, 3, 4, 6]
    assert delimiter_token_ids(FakeTokenizer(), ends=["d"]).tolist() == [7]
