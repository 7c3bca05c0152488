"""The base of the text tasks (GSM8K, MATH, Countdown, Sudoku's text form, your dataset): d1-format prompts, a canvas
of ``gen_length`` masks, correctness plus format rewards (d1, arXiv 2504.12216).

- **Prompt**: the example's user message from its split's template (the task's ``templates``; training
  examples use ``task.prompt_template``, held-out ones ``task.test_prompt_template``), wrapped by the
  tokenizer's chat template when it has one (``task.chat_template``), left-padded.
- **Canvas**: ``gen_length`` mask tokens after the prompt (an AR policy without a mask token gets pad
  tokens there; it never reads them); every canvas position is written and scored.
- **Decoding**: up to the first end token (EOS, ``<|eot_id|>``, ``<|im_end|>``, ``<|endoftext|>``,
  ``<|end_of_text|>``: whichever the tokenizer has), special tokens skipped.
- **Rewards**: correctness (GSM8K 2.0, MATH 2.0, Countdown 1.0/0.1/0) plus the components named in
  ``task.format_rewards`` (:data:`dlmrl.rewards.format.FORMAT_COMPONENTS`; ``d1`` = the task's ``d1_format_rewards``).
- **Data order**: training examples in a fresh permutation per epoch, a function of (seed, epoch), so the
  batch of a step depends only on (seed, step) and a resumed run sees the same data.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch

from dlmrl.data.encoding import decode_ids, left_pad, pad_token_id
from dlmrl.data.loading import DataError, is_local_file, load_records
from dlmrl.data.prompts import PromptTemplate, check_template, get_template, render_prompt, uses_chat_template
from dlmrl.data.task import Task, TaskBatch
from dlmrl.rewards.extract import UNFILLED
from dlmrl.rewards.format import FORMAT_COMPONENTS

__all__ = ["PromptOptions", "TextOptions", "TextTask", "parse_format_rewards"]

_STOP_TOKENS = ("<|eot_id|>", "<|im_end|>", "<|endoftext|>", "<|end_of_text|>")


def parse_format_rewards(spec: str, d1: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The format components ``spec`` names: ``none``, ``d1`` (the task's d1 set, ``d1``) or a comma list.

    Raises:
        ValueError: an unknown component name.
    """
    spec = spec.strip()
    if spec in ("", "none"):
        return ()
    if spec == "d1":
        return d1
    names = tuple(s.strip() for s in spec.split(",") if s.strip())
    bad = [n for n in names if n not in FORMAT_COMPONENTS]
    if bad:
        raise ValueError(f"unknown format reward {bad[0]!r}; use none, d1 or a comma list of "
                         f"{', '.join(FORMAT_COMPONENTS)}")
    return names


@dataclass(frozen=True)
class PromptOptions:
    """The prompt and format-reward settings of a text task (``task.*`` keys of the same names).

    Attributes:
        prompt_template, test_prompt_template: a built-in template name (the task's ``templates``: ``d1``,
            ``d1_eval``, ``plain``) or a format string over the task's fields (``None``: the training one).
        chat_template: ``auto`` | ``on`` | ``off``.
        format_rewards: ``none`` | ``d1`` | a comma list of format components added to the reward.
    """

    prompt_template: str = "d1"
    test_prompt_template: str | None = None
    chat_template: str = "auto"
    format_rewards: str = "none"


@dataclass(frozen=True)
class SourceOptions:
    """Where a task's data comes from (``task.*`` keys of the same names).

    Attributes:
        dataset, subset, split: the training source (hub id or local file/folder) and split (``None``: the task's
            ``DEFAULTS``). test_dataset, test_split: the held-out one.
        train_file, test_file: local files that replace the sources.
        num_proc, cache_dir: ``datasets.load_dataset``'s.
    """

    dataset: str | None = None
    subset: str | None = None
    split: str | None = None
    test_dataset: str | None = None
    test_split: str | None = None
    train_file: str | None = None
    test_file: str | None = None
    num_proc: int | None = None
    cache_dir: str | None = None


@dataclass(frozen=True)
class TextOptions(PromptOptions, SourceOptions):
    """A text task's settings: its prompts (:class:`PromptOptions`) and where its data comes from
    (:class:`SourceOptions`)."""


