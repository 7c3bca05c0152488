"""The ``Task`` protocol every task implements, the batch it encodes to, and the ``TASKS`` registry.

A task turns examples into model inputs (a prompt and an initial canvas) and completions into rewards and
held-out metrics. Batches are deterministic functions of ``(seed, step)`` so that a resumed run sees exactly
the data an uninterrupted one would.

Adding a task (one module, plus one import line in :mod:`dlmrl.data` for a built-in one; a user's module is
imported by ``dlmrl train --import my_pkg.tasks`` or the ``dlmrl.plugins`` entry points instead):

1. Declare its settings as a frozen dataclass (every field with a default); its fields are the task's keys in
   YAML: ``task.options.<field>`` for any task, and the flat ``task.<field>`` where the field has the name of a
   :class:`~dlmrl.config.TaskConfig` key (``train_file``, ``prompt_template``, ...).
   Check a value where it is set (``__post_init__``) or in ``check_options``, raising
   :class:`dlmrl.errors.OptionError` ``(field, message)``: the config then names the key that set it
   (``task.options.<field>`` or ``task.<field>``) before any model loads.
2. Subclass :class:`Task`, set ``name`` and ``options_class``, write ``from_options`` and the abstract methods;
   override ``metrics``, ``primary_metric``, ``reference_solution``, ``check_options`` where the defaults do not
   fit. Keep its prompt templates in the same module (a text task's ``templates``).
3. Register it: ``@TASKS.register("my_task")`` on the class.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dlmrl.registry import Registry

__all__ = ["TASKS", "NoOptions", "Task", "TaskBatch"]


@dataclass
class TaskBatch:
    """Model inputs for a list of examples.

    Attributes:
        examples: the ``B`` examples.
        prompt_ids: ``(B, P)`` long, left-padded.
        prompt_mask: ``(B, P)`` bool, True on real prompt tokens.
        canvas: ``(B, L)`` long, the initial canvas (mask tokens where the model must write).
        completion_mask: ``(B, L)`` bool, the positions the model writes and the estimators score.
    """

    examples: list
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    canvas: torch.Tensor
    completion_mask: torch.Tensor

    def repeat(self, g: int) -> TaskBatch:
        """Each row repeated ``g`` times in place (a group of ``g`` completions per prompt)."""
        rep = lambda x: x.repeat_interleave(g, dim=0)
        return TaskBatch([e for e in self.examples for _ in range(g)], rep(self.prompt_ids),
                         rep(self.prompt_mask), rep(self.canvas), rep(self.completion_mask))


@dataclass(frozen=True)
class NoOptions:
    """The settings of a task that has none."""


class Task(ABC):
    """What the trainer, the evaluation and the anchors use of a task (the module docstring says how to add one).

    Class attributes:
        name: the registry name (``task.name``).
        options_class: the frozen dataclass of the task's settings (:meth:`options_class_for` may pick another
            by the settings, as Sudoku's text form does).
        refused_keys: flat ``task.<key>`` settings this task refuses outright, with the reason (the config check
            warns about other flat keys the options class does not have: they would be ignored).
        takes_reward_funcs: whether ``train.reward_funcs`` are this task's reward (the dataset task).

    Attributes (instances; class-level defaults here):
        gen_length: canvas length ``L`` in tokens.
        tokenizer: the ``transformers`` tokenizer the task encodes with (anchors tokenize references with it).
        options: the task's options object.
        primary_metric: the key of :meth:`metrics` that is the held-out headline number (logged as
            ``eval_<name>``; default ``mean_reward``).
        CORRECT: the reward of a fully right answer, for the rollout ``solve_rate``; ``None`` = no reward
            value means solved (no solve rate is logged).
        format_rewards: names of format components added to the correctness reward (when any, the sum no longer
            says which answers were right: :attr:`solved_reward` is ``None``).
        test_examples: the held-out split, a list of examples.
    """

    name: ClassVar[str] = ""
    options_class: ClassVar[type] = NoOptions
    refused_keys: ClassVar[dict[str, str]] = {}
    takes_reward_funcs: ClassVar[bool] = False

    gen_length: int
    tokenizer: Any
    options: Any = NoOptions()
    primary_metric: str = "mean_reward"
    CORRECT: float | None = 1.0
    format_rewards: tuple[str, ...] = ()

    # -- construction ----------------------------------------------------------------------------------
    @classmethod
    def options_class_for(cls, settings: Mapping[str, Any]) -> type:
        """The options class for ``settings`` (flat ``task.*`` values and ``task.options``): ``options_class``."""
        return cls.options_class

    @classmethod
    def check_options(cls, options) -> int | None:
        """Check ``options`` up front (before any model loads) and load the task's *local* data files.

        Returns:
            The number of held-out examples when known (0: the task has no held-out data), else ``None``
            (hub data, loaded by the run).
        Raises:
            ValueError: ``"task.<field>: <problem>"`` naming the setting (a bad record: the file, the line and the
                column).
        """
        return None

    @classmethod
    def check_policy(cls, options, kind, evaluates: bool) -> None:
        """Refuse, before any model loads, a policy kind the task cannot serve with these options.

        Args:
            kind: the policy kind of ``model.kind`` (:class:`dlmrl.kinds.PolicyKind`: its ``name`` and capabilities,
                e.g. ``autoregressive``). evaluates: whether the run evaluates on held-out data.
        Raises:
            OptionError: naming the setting (default: accepts every kind).
        """

    @classmethod
    def check_gen_length(cls, options, gen_length: int) -> None:
        """Refuse, before any model loads, a completion length (``sampling.gen_length``) the task's completions cannot
        fit in. Raises ``OptionError`` naming the setting (default: accepts every length)."""

    @classmethod
    @abstractmethod
    def from_options(cls, options, tokenizer, mask_token_id: int | None, gen_length: int | None = None,
                     **resources) -> Task:
        """The task of ``options`` (an instance of :meth:`options_class_for`'s class).

        Args:
            tokenizer: the policy's tokenizer. mask_token_id: the canvas token (``None`` for an AR policy).
            gen_length: ``sampling.gen_length``, the canvas length of tasks whose canvas is not fixed.
            resources: objects built outside the config (the dataset task's ``reward_functions``).
        """

    # -- data -------------------------------------------------------------------------------------------
    @abstractmethod
    def train_batch(self, n: int, seed: int, step: int) -> list:
        """The ``n`` training examples of ``step``: a function of ``(seed, step)`` only."""

    @abstractmethod
    def test_batch(self, n: int) -> list:
        """The first ``n`` held-out examples (raises ``ValueError`` when fewer exist)."""

    # -- encoding ---------------------------------------------------------------------------------------
    @abstractmethod
    def encode(self, examples: Sequence, device: str | torch.device = "cpu") -> TaskBatch:
        """The prompts and initial canvases of ``examples``: a :class:`TaskBatch`, ``(B, P)`` / ``(B, L)``."""

    @abstractmethod
    def decode(self, canvas: torch.Tensor) -> list[str]:
        """``(B, L)`` long completion tokens -> ``B`` completion texts, as :meth:`rewards` reads them."""

    # -- rewards and metrics ----------------------------------------------------------------------------
    @abstractmethod
    def rewards(self, examples: Sequence, texts: Sequence[str]) -> list[float]:
        """One float reward per completion (``texts[i]`` answers ``examples[i]``)."""

    def metrics(self, examples: Sequence, texts: Sequence[str]) -> dict:
        """Held-out metrics over a whole split; must hold :attr:`primary_metric`. Default: ``mean_reward`` and
        ``num_examples``."""
        rewards = self.rewards(examples, texts)
        return {"mean_reward": sum(rewards) / max(len(rewards), 1), "num_examples": len(texts)}

    def reference_solution(self, example) -> str | None:
        """The example's reference answer as completion text (DaGRPO's anchors), or ``None`` when it has none."""
        return None

    @property
    def solved_reward(self) -> float | None:
        """The reward that means "fully right" for the rollout ``solve_rate``: :attr:`CORRECT`, or ``None`` when
        format rewards are added (the sum then does not say which answers were right)."""
        if self.format_rewards or self.CORRECT is None:
            return None
        return float(self.CORRECT)


TASKS: Registry[type[Task]] = Registry("task")


def epoch_batch(items: Sequence, n: int, seed: int, step: int, salt: str) -> list:
    """The ``n`` items of training step ``step``: positions ``step·n .. step·n + n − 1`` of per-epoch permutations of
    ``items``, each shuffled by ``random.Random(f"{seed}-{salt}-{epoch}")`` (so a function of ``(seed, step)``: a
    resumed run sees the same data). ``items`` must not be empty."""
    out, orders = [], {}
    for k in range(step * n, step * n + n):
        epoch, pos = divmod(k, len(items))
        if epoch not in orders:
            orders[epoch] = list(range(len(items)))
            random.Random(f"{seed}-{salt}-{epoch}").shuffle(orders[epoch])
        out.append(items[orders[epoch][pos]])
    return out


def full_canvas_batch(task, examples: Sequence, prompts: Sequence[str], device: str | torch.device = "cpu") -> TaskBatch:
    """``[BOS] prompt`` per example (:func:`dlmrl.data.encoding.encode_prompts`) and a canvas of ``task.gen_length``
    positions, all written and scored: mask tokens (a diffusion policy's) or pad tokens (an AR policy's, which writes
    its own). ``task`` gives ``tokenizer``, ``gen_length``, ``mask_token_id`` and ``pad_token_id``."""
    from dlmrl.data.encoding import encode_prompts

    prompt_ids, prompt_mask = encode_prompts(task.tokenizer, list(prompts), device)
    fill = task.mask_token_id if task.mask_token_id is not None else task.pad_token_id
    canvas = torch.full((len(examples), task.gen_length), fill, dtype=torch.long, device=device)  # (B, L)
    return TaskBatch(list(examples), prompt_ids, prompt_mask, canvas, torch.ones_like(canvas, dtype=torch.bool))
