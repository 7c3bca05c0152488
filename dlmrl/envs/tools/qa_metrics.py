"""Exact match and token F1 for short answers, with SQuAD's normalisation.

The official SQuAD v1.1 evaluation script (Rajpurkar et al., arXiv 1606.05250), which HotpotQA,
MuSiQue, 2WikiMultiHopQA and Bamboogle (MTR's benchmarks, arXiv 2510.06825) report with:
lowercase, remove punctuation, remove the articles ``a``/``an``/``the``, collapse whitespace; EM is
equality of the normalised strings, F1 the harmonic mean of token precision and recall. Two empty
normalised strings count as a match (SQuAD v2.0's convention; v1.1 never has an empty gold).
Several gold answers: the best score over them.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

__all__ = ["exact_match", "f1_score", "normalize_answer"]

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD's ``normalize_answer``: lowercase, drop punctuation, drop articles, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _golds(gold: str | Sequence[str]) -> list[str]:
    golds = [gold] if isinstance(gold, str) else list(gold)
    if not golds:
        raise ValueError("no gold answer")
    return golds


def exact_match(prediction: str, gold: str | Sequence[str]) -> float:
    """1.0 when the normalised prediction equals a normalised gold answer, else 0.0.

    Raises:
        ValueError: an empty list of gold answers.
    """
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(g) for g in _golds(gold)))


def f1_score(prediction: str, gold: str | Sequence[str]) -> float:
    """Token F1 of the normalised prediction against the best gold answer.

    Raises:
        ValueError: an empty list of gold answers.
    """
    pred = normalize_answer(prediction).split()
    best = 0.0
    for g in _golds(gold):
        ref = normalize_answer(g).split()
        if not pred or not ref:
            best = max(best, float(pred == ref))
            continue
        same = sum((Counter(pred) & Counter(ref)).values())
        if same:
            precision, recall = same / len(pred), same / len(ref)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best
