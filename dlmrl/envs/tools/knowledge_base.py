"""A synthetic knowledge base for simulated tools, generated deterministically from a seed.

MTR (arXiv 2510.06825) trains tool use against simulated tools instead of live APIs; its ToolActor is an
LLM. Here the simulated world is a small typed graph **(dlmrl interpretation)**: entities of six types
(people, cities, countries, films, books, companies) and eight functional relations (every subject has
exactly one object per relation it carries), so every multi-hop question has one gold answer.

Names are made of consonant-vowel syllables (``Kavoni``, ``Tesu Rabelo``): ASCII letters only, so a
character-level tokenizer needs just the alphabet, and **every name word is used once** in the whole
knowledge base, so two entities never share a word and a word identifies its entity.

Entities belong to a split (``"train"`` or ``"test"``) and relations never cross splits: the knowledge
base is two disconnected worlds, and questions built in one world only mention (and answer with) its
entities (see :mod:`dlmrl.envs.tools.multihop`).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["ENTITY_TYPES", "RELATIONS", "SPLITS", "Entity", "KnowledgeBase", "Relation", "name_key"]

ENTITY_TYPES = ("person", "city", "country", "film", "book", "company")
SPLITS = ("train", "test")


@dataclass(frozen=True)
class Relation:
    """A typed functional relation ``subject --name--> object``.

    Attributes:
        name: the relation's name, as the ``lookup`` tool takes it. subject, object: entity types.
        description: one line for the tool declaration.
    """

    name: str
    subject: str
    object: str
    description: str


RELATIONS: dict[str, Relation] = {r.name: r for r in (
    Relation("born_in", "person", "city", "the city where a person was born"),
    Relation("located_in", "city", "country", "the country a city is in"),
    Relation("capital", "country", "city", "the capital city of a country"),
    Relation("directed_by", "film", "person", "the director of a film"),
    Relation("filmed_in", "film", "city", "the city where a film was shot"),
    Relation("written_by", "book", "person", "the author of a book"),
    Relation("founded_by", "company", "person", "the founder of a company"),
    Relation("headquartered_in", "company", "city", "the city of a company's headquarters"),
)}

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
# names per entity type: a person has a given name and a family name, everything else one word
_WORDS_PER_NAME = {"person": 2}


def name_key(name: str) -> str:
    """The lookup key of a name: lowercase, whitespace collapsed (so ``"tesu  rabelo"`` finds ``Tesu Rabelo``)."""
    return " ".join(name.lower().split())


@dataclass(frozen=True)
class Entity:
    """One entity. Attributes: name (unique), type (one of :data:`ENTITY_TYPES`), split (``train``/``test``)."""

    name: str
    type: str
    split: str


@dataclass(frozen=True)
class KnowledgeBase:
    """Entities and their facts ``(subject name, relation) -> object name``.

    Build one with :meth:`generate`; the constructor checks a hand-made one.

    Attributes:
        entities: name -> :class:`Entity`. facts: ``(subject, relation) -> object`` (names).
    Raises:
        ValueError: a fact whose subject or object is unknown, of the wrong type for its relation, or
            across splits; an unknown relation.
    """

    entities: Mapping[str, Entity]
    facts: Mapping[tuple[str, str], str]
    _keys: dict[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        keys = {name_key(n): n for n in self.entities}
        if len(keys) != len(self.entities):
            raise ValueError("two entity names differ only in case or spacing")
        object.__setattr__(self, "_keys", keys)
        for (subject, rel), obj in self.facts.items():
            if rel not in RELATIONS:
                raise ValueError(f"unknown relation {rel!r} (known: {', '.join(RELATIONS)})")
            s, o = self.entities.get(subject), self.entities.get(obj)
            if s is None or o is None:
                raise ValueError(f"fact ({subject!r}, {rel!r}) -> {obj!r} names an unknown entity")
            if (s.type, o.type) != (RELATIONS[rel].subject, RELATIONS[rel].object):
                raise ValueError(f"fact ({subject!r}, {rel!r}) -> {obj!r}: {rel} links "
                                 f"{RELATIONS[rel].subject} -> {RELATIONS[rel].object}, not {s.type} -> {o.type}")
            if s.split != o.split:
                raise ValueError(f"fact ({subject!r}, {rel!r}) -> {obj!r} crosses the {s.split}/{o.split} splits")

    @classmethod
    def generate(cls, seed: int = 0, sizes: Mapping[str, int] | None = None,
                 test_fraction: float = 0.25) -> KnowledgeBase:
        """A random knowledge base, the same for the same arguments (``random.Random(seed)`` only).

        Each type's entities are split ``round(n * test_fraction)`` test (at least one when
        ``test_fraction > 0``), the rest train; within each split every country gets at least one city
        and its capital is one of them; every other relation picks a uniform object of its split.

        Args:
            seed: the generator's seed. sizes: entities per type (defaults: 48 people, 24 cities,
                8 countries, 32 films, 16 books, 16 companies); a missing type keeps its default.
            test_fraction: the share of each type held out in the test world, in ``[0, 1)``.
        Returns:
            The knowledge base.
        Raises:
            ValueError: an unknown type, a split with no entity of some type, or fewer cities than
                countries in a split.
        """
        n = {"person": 48, "city": 24, "country": 8, "film": 32, "book": 16, "company": 16}
        for t, k in (sizes or {}).items():
            if t not in n:
                raise ValueError(f"unknown entity type {t!r} (known: {', '.join(ENTITY_TYPES)})")
            n[t] = int(k)
        if not 0.0 <= test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
        rng = random.Random(seed)
        words = _unique_words(rng, sum(n[t] * _WORDS_PER_NAME.get(t, 1) for t in ENTITY_TYPES))
        entities: dict[str, Entity] = {}
        by: dict[tuple[str, str], list[str]] = {}
        for t in ENTITY_TYPES:
            n_test = max(1, round(n[t] * test_fraction)) if test_fraction > 0 else 0
            for i in range(n[t]):
                name = " ".join(next(words) for _ in range(_WORDS_PER_NAME.get(t, 1)))
                split = "test" if i < n_test else "train"
                entities[name] = Entity(name, t, split)
                by.setdefault((t, split), []).append(name)
        facts: dict[tuple[str, str], str] = {}
        for split in SPLITS if test_fraction > 0 else ("train",):
            pool = {t: by.get((t, split), []) for t in ENTITY_TYPES}
            empty = [t for t in ENTITY_TYPES if not pool[t]]
            if empty:
                raise ValueError(f"the {split} split has no {', '.join(empty)}: raise sizes or test_fraction")
            cities, countries = list(pool["city"]), pool["country"]
            if len(cities) < len(countries):
                raise ValueError(f"the {split} split has fewer cities ({len(cities)}) than countries "
                                 f"({len(countries)}): every country needs a capital")
            rng.shuffle(cities)
            # the first cities seed one country each, so every country has a city to be its capital
            home = {c: countries[i] if i < len(countries) else rng.choice(countries) for i, c in enumerate(cities)}
            for c in sorted(home):
                facts[(c, "located_in")] = home[c]
            for country in countries:
                facts[(country, "capital")] = rng.choice(sorted(c for c in home if home[c] == country))
            for rel in RELATIONS.values():
                if rel.name in ("located_in", "capital"):
                    continue
                for subject in pool[rel.subject]:
                    facts[(subject, rel.name)] = rng.choice(pool[rel.object])
        return cls(entities, facts)

    def entity(self, name: str) -> Entity | None:
        """The entity called ``name`` (case and spacing ignored, :func:`name_key`), or ``None``."""
        canonical = self._keys.get(name_key(name)) if isinstance(name, str) else None
        return None if canonical is None else self.entities[canonical]

    def get(self, name: str, relation: str) -> str | None:
        """The object of ``(name, relation)`` (the subject's case and spacing ignored), or ``None``."""
        e = self.entity(name)
        return None if e is None else self.facts.get((e.name, relation))

    def relations_of(self, name: str) -> tuple[str, ...]:
        """The relations ``name`` is the subject of, in :data:`RELATIONS` order (empty for an unknown name)."""
        e = self.entity(name)
        return () if e is None else tuple(r for r in RELATIONS if (e.name, r) in self.facts)

    def of(self, type: str | None = None, split: str | None = None) -> list[Entity]:
        """Entities of one type and/or split, in generation order."""
        return [e for e in self.entities.values()
                if (type is None or e.type == type) and (split is None or e.split == split)]

    def search(self, query: str, limit: int = 5) -> list[Entity]:
        """Entities whose name contains ``query`` (case and spacing ignored), exact matches first, then by name.

        An empty query matches nothing (it would list the whole world)."""
        q = name_key(query)
        if not q:
            return []
        hits = [e for k, n in self._keys.items() if q in k for e in (self.entities[n],)]
        return sorted(hits, key=lambda e: (name_key(e.name) != q, e.name))[:limit]

    def words(self, names: Iterable[str]) -> set[str]:
        """The lowercase name words of ``names`` (each word belongs to one entity only)."""
        return {w for n in names for w in name_key(n).split()}


def _unique_words(rng: random.Random, count: int):
    """``count`` distinct capitalised words of 2-3 consonant-vowel syllables, as an iterator."""
    seen: set[str] = set()
    while len(seen) < count:
        word = "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(rng.choice((2, 3))))
        if word not in seen:
            seen.add(word)
            yield word.capitalize()
