"""Decoding ids a tokenizer has no token for (an output head larger than the vocabulary, as Dream's and LLaDA's)."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizer

from dlmrl.data.encoding import decode_ids


class CharTokenizer(PreTrainedTokenizer):
    """A Python tokenizer whose id-to-token lookup gives ``None`` for unknown ids, as Dream's ``DreamTokenizer``
    (``self.decoder.get(index)``) does."""

    def __init__(self, **kwargs):
        self.encoder = {c: i for i, c in enumerate("abc")}
        self.decoder = {i: c for c, i in self.encoder.items()}
        super().__init__(eos_token="</s>", **kwargs)

    @property
    def vocab_size(self):
        return len(self.encoder)

    def get_vocab(self):
        return dict(self.encoder, **self.added_tokens_encoder)

    def _tokenize(self, text, **kwargs):
        return list(text)

    def _convert_token_to_id(self, token):
        return self.encoder.get(token, 0)

    def _convert_id_to_token(self, index):
        return self.decoder.get(index)

    def convert_tokens_to_string(self, tokens):
        return "".join(tokens)


def test_ids_without_a_token_are_dropped_not_fatal():
    tok = CharTokenizer()
    eos = tok.eos_token_id
    ids = [0, 999, 1, 2, eos]  # 999: a row of the head the vocabulary does not cover
    with pytest.raises(TypeError):
        tok.decode(ids, skip_special_tokens=True)  # what the Python tokenizer does on its own
    assert decode_ids(tok, ids) == "abc"
    assert decode_ids(tok, ids, skip_special_tokens=False) == "abc</s>"
    assert decode_ids(tok, []) == ""
