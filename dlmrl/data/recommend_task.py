"""Generative recommendation as a task (``task.name: recommend``): GREAM's setting (arXiv 2510.20815) for SRPO.

The policy reads a user's history as the items' semantic IDs (:mod:`dlmrl.data.semantic_ids`: residual k-means
codes, ``<a_3><b_0><c_7><d_0>``) and writes the next item's ID. The users and items are a seeded synthetic
world (:mod:`dlmrl.data.recommend_data`), split by user: no held-out user is ever trained on.

Two modes (``task.options.mode``), GREAM's two inference modes:

- ``direct`` (Direct Sequence Recommendation): prompt ``History: <ID> <ID> ...\\nRecommend: ``, completion the
  ID alone.
- ``reasoning`` (Sequential Reasoning Recommendation): prompt ``History: ...\\nThink: ``, completion a short
  reasoning chain, then the ID: ``Prefers music; last <ID>. Recommend: <ID>``: the history's dominant category
  (latent preference) and its last item in that category (denoised evidence), then the recommendation
  **(dlmrl interpretation** of the paper's chain of thought, whose steps are behavioural evidence, preference,
  intent and the recommendation).

**Reward** (Residual-Sensitive Verifiable Reward, :func:`~dlmrl.objectives.shaping.srpo_graded_reward`): 1 for
the exact ID; otherwise by the leading levels of the written ID that equal the target's: 0 → 0, 1 → 0.5,
2 → 0.707, 3 → 0.866; 0 when the **format gate** fails: the completion (stripped) must be exactly one
well-formed ID of the catalogue's number of levels (``direct``), or exactly the reasoning template with a known
category and two well-formed IDs (``reasoning``); a well-formed ID of no item still earns its matched prefix.
The reasoning itself is not rewarded (GREAM rewards the recommendation). The reward is 1 exactly when the ID is
right, so ``AdvantageInputs.exact`` (SRPO's Bonus-Calibrated Group Advantage counts the exact matches of each
group) equals ``reward >= 1``; :meth:`RecommendTask.exact_matches` gives the flags and the trainer passes them to
the ``srpo_passk`` advantage.

**Held-out metrics** (:meth:`RecommendTask.metrics`): from one greedy completion per user: ``exact`` (the ID is
the target's), ``mean_reward``, ``levels_matched`` (mean leading levels right), ``format_ok``; in ``reasoning``
mode ``category_accuracy`` (the chain names the user's preferred category). With ``eval_mode: beam`` (the
default, AR policies) also ``recall@K`` and ``ndcg@K`` for each ``K`` of ``k_values``
(:mod:`dlmrl.data.ranking_metrics`), from the ``beam_size`` items of a constrained beam search over the catalogue
(:mod:`dlmrl.models.constrained_beam`), ranked by their sequence log-probability after the prompt (``reasoning``:
after the prompt and the greedy reasoning up to ``Recommend: ``; a chain without it ranks nothing, a miss at
every K). Primary metric: ``ndcg@<largest K>`` (``eval_mode: greedy``: ``exact``).
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar, NamedTuple

import numpy as np
import torch

from dlmrl.data.encoding import decode_to_eos, pad_token_id
from dlmrl.data.ranking_metrics import gold_rank, ranking_metrics
from dlmrl.data.recommend_data import (
    CATEGORY_NAMES,
    Catalogue,
    UserHistory,
    generate_catalogue,
    generate_histories,
)
from dlmrl.data.semantic_ids import (
    LEVEL_LETTERS,
    MAX_CODES,
    format_sid,
    leading_levels_matched,
    parse_sid,
    semantic_ids,
    sid_pieces,
)
from dlmrl.data.task import TASKS, Task, TaskBatch, epoch_batch, full_canvas_batch
from dlmrl.errors import OptionError
from dlmrl.objectives.shaping import srpo_graded_reward

__all__ = ["EVAL_MODES", "MODES", "RecommendOptions", "RecommendTask", "RecommendWorld", "Verdict",
           "build_world", "check_recommend_options", "recommend_tokenizer"]

MODES = ("direct", "reasoning")
EVAL_MODES = ("beam", "greedy")
PROMPTS = {"direct": "History: {history}\nRecommend: ", "reasoning": "History: {history}\nThink: "}
REASONING = "Prefers {category}; last {last}. Recommend: {sid}"
_REASONING_RE = re.compile(r"Prefers (\w+); last (\S+)\. Recommend: (\S+)")
#: where the ID starts in a reasoning completion (the ranking's context ends here)
ANSWER_MARKER = "Recommend: "


def recommend_tokenizer():
    """The tiny recommenders' tokenizer: one token per semantic-ID code (:func:`~dlmrl.data.semantic_ids.sid_pieces`),
    the category names and the templates' words, over the text character alphabet
    (:func:`~dlmrl.models.tokenizer.build_piece_tokenizer`)."""
    from dlmrl.models.tokenizer import build_piece_tokenizer

    return build_piece_tokenizer([*sid_pieces(), *CATEGORY_NAMES, "History:", "Recommend:", "Think:", "Prefers",
                                  "last"])


@dataclass(frozen=True)
class RecommendOptions:
    """The recommendation task's settings (``task.options.<field>``).

    Attributes:
        mode: ``direct`` (the ID alone) or ``reasoning`` (a reasoning chain, then the ID); module docstring.
        catalogue_seed, num_categories, styles, items_per_style, feature_dim: the catalogue
            (:func:`~dlmrl.data.recommend_data.generate_catalogue`; ``num_categories · styles · items_per_style``
            items).
        codebook_sizes: residual k-means codes per level (1 to 4 levels, each in ``[2, 32]``); the IDs have one more
            level that tells apart items sharing every code.
        user_seed: the users' seed (held-out users from a seed of their own). n_train, n_test: users per split.
        history_length: items per history. noise: probability of a noisy click from another category (at most
            ``⌊(T − 1)/2⌋`` per history). jump: probability that the next preferred item is not the successor.
        k_values: the ``K`` of Recall@K and NDCG@K. beam_size: candidates of the held-out beam search
            (``>= max(k_values)``).
        eval_mode: ``beam`` (greedy metrics plus Recall/NDCG@K from a constrained beam search; AR policies) or
            ``greedy`` (one greedy completion per user only).
    """

    mode: str = "direct"
    catalogue_seed: int = 0
    num_categories: int = 8
    styles: int = 4
    items_per_style: int = 8
    feature_dim: int = 16
    codebook_sizes: list[int] = field(default_factory=lambda: [8, 4, 8])
    user_seed: int = 0
    n_train: int = 4000
    n_test: int = 256
    history_length: int = 6
    noise: float = 0.3
    jump: float = 0.15
    k_values: list[int] = field(default_factory=lambda: [1, 5, 10])
    beam_size: int = 10
    eval_mode: str = "beam"


def _check(ok: bool, key: str, problem: str) -> None:
    if not ok:  # (the field: the config names the key that set it, task.options.<field>)
        raise OptionError(key, f"{key}: {problem}")


def check_recommend_options(o: RecommendOptions) -> None:
    """Raises :class:`~dlmrl.errors.OptionError` naming the field of a bad setting."""
    _check(o.mode in MODES, "mode", f"must be one of {MODES}, got {o.mode!r}")
    for seed in ("catalogue_seed", "user_seed"):  # (numpy's generators take non-negative seeds only)
        value = getattr(o, seed)
        _check(isinstance(value, int) and not isinstance(value, bool) and value >= 0, seed,
               f"must be an integer >= 0, got {value!r}")
    _check(2 <= o.num_categories <= len(CATEGORY_NAMES), "num_categories",
           f"must be in [2, {len(CATEGORY_NAMES)}], got {o.num_categories}")
    _check(o.styles >= 1, "styles", f"must be >= 1, got {o.styles}")
    _check(o.items_per_style >= 2, "items_per_style", f"must be >= 2, got {o.items_per_style}")
    _check(o.feature_dim >= 1, "feature_dim", f"must be >= 1, got {o.feature_dim}")
    sizes = o.codebook_sizes
    _check(isinstance(sizes, list | tuple) and 1 <= len(sizes) <= len(LEVEL_LETTERS) - 1
           and all(isinstance(k, int) and 2 <= k <= MAX_CODES for k in sizes), "codebook_sizes",
           f"a list of 1 to {len(LEVEL_LETTERS) - 1} codebook sizes in [2, {MAX_CODES}], got {sizes!r}")
    items = o.num_categories * o.styles * o.items_per_style
    _check(max(sizes) <= items, "codebook_sizes", f"a codebook of {max(sizes)} codes for {items} items")
    _check(o.n_train >= 1, "n_train", f"must be >= 1, got {o.n_train}")
    _check(o.n_test >= 1, "n_test", f"must be >= 1, got {o.n_test}")
    _check(o.history_length >= 1, "history_length", f"must be >= 1, got {o.history_length}")
    _check(0 <= o.noise < 1, "noise", f"must be in [0, 1), got {o.noise}")
    _check(0 <= o.jump <= 1, "jump", f"must be in [0, 1], got {o.jump}")
    ks = o.k_values
    _check(isinstance(ks, list | tuple) and bool(ks) and all(isinstance(k, int) and k >= 1 for k in ks)
           and len(set(ks)) == len(ks), "k_values", f"a list of distinct integers >= 1, got {ks!r}")
    _check(o.beam_size >= max(ks), "beam_size", f"must be >= max(k_values) = {max(ks)}, got {o.beam_size}")
    _check(o.eval_mode in EVAL_MODES, "eval_mode", f"must be one of {EVAL_MODES}, got {o.eval_mode!r}")


@dataclass(frozen=True)
class RecommendWorld:
    """The catalogue, its semantic IDs and the users of both splits.

    Attributes:
        catalogue: the items. sids: ``(N, M + 1)`` int64 semantic IDs (row ``i`` is item ``i``'s).
        train, test: the users of each split.
    """

    catalogue: Catalogue
    sids: np.ndarray
    train: list[UserHistory]
    test: list[UserHistory]


def build_world(o: RecommendOptions) -> RecommendWorld:
    """The world of ``o`` (deterministic). Raises ``OptionError`` (``codebook_sizes``) when the IDs would need a
    disambiguation code past :data:`~dlmrl.data.semantic_ids.MAX_CODES`."""
    cat = generate_catalogue(o.num_categories, o.styles, o.items_per_style, o.feature_dim, o.catalogue_seed)
    sids = semantic_ids(cat.features, o.codebook_sizes, o.catalogue_seed)
    _check(int(sids[:, -1].max()) < MAX_CODES, "codebook_sizes",
           f"{int(sids[:, -1].max()) + 1} items share one code tuple (at most {MAX_CODES}); use more or larger "
           "codebooks")
    args = (o.history_length, o.noise, o.jump)
    return RecommendWorld(cat, sids, generate_histories(cat, o.n_train, *args, seed=2 * o.user_seed),
                          generate_histories(cat, o.n_test, *args, seed=2 * o.user_seed + 1))


class Verdict(NamedTuple):
    """How one completion answers a user: ``format_ok`` (the format gate), ``sid`` (the written ID, ``None`` when
    the gate fails), ``levels`` (leading levels right), ``exact``, ``category_ok`` (reasoning: the chain names
    the preferred category; ``direct``: ``None``), ``reward`` (the graded reward)."""

    format_ok: bool
    sid: tuple[int, ...] | None
    levels: int
    exact: bool
    category_ok: bool | None
    reward: float


@TASKS.register("recommend")
class RecommendTask(Task):
    """Next-item generative recommendation over semantic IDs (module docstring).

    Args:
        tokenizer: a tokenizer with one token per ID code (:func:`recommend_tokenizer`). mask_token_id: the canvas
            token (``None``: AR).
        options: :class:`RecommendOptions`; ``settings``: fields of it to change.
        gen_length: the canvas (AR: the completion budget before EOS), ``sampling.gen_length`` in a run; ``None``:
            the longest reference completion (4 tokens in ``direct`` mode with the default codebooks, 19 in
            ``reasoning``).
    Attributes:
        world: the :class:`RecommendWorld`. levels: codes per ID (``M + 1``). item_of_sid: ID → item.
        code_token_ids: ``code_token_ids[l][c]``, the token of code ``c`` at level ``l``.
        gen_length: the canvas length (the AR budget is one more, for EOS). reference_length: the longest reference
            completion in tokens.
    Raises:
        OptionError: a bad option (naming the field). ValueError: a tokenizer without the IDs' tokens; a
            ``gen_length`` shorter than the reference completions (naming ``sampling.gen_length``).
    """

    name = "recommend"
    options_class = RecommendOptions
    primary_metric = "ndcg@10"
    CORRECT = 1.0
    #: the flat task.* keys this task does not read
    refused_keys: ClassVar[dict[str, str]] = {k: "the recommend task generates its users; set task.options.* instead"
                                              for k in ("train_file", "test_file")}

    def __init__(self, tokenizer, mask_token_id: int | None, options: RecommendOptions | None = None,
                 gen_length: int | None = None, **settings):
        self.options = o = replace(options or RecommendOptions(), **settings)
        check_recommend_options(o)
        self.tokenizer, self.mask_token_id, self.mode = tokenizer, mask_token_id, o.mode
        self.world = build_world(o)
        self.train_examples, self.test_examples = self.world.train, self.world.test
        self.sids = [tuple(int(c) for c in row) for row in self.world.sids.tolist()]
        self.item_of_sid = {s: i for i, s in enumerate(self.sids)}
        self.levels = self.world.sids.shape[1]
        self.names = self.world.catalogue.category_names
        self.primary_metric = f"ndcg@{max(o.k_values)}" if o.eval_mode == "beam" else "exact"
        self.pad_token_id = pad_token_id(tokenizer)
        vocab = tokenizer.get_vocab()
        missing = [p for p in sid_pieces(self.levels, MAX_CODES) if p not in vocab]
        if missing:
            raise ValueError(f"the recommend task writes one token per semantic-ID code, but this tokenizer has no "
                             f"token for {missing[0]} (and {len(missing) - 1} more); use "
                             "dlmrl.data.recommend_task.recommend_tokenizer (the tiny-recommend-ar model's)")
        self.code_token_ids = [[vocab[f"<{LEVEL_LETTERS[level]}_{c}>"] for c in range(MAX_CODES)]
                               for level in range(self.levels)]
        self.reference_length = self._longest_completion()
        self.gen_length = self._canvas(gen_length)

    def _longest_completion(self) -> int:
        """Tokens of the longest reference completion in this mode (every ID has as many tokens)."""
        sid, tok = format_sid(self.sids[0]), self.tokenizer
        longest = max(self.names, key=lambda n: len(tok(n, add_special_tokens=False)["input_ids"]))
        reference = sid if self.mode == "direct" else REASONING.format(category=longest, last=sid, sid=sid)
        return len(tok(reference, add_special_tokens=False)["input_ids"])

    def _canvas(self, gen_length: int | None) -> int:
        if gen_length is not None and gen_length < self.reference_length:
            raise ValueError(f"sampling.gen_length: {gen_length} tokens cannot hold the {self.mode} mode's completion "
                             f"({self.reference_length} tokens); set sampling.gen_length >= {self.reference_length}")
        return self.reference_length if gen_length is None else gen_length

    @classmethod
    def check_options(cls, options: RecommendOptions) -> int:
        """The options and the world they build; the number of held-out users."""
        check_recommend_options(options)
        return len(build_world(options).test)

    @classmethod
    def from_options(cls, options, tokenizer, mask_token_id: int | None, gen_length: int | None = None,
                     **resources) -> RecommendTask:
        """The task with a canvas of ``gen_length`` tokens (``sampling.gen_length``; ``None``: the longest reference
        completion)."""
        return cls(tokenizer, mask_token_id, options, gen_length)

    #: the world's settings the shipped ``tiny-recommend-ar`` was trained on (its IDs and histories)
    WORLD_FIELDS = ("catalogue_seed", "num_categories", "styles", "items_per_style", "feature_dim", "codebook_sizes")

    @classmethod
    def check_policy_world(cls, options: RecommendOptions, name_or_path: str) -> None:
        """Warn when the shipped base is asked to serve a world other than the one it was trained on: its semantic IDs
        would be new to it (every completion then fails the format gate or names no item)."""
        if name_or_path != "tiny-recommend-ar":
            return
        default = RecommendOptions()
        changed = [f for f in cls.WORLD_FIELDS if getattr(options, f) != getattr(default, f)]
        if changed:
            import warnings

            warnings.warn(f"tiny-recommend-ar was trained on the default world; task.options {', '.join(changed)} "
                          "build another catalogue whose semantic IDs it has never seen (expect rewards near 0): "
                          "pretrain a base on this world first (dlmrl pretrain task=recommend)", stacklevel=2)

    @classmethod
    def check_gen_length(cls, options: RecommendOptions, gen_length: int) -> None:
        """The canvas must hold the mode's longest reference completion (under the task's own tokenizer)."""
        check_recommend_options(options)
        need = cls(recommend_tokenizer(), None, options).reference_length
        if gen_length < need:
            raise OptionError("gen_length", f"{gen_length} tokens cannot hold the {options.mode} mode's completion "
                                            f"({need} tokens); set sampling.gen_length >= {need}")

    @classmethod
    def check_policy(cls, options: RecommendOptions, kind, evaluates: bool) -> None:
        """The held-out beam search scores IDs with an AR policy's exact log-probs: another kind that evaluates
        needs ``eval_mode: greedy``."""
        _check(not (evaluates and not kind.autoregressive and options.eval_mode == "beam"), "eval_mode",
               f"'beam' ranks the catalogue by an AR policy's sequence log-probs; model.kind {kind!r} cannot: set "
               "task.options.eval_mode: greedy (exact-match metrics from one greedy completion)")

    @classmethod
    def describe(cls, options: RecommendOptions) -> dict:
        """What ``--dry-run`` shows of the task: the world's sizes, the reward, the advantage input, the metrics."""
        check_recommend_options(options)
        world = build_world(options)
        ks = options.k_values
        return {"mode": options.mode, "options": dataclasses.asdict(options),
                "catalogue": f"{len(world.catalogue)} items in {len(world.catalogue.category_names)} categories",
                "semantic_ids": f"{world.sids.shape[1]} levels (residual k-means {list(options.codebook_sizes)} "
                                f"+ 1 disambiguation level, at most {int(world.sids[:, -1].max()) + 1} items per "
                                "code tuple)",
                "users": f"{len(world.train)} train, {len(world.test)} held-out (split by user)",
                "reward": "residual-sensitive graded reward: 1 exact; leading levels 1/2/3 -> 0.5/0.707/0.866; "
                          "0 when the format gate fails",
                "exact_flags": "the task's exact matches (reward 1), passed to the srpo_passk advantage",
                "eval": (f"greedy metrics + Recall@K, NDCG@K (K = {', '.join(map(str, ks))}) from a constrained beam "
                         f"search of {options.beam_size} items" if options.eval_mode == "beam"
                         else "greedy exact-match metrics"),
                "primary_metric": f"ndcg@{max(ks)}" if options.eval_mode == "beam" else "exact"}

    @property
    def evaluates_ranking(self) -> bool:
        """Whether held-out evaluation ranks the catalogue by beam search (``eval_mode: beam``)."""
        return self.options.eval_mode == "beam"

    def in_mode(self, mode: str) -> RecommendTask:
        """A shallow copy writing in ``mode`` (the same world and tokens; a canvas of its longest reference
        completion)."""
        _check(mode in MODES, "mode", f"must be one of {MODES}, got {mode!r}")
        other = copy.copy(self)
        other.options, other.mode = replace(self.options, mode=mode), mode
        other.gen_length = other.reference_length = other._longest_completion()
        return other

    # -- data ---------------------------------------------------------------------------------------------
    def train_batch(self, n: int, seed: int, step: int) -> list[UserHistory]:
        """Positions ``step·n .. step·n + n − 1`` of per-epoch permutations of the training users, each a function
        of ``(seed, epoch)`` (so of ``(seed, step)``: resumes see the same data)."""
        return epoch_batch(self.train_examples, n, seed, step, "recommend")

    def test_batch(self, n: int) -> list[UserHistory]:
        """The first ``n`` held-out users (``ValueError`` when fewer exist)."""
        if n > len(self.test_examples):
            raise ValueError(f"asked for {n} held-out users, the recommend test split has {len(self.test_examples)}")
        return self.test_examples[:n]

    # -- text ---------------------------------------------------------------------------------------------
    def prompt_text(self, example: UserHistory) -> str:
        """The prompt of ``example`` in this task's mode."""
        return PROMPTS[self.mode].format(history=" ".join(format_sid(self.sids[i]) for i in example.history))

    def completion_text(self, example: UserHistory) -> str:
        """The reference completion: the target's ID (``direct``), or the reasoning chain then it."""
        sid = format_sid(self.sids[example.target])
        if self.mode == "direct":
            return sid
        last = [i for i in example.history if self.world.catalogue.category[i] == example.category][-1]
        return REASONING.format(category=self.names[example.category], last=format_sid(self.sids[last]), sid=sid)

    def reference_solution(self, example: UserHistory) -> str:
        """:meth:`completion_text` (the SFT target; DaGRPO's anchors)."""
        return self.completion_text(example)

    def ranking_context(self, example: UserHistory, text: str) -> str | None:
        """The text the ID continues in a ranking: the prompt (``direct``), or the prompt and ``text`` (a
        completion) up to and including ``Recommend: `` (``reasoning``; ``None`` when it has none)."""
        prompt = self.prompt_text(example)
        if self.mode == "direct":
            return prompt
        cut = text.find(ANSWER_MARKER)
        return None if cut < 0 else prompt + text[: cut + len(ANSWER_MARKER)]

    # -- encoding -----------------------------------------------------------------------------------------
    def encode(self, examples: Sequence[UserHistory], device: str | torch.device = "cpu") -> TaskBatch:
        """``[BOS]`` prompts and a canvas of ``gen_length`` positions, all written and scored."""
        return full_canvas_batch(self, examples, [self.prompt_text(e) for e in examples], device)

    def decode(self, canvas: torch.Tensor) -> list[str]:
        """``(B, L)`` long completion tokens -> texts up to the first EOS, special tokens skipped."""
        return decode_to_eos(self.tokenizer, canvas)

    # -- rewards and metrics ------------------------------------------------------------------------------
    def verdict(self, example: UserHistory, text: str) -> Verdict:
        """The format gate, the written ID and the graded reward of one completion (module docstring)."""
        category_ok = None
        if self.mode == "direct":
            sid = parse_sid(text, self.levels)
        else:
            m = _REASONING_RE.fullmatch(text.strip())
            known = m is not None and m.group(1) in self.names and parse_sid(m.group(2), self.levels) is not None
            sid = parse_sid(m.group(3), self.levels) if known else None
            category_ok = known and m.group(1) == self.names[example.category]
        gold = self.sids[example.target]
        if sid is None:
            return Verdict(False, None, 0, False, category_ok, 0.0)
        levels, exact = leading_levels_matched(sid, gold), sid == gold
        return Verdict(True, sid, levels, exact, category_ok, srpo_graded_reward(levels, exact, True))

    def verdicts(self, examples: Sequence[UserHistory], texts: Sequence[str]) -> list[Verdict]:
        return [self.verdict(e, t) for e, t in zip(examples, texts, strict=True)]

    def rewards(self, examples: Sequence[UserHistory], texts: Sequence[str]) -> list[float]:
        """The residual-sensitive graded reward of each completion."""
        return [v.reward for v in self.verdicts(examples, texts)]

    def exact_matches(self, examples: Sequence[UserHistory], texts: Sequence[str]) -> list[bool]:
        """Whether each completion's ID is the target's (SRPO's exact-match flags; equal to ``reward >= 1``)."""
        return [v.exact for v in self.verdicts(examples, texts)]

    def metrics(self, examples: Sequence[UserHistory], texts: Sequence[str],
                ranked: Sequence[Sequence[tuple[int, ...]]] | None = None) -> dict:
        """Held-out metrics (module docstring) of greedy completions ``texts``; with ``ranked`` (each user's
        candidate IDs, best first) also ``recall@K`` and ``ndcg@K`` for each ``K`` of ``k_values``."""
        vs = self.verdicts(examples, texts)
        n = max(len(vs), 1)
        out = {"exact": sum(v.exact for v in vs) / n, "mean_reward": sum(v.reward for v in vs) / n,
               "levels_matched": sum(v.levels for v in vs) / n, "format_ok": sum(v.format_ok for v in vs) / n}
        if self.mode == "reasoning":
            out["category_accuracy"] = sum(bool(v.category_ok) for v in vs) / n
        if ranked is not None:
            ranks = [gold_rank(list(c), self.sids[e.target]) for e, c in zip(examples, ranked, strict=True)]
            out.update(ranking_metrics(ranks, sorted(self.options.k_values)))
        out["num_examples"] = len(vs)
        return out
