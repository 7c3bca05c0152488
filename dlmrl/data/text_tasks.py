"""GSM8K, MATH and Countdown as tasks: d1-format prompts, a canvas of ``gen_length`` masks, d1's rewards (arXiv 2504.12216).

Each task has the interface the trainer uses on :class:`~dlmrl.data.tasks.SudokuTask`: ``train_batch(n,
seed, step)``, ``test_batch(n)``, ``encode(examples, device) -> TaskBatch``, ``decode(canvas)``,
``rewards(examples, texts)``, ``gen_length``; plus ``metrics(examples, texts)`` and ``sft_answer`` where a
reference answer exists (GSM8K, MATH).

- **Prompt**: the example's user message from its split's template (:mod:`dlmrl.data.prompts`; training
  examples use ``task.prompt_template``, held-out ones ``task.test_prompt_template``), wrapped by the
  tokenizer's chat template when it has one (``task.chat_template``), left-padded.
- **Canvas**: ``gen_length`` mask tokens after the prompt (an AR policy without a mask token gets pad
  tokens there; it never reads them); every canvas position is written and scored.
- **Decoding**: up to the first end token (EOS, ``<|eot_id|>``, ``<|im_end|>``, ``<|endoftext|>``,
  ``<|end_of_text|>``: whichever the tokenizer has), special tokens skipped.
- **Rewards**: correctness (GSM8K 2.0, MATH 2.0, Countdown 1.0/0.1/0) plus the components named in
  ``task.format_rewards`` (:data:`dlmrl.rewards.format.FORMAT_COMPONENTS`; ``d1`` = d1's set per task).
- **Data order**: training examples in a fresh permutation per epoch, a function of (seed, epoch), so the
  batch of a step depends only on (seed, step) and a resumed run sees the same data.
"""

from __future__ import annotations

import random
import re
import warnings
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from dlmrl.data.encoding import left_pad, pad_token_id
from dlmrl.data.loading import DataError, is_local_file, load_records
from dlmrl.data.prompts import PromptTemplate, check_template, get_template, render_prompt, uses_chat_template
from dlmrl.data.tasks import TASKS, TaskBatch
from dlmrl.data.text_examples import countdown_examples, gsm8k_examples, math_examples
from dlmrl.rewards.countdown import CORRECT as COUNTDOWN_CORRECT
from dlmrl.rewards.countdown import countdown_score
from dlmrl.rewards.extract import UNFILLED
from dlmrl.rewards.format import FORMAT_COMPONENTS
from dlmrl.rewards.gsm8k import gsm8k_correctness
from dlmrl.rewards.math_reward import math_correctness
from dlmrl.rewards.math_verifier import MathVerifier, default_verifier

__all__ = ["CountdownTask", "GSM8KTask", "MathTask", "TextTask", "parse_format_rewards"]

_STOP_TOKENS = ("<|eot_id|>", "<|im_end|>", "<|endoftext|>", "<|end_of_text|>")
_CALCULATOR = re.compile(r"<<[^<>]*>>")  # GSM8K's calculator annotations, "<<48/2=24>>"


def parse_format_rewards(task: str, spec: str) -> tuple[str, ...]:
    """The format components ``spec`` names: ``none``, ``d1`` (d1's set for ``task``) or a comma list.

    Raises:
        ValueError: an unknown component name.
    """
    spec = spec.strip()
    if spec in ("", "none"):
        return ()
    if spec == "d1":
        return TASKS.get(task).D1_FORMAT_REWARDS
    names = tuple(s.strip() for s in spec.split(",") if s.strip())
    bad = [n for n in names if n not in FORMAT_COMPONENTS]
    if bad:
        raise ValueError(f"unknown format reward {bad[0]!r}; use none, d1 or a comma list of "
                         f"{', '.join(FORMAT_COMPONENTS)}")
    return names


