"""The tiny default's character-level tokenizer (built with ``tokenizers``, saved with ``save_pretrained``).

Every character is one token; special tokens are ``[PAD] [BOS] [EOS] [MASK] [UNK]``. The alphabet
covers the Sudoku task (digits, ``=``, newline, space, ``|``) so decoded canvases read as grids.
:data:`TEXT_ALPHABET` extends it with the rest of printable ASCII for text tasks (the multi-hop tool-use
traces: letters, JSON punctuation); it keeps the Sudoku alphabet's ids, so a Sudoku prompt encodes the
same with either tokenizer.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["[PAD]", "[BOS]", "[EOS]", "[MASK]", "[UNK]"]
ALPHABET = "0123456789=\n |"
#: the Sudoku alphabet then every other printable ASCII character (32..126) in code-point order: ids 0..19
#: are those of the Sudoku tokenizer, the rest follow (105 tokens with the specials)
TEXT_ALPHABET = ALPHABET + "".join(chr(c) for c in range(32, 127) if chr(c) not in ALPHABET)


def build_char_tokenizer(alphabet: str = ALPHABET) -> PreTrainedTokenizerFast:
    """A character-level fast tokenizer with a ``[MASK]`` token.

    Args:
        alphabet: the characters, one token each (after the 5 special tokens, in this order).
    Returns:
        ``PreTrainedTokenizerFast`` with ``mask_token_id`` 3, ``eos_token_id`` 2, ``pad_token_id`` 0,
        left padding (prompts are left-padded for diffusion sampling).
    Raises:
        ValueError: if the alphabet repeats a character.
    """
    if len(set(alphabet)) != len(alphabet):
        raise ValueError(f"alphabet repeats a character: {alphabet!r}")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + list(alphabet))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="[PAD]",
        bos_token="[BOS]",
        eos_token="[EOS]",
        mask_token="[MASK]",
        unk_token="[UNK]",
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def build_text_tokenizer() -> PreTrainedTokenizerFast:
    """The character tokenizer over :data:`TEXT_ALPHABET` (the multi-hop tool-use task's tiny models); an
    unknown character (non-ASCII) becomes ``[UNK]``."""
    return build_char_tokenizer(TEXT_ALPHABET)


def build_piece_tokenizer(pieces, alphabet: str = TEXT_ALPHABET) -> PreTrainedTokenizerFast:
    """A tokenizer of fixed multi-character pieces with a character fallback (ids: the 5 specials, ``alphabet``,
    then the pieces in the order given), so every string encodes and decodes back exactly.

    Pre-tokenization takes, at each position, the first of: a piece of 3 or more characters, longest first, with
    a word boundary (``\\b``) required on each side that is a letter; a 2-character piece; any one character.

    Args:
        pieces: distinct strings of at least 2 characters (e.g. :func:`dlmrl.envs.tools.pieces.trace_pieces`).
        alphabet: the single characters (:data:`TEXT_ALPHABET`: the Sudoku tokenizer's ids kept).
    Raises:
        ValueError: a repeated piece, one shorter than 2 characters, or one that is also a character.
    """
    import re

    pieces = list(pieces)
    if len(set(pieces)) != len(pieces) or any(len(p) < 2 for p in pieces):
        raise ValueError("pieces must be distinct strings of at least 2 characters")

    def pattern(p: str) -> str:
        return ("\\b" if p[0].isalpha() else "") + re.escape(p) + ("\\b" if p[-1].isalpha() else "")

    long = sorted((p for p in pieces if len(p) > 2), key=len, reverse=True)
    regex = "|".join([*(pattern(p) for p in long), *(re.escape(p) for p in pieces if len(p) == 2), "[\\s\\S]"])
    specials = dict(zip(("pad_token", "bos_token", "eos_token", "mask_token", "unk_token"), SPECIAL_TOKENS[:4]
                        + [SPECIAL_TOKENS[4]]))
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS + list(alphabet) + pieces)}
    if len(vocab) != len(SPECIAL_TOKENS) + len(alphabet) + len(pieces):
        raise ValueError("a piece repeats a special token or a character of the alphabet")
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(regex), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, padding_side="left", clean_up_tokenization_spaces=False,
                                   **specials)
