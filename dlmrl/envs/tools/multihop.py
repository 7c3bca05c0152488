"""Compositional multi-hop questions over the synthetic knowledge base, split by entity.

A question follows a chain of relations from a topic entity: ``(film, directed_by, born_in,
located_in)`` asks *"In which country is the city where the director of Kavoni was born?"*; its gold
answer is the chain's last entity. Compositional questions of 2 and 3 hops in the style of
2WikiMultiHopQA and MuSiQue (MTR's benchmarks, arXiv 2510.06825), built from templates **(dlmrl
interpretation)**.

**The split by entity.** Every entity of the knowledge base belongs to one split and relations never
cross splits (:meth:`KnowledgeBase.generate`), and a question of a split starts from a topic of that
split, so *every entity of a question's chain (topic, intermediate entities, answer) is in the
question's split*. Hence no test question's topic, intermediate entity or answer appears in any train
question, as an entity or as a name word (name words are unique to their entity): test answers are
never seen in training, and a policy can only answer them by reading its tools' observations.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

from dlmrl.envs.tools.knowledge_base import RELATIONS, SPLITS, KnowledgeBase

__all__ = ["MultiHopQuestion", "generate_questions", "phrase", "question_text", "relation_chains", "split_questions"]

# "the X of <entity>": nests, so chains compose (the last relation gets a question form below)
_PHRASES = {
    "born_in": "the city where {} was born",
    "located_in": "the country where {} is",
    "capital": "the capital of {}",
    "directed_by": "the director of {}",
    "filmed_in": "the city where {} was filmed",
    "written_by": "the author of {}",
    "founded_by": "the founder of {}",
    "headquartered_in": "the city where {} is headquartered",
}
_QUESTIONS = {
    "born_in": "In which city was {} born?",
    "located_in": "In which country is {}?",
    "capital": "What is the capital of {}?",
    "directed_by": "Who directed {}?",
    "filmed_in": "In which city was {} filmed?",
    "written_by": "Who wrote {}?",
    "founded_by": "Who founded {}?",
    "headquartered_in": "In which city is {} headquartered?",
}


@dataclass(frozen=True)
class MultiHopQuestion:
    """One question.

    Attributes:
        question: the text. answer: the gold answer (the chain's last entity).
        relations: the relations followed, in order. chain: the entities visited, topic first, answer
            last (``len(relations) + 1`` names). split: ``"train"`` or ``"test"``.
    """

    question: str
    answer: str
    relations: tuple[str, ...]
    chain: tuple[str, ...]
    split: str

    @property
    def hops(self) -> int:
        return len(self.relations)

    @property
    def topic(self) -> str:
        return self.chain[0]


def phrase(relation: str, subject: str) -> str:
    """The noun phrase of ``relation`` applied to ``subject``: ``phrase("directed_by", "X") == "the director of X"``."""
    return _PHRASES[relation].format(subject)


def question_text(relations: Iterable[str], topic: str) -> str:
    """The question that follows ``relations`` from ``topic`` (inner relations as noun phrases).

    Raises:
        ValueError: no relation. KeyError: an unknown relation.
    """
    relations = list(relations)
    if not relations:
        raise ValueError("a question needs at least one relation")
    subject = topic
    for r in relations[:-1]:
        subject = phrase(r, subject)
    return _QUESTIONS[relations[-1]].format(subject)


def relation_chains(hops: int) -> list[tuple[str, ...]]:
    """Every type-consistent chain of ``hops`` relations, in :data:`RELATIONS` order.

    ``located_in`` right after ``capital`` is left out: a country's capital's country is the country
    itself. (A city's country's capital may be the city itself: :func:`generate_questions` drops those
    instances.)
    """
    chains = [(r,) for r in RELATIONS]
    for _ in range(hops - 1):
        chains = [c + (r,) for c in chains for r in RELATIONS
                  if RELATIONS[r].subject == RELATIONS[c[-1]].object
                  and (c[-1], r) != ("capital", "located_in")]
    return chains


def generate_questions(kb: KnowledgeBase, split: str = "train", hops: Iterable[int] = (2, 3),
                       n: int | None = None, seed: int = 0) -> list[MultiHopQuestion]:
    """The questions of one split: every chain of every hop count from every topic of the split.

    Chains visiting an entity twice, or missing a fact, are dropped (an answer that is also the topic or an intermediate
    entity). The list is shuffled with ``random.Random(seed)`` and cut to ``n``.

    Args:
        kb: the knowledge base. split: ``"train"`` or ``"test"``. hops: hop counts (each >= 1).
        n: how many (``None``: all). seed: the shuffle's seed.
    Returns:
        The questions (deterministic for the same arguments).
    Raises:
        ValueError: an unknown split, a hop count < 1, or ``n`` above the number available.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    out = []
    for h in hops:
        if h < 1:
            raise ValueError(f"hop counts must be >= 1, got {h}")
        for rels in relation_chains(h):
            for e in kb.of(RELATIONS[rels[0]].subject, split):
                chain = [e.name]
                for r in rels:
                    chain.append(kb.facts.get((chain[-1], r)))
                # a hand-made knowledge base may miss a fact (None): no question then
                if None not in chain and len(set(chain)) == len(chain):
                    out.append(MultiHopQuestion(question_text(rels, e.name), chain[-1], rels, tuple(chain), split))
    random.Random(seed).shuffle(out)
    if n is not None:
        if n > len(out):
            raise ValueError(f"asked for {n} {split} questions, the knowledge base has {len(out)}")
        out = out[:n]
    return out


def split_questions(kb: KnowledgeBase, hops: Iterable[int] = (2, 3), n_train: int | None = None,
                    n_test: int | None = None, seed: int = 0) -> dict[str, list[MultiHopQuestion]]:
    """``{"train": [...], "test": [...]}`` from :func:`generate_questions` (entity-disjoint: module docstring)."""
    hops = tuple(hops)
    return {"train": generate_questions(kb, "train", hops, n_train, seed),
            "test": generate_questions(kb, "test", hops, n_test, seed + 1)}