class TextTask:
    """A task whose prompts and answers are text (the base of the GSM8K, MATH and Countdown tasks).

    Args:
        tokenizer: a ``transformers`` tokenizer.
        mask_token_id: the canvas token (``None`` for an AR policy: pad tokens instead).
        gen_length: canvas length ``L`` in tokens.
        train_examples, test_examples: the examples (``from_config`` loads them lazily instead).
        prompt_template, test_prompt_template: template names or format strings (``None``: the training one).
        chat_template: ``auto`` | ``on`` | ``off``.
        format_rewards: ``none`` | ``d1`` | comma list of format components added to the reward.

    Raises:
        ValueError: a bad template, chat template setting or format reward name.
    """

    name = ""
    primary_metric = "accuracy"  # the held-out headline metric (dlmrl.training.evaluation)
    CORRECT = 1.0  # the correctness reward of a right answer
    D1_FORMAT_REWARDS: tuple[str, ...] = ()
    #: hub defaults: dataset, subset, split, test_dataset, test_split
    DEFAULTS: ClassVar[dict[str, str | None]] = {}
    converter = staticmethod(lambda records, split: [])

    def __init__(self, tokenizer, mask_token_id: int | None, gen_length: int = 256, train_examples=None,
                 test_examples=None, prompt_template: str = "d1", test_prompt_template: str | None = None,
                 chat_template: str = "auto", format_rewards: str = "none"):
        if gen_length < 1:
            raise ValueError(f"gen_length must be >= 1, got {gen_length}")
        if chat_template not in ("auto", "on", "off"):
            raise ValueError(f"chat_template must be auto, on or off, got {chat_template!r}")
        self.tokenizer, self.mask_token_id, self.gen_length = tokenizer, mask_token_id, gen_length
        self.templates: dict[str, PromptTemplate] = {
            "train": get_template(self.name, prompt_template),
            "test": get_template(self.name, test_prompt_template or prompt_template),
        }
        self.chat = uses_chat_template(tokenizer, chat_template)
        self.format_rewards = parse_format_rewards(self.name, format_rewards)
        self._train, self._test = train_examples, test_examples
        self._loaders: dict[str, Any] = {}
        self._orders: dict[tuple[int, int], list[int]] = {}
        vocab = tokenizer.get_vocab()
        self._stop_ids = {i for i in [tokenizer.eos_token_id] + [vocab.get(t) for t in _STOP_TOKENS] if i is not None}
        self.pad_token_id = pad_token_id(tokenizer)

    # -- construction from a TaskConfig ------------------------------------------------------------
    @classmethod
    def sources(cls, cfg) -> dict[str, tuple[str, str, str | None, str]]:
        """``{"train": (source, split, subset, key), "test": (...)}`` from ``cfg`` and the task's defaults;
        ``key`` is the config field that chose the source (for error messages)."""
        d = cls.DEFAULTS
        default_subset = cfg.subset if cfg.subset is not None else d.get("subset")

        def subset_of(source: str) -> str | None:  # (naming the default set explicitly keeps its subset)
            defaults = (d["dataset"], d.get("test_dataset"))
            return default_subset if source in defaults else cfg.subset

        if cfg.train_file:
            train = (cfg.train_file, "train", None, "task.train_file")
        elif cfg.dataset:
            train = (cfg.dataset, cfg.split or d["split"], subset_of(cfg.dataset), "task.dataset")
        else:
            train = (d["dataset"], cfg.split or d["split"], default_subset, "task.dataset")
        test_split = cfg.test_split or d["test_split"]
        if cfg.test_file:
            test = (cfg.test_file, "train", None, "task.test_file")
        elif cfg.test_dataset or cfg.dataset:
            key = "task.test_dataset" if cfg.test_dataset else "task.dataset"
            test = (cfg.test_dataset or cfg.dataset, test_split, subset_of(cfg.test_dataset or cfg.dataset), key)
        else:
            test = (d.get("test_dataset") or d["dataset"], test_split, default_subset, "task.test_dataset")
        return {"train": train, "test": test}

    @classmethod
    def load_split(cls, cfg, which: str) -> list:
        """Load and check the examples of ``which`` (``train`` or ``test``) as ``cfg`` describes.

        Raises:
            DataError: ``"task.<field>: <file> line N: field '<column>': ..."`` for the first bad record (the
                file or dataset, the line or row, the column), or a source or split that cannot be read.
        """
        source, split, subset, key = cls.sources(cfg)[which]
        if is_local_file(source) and not split.startswith("train"):
            split_key = "task.split" if which == "train" else "task.test_split"
            raise DataError(f"{split_key}: {source} is a single file, whose only split is 'train'; got "
                            f"{split!r} (slice it, e.g. 'train[-500:]', or set task.test_file)")
        try:
            records = load_records(source, split, subset, cfg.cache_dir, cfg.num_proc)
            examples = cls.convert(cfg, records, which)
            return cls.filter_examples(cfg, examples, f"{source} (split {split!r})")
        except DataError as e:
            raise DataError(f"{key}: {e}") from None

    @classmethod
    def convert(cls, cfg, records, which: str) -> list:
        """The examples of loaded ``records`` (a :class:`~dlmrl.data.loading.Records`): the task's ``converter``
        (a task whose conversion reads ``cfg``, such as the dataset task's prompt column, overrides this)."""
        return cls.converter(records, which)

    @classmethod
    def filter_examples(cls, cfg, examples: list, where: str) -> list:
        if not examples:
            raise DataError(f"{where}: no examples")
        return examples

    @classmethod
    def check_text_config(cls, cfg) -> None:
        """The prompt templates, chat template and format rewards of ``cfg``. Raises ``ValueError`` naming
        the field."""
        for key, template in (("prompt_template", cfg.prompt_template),
                              ("test_prompt_template", cfg.test_prompt_template)):
            if template is not None and (problem := check_template(cls.name, template)) is not None:
                raise ValueError(f"task.{key}: {problem}")
        if cfg.chat_template not in ("auto", "on", "off"):
            raise ValueError(f"task.chat_template: must be auto, on or off, got {cfg.chat_template!r}")
        try:
            parse_format_rewards(cls.name, cfg.format_rewards)
        except ValueError as e:
            raise ValueError(f"task.format_rewards: {e}") from None

    @classmethod
    def check_config(cls, cfg) -> int | None:
        """Check ``cfg``'s task fields and load its *local* data files (hub data is loaded by the run).

        Returns the number of held-out examples when they come from a local file, else ``None``.

        Raises:
            ValueError: naming the field (``DataError`` for a bad record).
        """
        cls.check_text_config(cfg)
        test_size = None
        for which, (source, _, _, _) in cls.sources(cfg).items():
            if is_local_file(source):
                n = len(cls.load_split(cfg, which))
                test_size = n if which == "test" else test_size
        return test_size

    @classmethod
    def from_config(cls, cfg, tokenizer, mask_token_id: int | None, gen_length: int | None = None, **kwargs):
        """The task ``cfg`` (a :class:`~dlmrl.config.TaskConfig`) describes; data is loaded on first use."""
        task = cls(tokenizer, mask_token_id, gen_length=gen_length or 256, prompt_template=cfg.prompt_template,
                   test_prompt_template=cfg.test_prompt_template, chat_template=cfg.chat_template,
                   format_rewards=cfg.format_rewards, **kwargs)
        task._loaders = {which: (lambda which=which: cls.load_split(cfg, which)) for which in ("train", "test")}
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
        template = self.templates["test" if example.split == "test" else "train"]
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
                    parts.append(self.tokenizer.decode(row[start:i], skip_special_tokens=True))
                    start = i + 1
            parts.append(self.tokenizer.decode(row[start:], skip_special_tokens=True))
            out.append(UNFILLED.join(parts))
        return out

    # -- rewards ----------------------------------------------------------------------------------------
    def correctness(self, example, text: str) -> float:
        raise NotImplementedError

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
        return self.templates["test" if example.split == "test" else "train"].assistant_prefix

    def metrics(self, examples: Sequence, texts: Sequence[str]) -> dict:
        """``accuracy`` (fraction of completions whose answer is correct), ``mean_reward``, ``num_examples``."""
        rewards = self.rewards(examples, texts)
        correct = [self.is_correct(e, t) for e, t in zip(examples, texts)]
        n = max(len(texts), 1)
        return {"accuracy": sum(correct) / n, "mean_reward": sum(rewards) / n, "num_examples": len(texts)}