class TextTask(Task):
    """A task whose prompts and answers are text (the base of the GSM8K, MATH, Countdown and dataset tasks).

    Args:
        tokenizer: a ``transformers`` tokenizer.
        mask_token_id: the canvas token (``None`` for an AR policy: pad tokens instead).
        gen_length: canvas length ``L`` in tokens.
        train_examples, test_examples: the examples (``from_options`` loads them lazily instead).
        options: the settings (the class's ``options_class``); ``settings``: fields of it to change
            (``prompt_template="plain"``).

    Class attributes:
        templates: the built-in prompt templates by name. template_fields: the fields a custom template may use.
        d1_format_rewards: the format components ``format_rewards: d1`` names (d1's set for the task).
        DEFAULTS: the hub sources: dataset, subset, split, test_dataset, test_split.
        converter: ``(records, split) -> examples``.

    Raises:
        ValueError: a bad template, chat template setting or format reward name.
    """

    options_class = TextOptions
    primary_metric = "accuracy"  # the held-out headline metric (dlmrl.evaluation.heldout)
    CORRECT = 1.0  # the correctness reward of a right answer
    templates: ClassVar[dict[str, PromptTemplate]] = {}
    template_fields: ClassVar[tuple[str, ...]] = ("question",)
    d1_format_rewards: ClassVar[tuple[str, ...]] = ()
    DEFAULTS: ClassVar[dict[str, str | None]] = {}
    converter = staticmethod(lambda records, split: [])

    def __init__(self, tokenizer, mask_token_id: int | None, gen_length: int = 256, train_examples=None,
                 test_examples=None, options: PromptOptions | None = None, **settings):
        self.options = options = replace(options or self.options_class(), **settings)
        if gen_length < 1:
            raise ValueError(f"gen_length must be >= 1, got {gen_length}")
        if options.chat_template not in ("auto", "on", "off"):
            raise ValueError(f"chat_template must be auto, on or off, got {options.chat_template!r}")
        self.tokenizer, self.mask_token_id, self.gen_length = tokenizer, mask_token_id, gen_length
        self.prompts: dict[str, PromptTemplate] = {
            "train": self.template(options.prompt_template),
            "test": self.template(options.test_prompt_template or options.prompt_template),
        }
        self.chat = uses_chat_template(tokenizer, options.chat_template)
        self.format_rewards = parse_format_rewards(options.format_rewards, self.d1_format_rewards)
        self._train, self._test = train_examples, test_examples
        self._loaders: dict[str, Any] = {}
        self._orders: dict[tuple[int, int], list[int]] = {}
        vocab = tokenizer.get_vocab()
        self._stop_ids = {i for i in [tokenizer.eos_token_id] + [vocab.get(t) for t in _STOP_TOKENS] if i is not None}
        self.pad_token_id = pad_token_id(tokenizer)

    @classmethod
    def template(cls, template: str) -> PromptTemplate:
        """The built-in template ``template`` of this task or a custom format string (``ValueError`` if neither)."""
        return get_template(cls.templates, cls.template_fields, template, cls.name)

    # -- construction from options ------------------------------------------------------------------
    @classmethod
    def sources(cls, options) -> dict[str, tuple[str, str, str | None, str]]:
        """``{"train": (source, split, subset, key), "test": (...)}`` from ``options`` and the task's defaults;
        ``key`` is the config field that chose the source (for error messages)."""
        d = cls.DEFAULTS
        default_subset = options.subset if options.subset is not None else d.get("subset")

        def subset_of(source: str) -> str | None:  # (naming the default set explicitly keeps its subset)
            defaults = (d["dataset"], d.get("test_dataset"))
            return default_subset if source in defaults else options.subset

        if options.train_file:
            train = (options.train_file, "train", None, "task.train_file")
        elif options.dataset:
            train = (options.dataset, options.split or d["split"], subset_of(options.dataset), "task.dataset")
        else:
            train = (d["dataset"], options.split or d["split"], default_subset, "task.dataset")
        test_split = options.test_split or d["test_split"]
        if options.test_file:
            test = (options.test_file, "train", None, "task.test_file")
        elif options.test_dataset or options.dataset:
            key = "task.test_dataset" if options.test_dataset else "task.dataset"
            source = options.test_dataset or options.dataset
            test = (source, test_split, subset_of(source), key)
        else:
            test = (d.get("test_dataset") or d["dataset"], test_split, default_subset, "task.test_dataset")
        return {"train": train, "test": test}

    @classmethod
    def load_split(cls, options, which: str) -> list:
        """Load and check the examples of ``which`` (``train`` or ``test``) as ``options`` describe.

        Raises:
            DataError: ``"task.<field>: <file> line N: field '<column>': ..."`` for the first bad record (the
                file or dataset, the line or row, the column), or a source or split that cannot be read.
        """
        source, split, subset, key = cls.sources(options)[which]
        if is_local_file(source) and not split.startswith("train"):
            split_key = "task.split" if which == "train" else "task.test_split"
            raise DataError(f"{split_key}: {source} is a single file, whose only split is 'train'; got "
                            f"{split!r} (slice it, e.g. 'train[-500:]', or set task.test_file)")
        try:
            records = load_records(source, split, subset, options.cache_dir, options.num_proc)
            examples = cls.convert(options, records, which)
            return cls.filter_examples(options, examples, f"{source} (split {split!r})")
        except DataError as e:
            raise DataError(f"{key}: {e}") from None

    @classmethod
    def convert(cls, options, records, which: str) -> list:
        """The examples of loaded ``records`` (a :class:`~dlmrl.data.loading.Records`): the task's ``converter``
        (a task whose conversion reads its options, such as the dataset task's prompt column, overrides this)."""
        return cls.converter(records, which)

    @classmethod
    def filter_examples(cls, options, examples: list, where: str) -> list:
        if not examples:
            raise DataError(f"{where}: no examples")
        return examples

    @classmethod
    def check_prompt_options(cls, options: PromptOptions) -> None:
        """The prompt templates, chat template and format rewards of ``options``. Raises ``ValueError`` naming
        the field."""
        for key, template in (("prompt_template", options.prompt_template),
                              ("test_prompt_template", options.test_prompt_template)):
            if template is not None:
                problem = check_template(cls.templates, cls.template_fields, template, cls.name)
                if problem is not None:
                    raise ValueError(f"task.{key}: {problem}")
        if options.chat_template not in ("auto", "on", "off"):
            raise ValueError(f"task.chat_template: must be auto, on or off, got {options.chat_template!r}")
        try:
            parse_format_rewards(options.format_rewards, cls.d1_format_rewards)
        except ValueError as e:
            raise ValueError(f"task.format_rewards: {e}") from None

    @classmethod
    def check_options(cls, options: TextOptions) -> int | None:
        """Check the settings and load the *local* data files (hub data is loaded by the run).

        Returns the number of held-out examples when they come from a local file, else ``None``.

        Raises:
            ValueError: naming the field (``DataError`` for a bad record).
        """
        cls.check_prompt_options(options)
        test_size = None
        for which, (source, _, _, _) in cls.sources(options).items():
            if is_local_file(source):
                n = len(cls.load_split(options, which))
                test_size = n if which == "test" else test_size
        return test_size

    @classmethod
    def from_options(cls, options: TextOptions, tokenizer, mask_token_id: int | None, gen_length: int | None = None,
                     **resources) -> TextTask:
        """The task of ``options``; data is loaded on first use."""
        task = cls(tokenizer, mask_token_id, gen_length=gen_length or 256, options=options, **resources)
        task._loaders = {which: (lambda which=which: cls.load_split(options, which)) for which in ("train", "test")}
        return task

    @property
    def train_examples(self) -> list:
        if self._train is None:
            self._train = self.check_examples(self._loaders["train"]() if "train" in self._loaders else [])
        return self._train

    @property
    def test_examples(self) -> list:
        if self._test is None:
            self._test = self.check_examples(self._loaders["test"]() if "test" in self._loaders else [])
        return self._test

    def check_examples(self, examples: list) -> list:
        """Examples loaded on first use, returned as they are (a task whose examples need this task's tokenizer to
        be checked, such as the dataset task's chat messages, checks them here)."""
        return examples

    # -- data -----------------------------------------------------------------------------------------
    def _order(self, seed: int, epoch: int) -> list[int]:
        key = (seed, epoch)
        if key not in self._orders:
            order = list(range(len(self.train_examples)))
            random.Random(f"{seed}-epoch-{epoch}").shuffle(order)
            self._orders = {k: v for k, v in self._orders.items() if k[1] == epoch - 1}
            self._orders[key] = order
        return self._orders[key]

    def train_batch(self, n: int, seed: int, step: int) -> list:
        """The ``n`` training examples of ``step``: positions ``step·n .. step·n + n − 1`` of the epoch permutations."""
        examples = self.train_examples
        if not examples:
            raise ValueError(f"the {self.name} task has no training examples")
        out = []
        for k in range(step * n, step * n + n):
            epoch, pos = divmod(k, len(examples))
            out.append(examples[self._order(seed, epoch)[pos]])
        return out

    def test_batch(self, n: int) -> list:
        """The first ``n`` held-out examples (raises ValueError if fewer exist)."""
        if n > len(self.test_examples):
            raise ValueError(f"asked for {n} held-out examples, the {self.name} test split has "
                             f"{len(self.test_examples)}")
        return self.test_examples[:n]

    # -- encoding -------------------------------------------------------------------------------------
    def prompt_text(self, example) -> str:
        """The full prompt text of ``example`` (chat template, generation prompt and assistant prefix included)."""
        template = self.prompts["test" if example.split == "test" else "train"]
        return render_prompt(self.tokenizer, template.format(example.fields()), self.answer_prefix(example),
                             chat=self.chat)

    def prompt_token_ids(self, example) -> list[int]:
        """The prompt's token ids: :meth:`prompt_text` tokenized; the chat template writes its own special tokens
        (BOS), plain text gets the tokenizer's."""
        return self.tokenizer(self.prompt_text(example), add_special_tokens=not self.chat)["input_ids"]

    def encode(self, examples: Sequence, device: str | torch.device = "cpu") -> TaskBatch:
        """Left-padded prompts (:meth:`prompt_token_ids`) and a canvas of ``gen_length`` mask tokens, all of it
        written and scored."""
        ids = [self.prompt_token_ids(e) for e in examples]
        prompt_ids, prompt_mask = left_pad(ids, self.pad_token_id)  # (B, P)
        fill = self.mask_token_id if self.mask_token_id is not None else self.pad_token_id
        canvas = torch.full((len(ids), self.gen_length), fill, dtype=torch.long)  # (B, L)
        return TaskBatch(list(examples), prompt_ids.to(device), prompt_mask.to(device), canvas.to(device),
                         torch.ones_like(canvas, dtype=torch.bool).to(device))

    def decode(self, canvas: torch.Tensor) -> list[str]:
        """Canvas rows → text, up to the first end token, special tokens skipped, except the mask token: a
        position still holding it is written as :data:`~dlmrl.rewards.extract.UNFILLED` (which earns no reward),
        never dropped (dropping it would read ``4[MASK]2`` as ``42``)."""
        out = []
        for row in canvas.tolist():
            cut = next((i for i, t in enumerate(row) if t in self._stop_ids), len(row))
            row, parts, start = row[:cut], [], 0
            for i, t in enumerate(row):
                if t == self.mask_token_id:
                    parts.append(decode_ids(self.tokenizer, row[start:i]))
                    start = i + 1
            parts.append(decode_ids(self.tokenizer, row[start:]))
            out.append(UNFILLED.join(parts))
        return out

    # -- rewards ----------------------------------------------------------------------------------------
    def correctness(self, example, text: str) -> float:
        """The correctness reward of ``text`` for ``example`` (:attr:`CORRECT` when right)."""
        raise NotImplementedError

    def sft_answer(self, example) -> str | None:
        """The reference answer in the task's answer format (``None``: the task has none)."""
        return None

    def reference_solution(self, example) -> str | None:
        """:meth:`sft_answer` (DaGRPO's anchors)."""
        return self.sft_answer(example)

    def scored_correctness(self, example, text: str) -> float:
        """:meth:`correctness`, but 0 for a completion with an unfilled (mask) position
        (:data:`~dlmrl.rewards.extract.UNFILLED`): an unfinished canvas is never a right answer."""
        return 0.0 if UNFILLED in text else self.correctness(example, text)

    def is_correct(self, example, text: str) -> bool:
        return self.scored_correctness(example, text) == self.CORRECT

    def rewards(self, examples: Sequence, texts: Sequence[str]) -> list[float]:
        """Correctness plus the configured format components, one float per completion. The format
        components see the answer as the model wrote it: the template's assistant prefix (``d1_eval``'s
        ``<reasoning>``, placed in the prompt) and then the completion. A completion with an unfilled (mask)
        position (:data:`~dlmrl.rewards.extract.UNFILLED`) scores 0."""
        return [0.0 if UNFILLED in t else
                self.correctness(e, t) + sum(FORMAT_COMPONENTS[c](self.answer_prefix(e) + t) for c in self.format_rewards)
                for e, t in zip(examples, texts)]

    def answer_prefix(self, example) -> str:
        """The assistant prefix the prompt of ``example`` ends with (``""`` for most templates)."""
        return self.prompts["test" if example.split == "test" else "train"].assistant_prefix

    def metrics(self, examples: Sequence, texts: Sequence[str]) -> dict:
        """``accuracy`` (fraction of completions whose answer is correct), ``mean_reward``, ``num_examples``."""
        rewards = self.rewards(examples, texts)
        correct = [self.is_correct(e, t) for e, t in zip(examples, texts)]
        n = max(len(texts), 1)
        return {"accuracy": sum(correct) / n, "mean_reward": sum(rewards) / n, "num_examples": len(texts)}
