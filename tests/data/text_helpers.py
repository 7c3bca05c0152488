"""A character-level tokenizer over printable ASCII (every character one token, newlines included) with
``<|eot_id|>``, optionally a chat template: enough to encode and decode the text tasks exactly, offline."""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def text_tokenizer(chat: bool = False) -> PreTrainedTokenizerFast:
    """Printable-ASCII characters after ``[PAD] [BOS] [EOS] [MASK] [UNK] <|eot_id|>`` (ids 0-5)."""
    specials = ["[PAD]", "[BOS]", "[EOS]", "[MASK]", "[UNK]", "<|eot_id|>"]
    vocab = {t: i for i, t in enumerate(specials + list(dict.fromkeys(string.printable)))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", bos_token="[BOS]", eos_token="[EOS]",
                                  mask_token="[MASK]", unk_token="[UNK]", additional_special_tokens=["<|eot_id|>"],
                                  clean_up_tokenization_spaces=False)
    if chat:
        tok.chat_template = CHAT_TEMPLATE
    return tok