@TASKS.register("gsm8k")
class GSM8KTask(TextTask):
    """GSM8K grade-school math (``openai/gsm8k``): 2.0 for the right final number; d1's format rewards optional."""

    name = "gsm8k"
    CORRECT = 2.0
    D1_FORMAT_REWARDS = ("xmlcount", "soft_format", "strict_format", "int_format")
    DEFAULTS: ClassVar[dict[str, str | None]] = {"dataset": "openai/gsm8k", "subset": "main", "split": "train", "test_split": "test"}
    converter = staticmethod(gsm8k_examples)

    def correctness(self, example, text: str) -> float:
        return gsm8k_correctness(text, example.answer)

    def sft_answer(self, example) -> str:
        """d1's format around GSM8K's worked solution (calculator annotations removed) and the final answer."""
        reasoning = _CALCULATOR.sub("", example.solution).strip()
        return f"<reasoning>\n{reasoning}\n</reasoning>\n<answer>\n{example.answer}\n</answer>"


@TASKS.register("math")
class MathTask(TextTask):
    """MATH (train: ``ankner/math-500`` train, d1's; test: ``HuggingFaceH4/MATH-500``): 2.0 when math-verify
    finds the last ``\\boxed{}`` equal to the answer."""

    name = "math"
    CORRECT = 2.0
    D1_FORMAT_REWARDS = ("boxed_in_answer",)
    DEFAULTS: ClassVar[dict[str, str | None]] = {"dataset": "ankner/math-500", "subset": None, "split": "train",
                "test_dataset": "HuggingFaceH4/MATH-500", "test_split": "test"}
    converter = staticmethod(math_examples)

    def __init__(self, *args, verifier: MathVerifier | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.verifier = verifier

    @classmethod
    def from_config(cls, cfg, tokenizer, mask_token_id, gen_length=None, **kwargs):
        verifier = kwargs.pop("verifier", None) or default_verifier(cfg.verify_timeout, cfg.verify_workers)
        return super().from_config(cfg, tokenizer, mask_token_id, gen_length, verifier=verifier, **kwargs)

    def correctness(self, example, text: str) -> float:
        return math_correctness(text, example.answer, self.verifier)

    @classmethod
    def check_config(cls, cfg) -> int | None:
        """As :meth:`TextTask.check_config`, and warn about the gold answers of local files that math-verify cannot
        read as math (they score 0 for every completion), naming the file and line.

        Warns:
            UserWarning: listing the first such records.
        """
        cls.check_text_config(cfg)
        test_size = None
        verifier = None
        for which, (source, _, _, key) in cls.sources(cfg).items():
            if not is_local_file(source):
                continue
            examples = cls.load_split(cfg, which)
            test_size = len(examples) if which == "test" else test_size
            verifier = verifier or default_verifier(cfg.verify_timeout, cfg.verify_workers)
            bad = [e for e in examples if not verifier.parsable(e.answer)]
            if bad:
                shown = "; ".join(f"{e.where}: {e.answer[:40]!r}" for e in bad[:5])
                warnings.warn(f"{key}: {len(bad)} of {len(examples)} gold answers are not math that math-verify can "
                              f"parse, so they score 0 for every completion: {shown}"
                              f"{' ...' if len(bad) > 5 else ''}", UserWarning, stacklevel=2)
        return test_size

    def sft_answer(self, example) -> str:
        """d1's format around MATH's worked solution and the boxed answer."""
        return (f"<reasoning>\n{example.solution.strip()}\n</reasoning>\n<answer>\n\\boxed{{{example.answer}}}\n"
                "</answer>")


@TASKS.register("countdown")
class CountdownTask(TextTask):
    """Countdown (``Jiayi-Pan/Countdown-Tasks-3to4``; d1's test JSONL as ``test_file``): 1.0 for an expression
    that uses each number once and hits the target, 0.1 for a wrong one, 0 for none."""

    name = "countdown"
    CORRECT = COUNTDOWN_CORRECT
    DEFAULTS: ClassVar[dict[str, str | None]] = {"dataset": "Jiayi-Pan/Countdown-Tasks-3to4", "subset": None, "split": "train[:-500]",
                "test_split": "train[-500:]"}
    converter = staticmethod(countdown_examples)

    @classmethod
    def filter_examples(cls, cfg, examples: list, where: str) -> list:
        k = cfg.num_numbers
        kept = [e for e in examples if len(e.nums) == k] if k else examples
        if not kept:
            raise DataError(f"{where}: no examples{f' with {k} numbers (task.num_numbers)' if k else ''}")
        return kept

    def correctness(self, example, text: str) -> float:
        return countdown_score(text, example.nums, example.target)
