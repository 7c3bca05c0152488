"""Multi-hop QA with simulated tools as a task (``task.name: multihop``): MTR's pipeline (arXiv 2510.06825).

Questions of 2 and 3 hops over a seeded synthetic knowledge base (:mod:`dlmrl.envs.tools`), split by entity so
that no test topic, intermediate entity or answer appears in training; the policy answers by calling the
simulated ``lookup``/``search`` tools in ReAct traces, scored by the MTR composite trace reward
``R = w_ans · EM (or F1) + w_cons · consistency`` (:class:`~dlmrl.envs.tools.trace_reward.MTRTraceReward`).

Two forms of the same task:

- **Single sequence** (``grpo`` and the other single-turn presets): the prompt is ``"Question: ...\\n"`` and the
  completion the whole trace, observations included, as MTR's Stage 2 scores complete traces. The policy writes
  its own observations there, so the reward *re-simulates* every action and credits an observation (the
  ``observed`` term, and the grounding of the answer) only when it equals the simulator's answer to that action
  **(dlmrl interpretation)**: a made-up observation earns nothing, and a right answer read from one is still
  right (``answer``) but not grounded.
- **Episodes** (``flow_grpo``; AgentFlow arXiv 2510.05592): the ``multihop`` environment (the task's
  ``context`` mode: ``react``, the whole transcript, or ``memory``, the question and a compact memory of earlier
  actions) plays one turn per policy response and appends the simulator's observation itself; the trajectory's
  final reward goes to every turn.

**Held-out evaluation plays episodes** (``task.options.eval_mode: episodes``, the default): the test questions are
about entities the policy never saw, so only the simulator can tell it their facts; a single-sequence decode
(``eval_mode: sequence``) would score the policy's guesses at observations, which are wrong on test entities by
construction. Each held-out question is one greedy episode in the ``context`` mode of at most ``max_turns`` turns
of ``turn_length`` new tokens (:func:`dlmrl.training.episodes.evaluate_episodes`) **(dlmrl interpretation)**.

Metrics (:meth:`MultiHopTask.metrics`, fractions in [0, 1]): ``em`` (primary) and ``f1`` of the final answer,
``tool_call_validity`` (valid actions / all actions over the split), ``answered`` (traces with a final answer),
the reward's components averaged over the traces (``consistency``, ``valid``, ``observed``, ``grounded``),
``mean_reward`` and ``mean_actions``. Rollouts log each component as ``rewards/<component>/mean`` and ``/std``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

import torch

from dlmrl.data.encoding import decode_to_eos, pad_token_id
from dlmrl.data.task import TASKS, Task, TaskBatch, epoch_batch, full_canvas_batch
from dlmrl.envs.tools.agent import ScriptedAgent
from dlmrl.envs.tools.env import MODES
from dlmrl.envs.tools.knowledge_base import KnowledgeBase
from dlmrl.envs.tools.multihop import MultiHopQuestion, split_questions
from dlmrl.envs.tools.qa_metrics import exact_match, f1_score
from dlmrl.envs.tools.react import format_prompt
from dlmrl.envs.tools.simulator import ToolSimulator
from dlmrl.envs.tools.trace_reward import COMPONENTS, MTRTraceReward, TraceScore
from dlmrl.errors import OptionError
from dlmrl.rewards.functions import RewardFunctions

__all__ = ["EVAL_MODES", "MultiHopOptions", "MultiHopTask", "TraceComponent", "multihop_tokenizer", "trace_metrics"]

EVAL_MODES = ("episodes", "sequence")


def multihop_tokenizer():
    """The tiny tool-use models' tokenizer: the trace pieces (:func:`~dlmrl.envs.tools.pieces.trace_pieces`) over
    the text character alphabet (:func:`~dlmrl.models.tokenizer.build_piece_tokenizer`; Sudoku's ids kept)."""
    from dlmrl.envs.tools.pieces import trace_pieces
    from dlmrl.models.tokenizer import build_piece_tokenizer

    return build_piece_tokenizer(trace_pieces())


@dataclass(frozen=True)
class MultiHopOptions:
    """The multi-hop task's settings (``task.options.<field>``).

    Attributes:
        kb_seed: the knowledge base's seed. kb_scale: entities per type as a multiple of the knowledge base's
            defaults (48 people, 24 cities, 8 countries, 32 films, 16 books, 16 companies); 16 gives 3,665 training
            questions, enough that a tiny model must learn to copy names rather than memorise the answers.
            ``test_fraction`` of each type is held out.
        hops: the hop counts of the questions (each 1..3). question_seed: the questions' shuffle seed.
        n_train, n_test: at most this many questions per split, the first of each (0: all; by default the first
            200 held-out questions).
        context: the episodes' context mode, ``react`` (the transcript) or ``memory`` (question + memory): the
            ``multihop`` environment's (flow_grpo's default ``train.env``) and the held-out episodes'.
        w_ans, w_cons: the reward's weights (MTR's composite; ``w_cons: 0`` is the answer-only reward).
        metric: the answer term, ``em`` or ``f1``.
        eval_mode: ``episodes`` (held-out questions played against the simulator, greedy) or ``sequence`` (one
            greedy completion per question, scored as in training; see the module docstring).
        max_turns, turn_length: the held-out episodes' turn limit and new tokens per turn.
    """

    kb_seed: int = 0
    kb_scale: float = 16.0
    test_fraction: float = 0.25
    hops: list[int] = field(default_factory=lambda: [2, 3])
    question_seed: int = 0
    n_train: int = 0
    n_test: int = 200
    context: str = "react"
    w_ans: float = 1.0
    w_cons: float = 0.2
    metric: str = "em"
    eval_mode: str = "episodes"
    max_turns: int = 5
    turn_length: int = 64


_BASE_SIZES = {"person": 48, "city": 24, "country": 8, "film": 32, "book": 16, "company": 16}


def _check(ok: bool, key: str, problem: str) -> None:
    if not ok:  # (the field: the config names the key that set it, task.options.<field> or task.<field>)
        raise OptionError(key, f"{key}: {problem}")


def check_multihop_options(o: MultiHopOptions) -> None:
    """Raises :class:`~dlmrl.errors.OptionError` naming the field of a bad setting."""
    _check(o.kb_scale > 0, "kb_scale", f"must be > 0, got {o.kb_scale}")
    _check(0 < o.test_fraction < 1, "test_fraction", f"must be in (0, 1), got {o.test_fraction}")
    _check(bool(o.hops) and all(isinstance(h, int) and 1 <= h <= 3 for h in o.hops), "hops",
           f"a list of hop counts in 1..3, got {o.hops!r}")
    _check(o.n_train >= 0, "n_train", f"must be >= 0 (0: all), got {o.n_train}")
    _check(o.n_test >= 0, "n_test", f"must be >= 0 (0: all), got {o.n_test}")
    _check(o.context in MODES, "context", f"must be one of {MODES}, got {o.context!r}")
    _check(o.w_ans >= 0, "w_ans", f"must be >= 0, got {o.w_ans}")
    _check(o.w_cons >= 0, "w_cons", f"must be >= 0, got {o.w_cons}")
    _check(o.w_ans + o.w_cons > 0, "w_ans", "w_ans and w_cons must not both be 0")
    _check(o.metric in ("em", "f1"), "metric", f"must be 'em' or 'f1', got {o.metric!r}")
    _check(o.eval_mode in EVAL_MODES, "eval_mode", f"must be one of {EVAL_MODES}, got {o.eval_mode!r}")
    _check(o.max_turns >= 1, "max_turns", f"must be >= 1, got {o.max_turns}")
    _check(o.turn_length >= 1, "turn_length", f"must be >= 1, got {o.turn_length}")


def build_world(o: MultiHopOptions) -> tuple[KnowledgeBase, dict[str, list[MultiHopQuestion]]]:
    """The knowledge base and the ``{"train", "test"}`` questions of ``o`` (deterministic)."""
    sizes = {t: max(2, round(n * o.kb_scale)) for t, n in _BASE_SIZES.items()}
    kb = KnowledgeBase.generate(o.kb_seed, sizes, o.test_fraction)
    qs = split_questions(kb, tuple(o.hops), seed=o.question_seed)
    for split, n in (("train", o.n_train), ("test", o.n_test)):
        if n:
            qs[split] = qs[split][:n]
    return kb, qs


class TraceComponent:
    """One component of the trace reward as a reward function of TRL's shape (``__name__`` is the component), so
    that :class:`~dlmrl.rewards.functions.RewardFunctions` names, weighs and logs it."""

    def __init__(self, reward: MTRTraceReward, name: str):
        self.reward, self.__name__ = reward, name

    def __call__(self, prompts, completions, answer, **_columns) -> list[float]:
        return [getattr(s, self.__name__) for s in self.reward.score_batch(completions, answer)]


def trace_metrics(examples: Sequence[MultiHopQuestion], scores: Sequence[TraceScore]) -> dict:
    """The task's held-out metrics over a split from each trace's score (module docstring)."""
    n = max(len(scores), 1)
    finals = [s.final_answer for s in scores]
    em = [exact_match(f, e.answer) if f is not None else 0.0 for f, e in zip(finals, examples)]
    f1 = [f1_score(f, e.answer) if f is not None else 0.0 for f, e in zip(finals, examples)]
    actions = sum(s.n_actions for s in scores)
    valid_actions = sum(s.valid * s.n_actions for s in scores)
    out = {"em": sum(em) / n, "f1": sum(f1) / n,
           "tool_call_validity": valid_actions / actions if actions else 0.0,
           "answered": sum(f is not None for f in finals) / n, "mean_reward": sum(s.reward for s in scores) / n,
           "mean_actions": actions / n}
    for name in COMPONENTS[1:]:
        out[name] = sum(getattr(s, name) for s in scores) / n
    out["num_examples"] = len(scores)
    return out


@TASKS.register("multihop")
class MultiHopTask(Task):
    """Multi-hop QA with simulated tools (module docstring).

    Args:
        tokenizer: a tokenizer covering the traces' characters (the tiny models': :func:`multihop_tokenizer`). mask_token_id: the canvas token (``None``: AR).
        gen_length: the single-sequence canvas (the whole trace) and, in episodes, each turn's budget.
        options: :class:`MultiHopOptions`; ``settings``: fields of it to change.
        answer_fn: a user's simulator ``answer_fn(name, arguments) -> str`` (e.g. an LLM as MTR's ToolActor) in
            place of the knowledge base's answers (the questions and gold answers still come from it).
    Attributes:
        kb, simulator: the knowledge base and the simulated tools (the environments read ``simulator``).
        trace_reward: the episodes' reward (their observations are the simulator's). sequence_reward: the
            single-sequence reward (re-simulates every action). context: the episodes' mode.
        reward_functions: the components as reward functions, weighted ``w_ans``, ``w_cons``, 0, 0, 0.
    Raises:
        ValueError: a bad option (naming ``task.options.<field>``).
    """

    name = "multihop"
    options_class = MultiHopOptions
    primary_metric = "em"
    #: the flat task.* keys this task does not read
    refused_keys: ClassVar[dict[str, str]] = {k: "the multihop task generates its questions; set task.options.* instead"
                                              for k in ("train_file", "test_file")}

    def __init__(self, tokenizer, mask_token_id: int | None, gen_length: int = 160,
                 options: MultiHopOptions | None = None, answer_fn=None, **settings):
        self.options = o = replace(options or MultiHopOptions(), **settings)
        check_multihop_options(o)
        if gen_length < 1:
            raise ValueError(f"gen_length must be >= 1, got {gen_length}")
        self.tokenizer, self.mask_token_id, self.gen_length = tokenizer, mask_token_id, gen_length
        self.kb, questions = build_world(o)
        self.train_examples, self.test_examples = questions["train"], questions["test"]
        self.simulator = ToolSimulator(kb=self.kb, answer_fn=answer_fn)
        self.context = o.context
        self.trace_reward = MTRTraceReward(self.simulator.tools, o.w_ans, o.w_cons, o.metric)
        self.sequence_reward = MTRTraceReward(self.simulator.tools, o.w_ans, o.w_cons, o.metric,
                                              simulator=self.simulator)
        self.reward_functions = RewardFunctions([TraceComponent(self.sequence_reward, c) for c in COMPONENTS],
                                                [o.w_ans, o.w_cons, 0.0, 0.0, 0.0], "task.options")
        self.CORRECT = o.w_ans + o.w_cons  # (a complete, correct, grounded trace)
        self.pad_token_id = pad_token_id(tokenizer)
        unknown = getattr(tokenizer, "unk_token_id", None)
        first = (self.train_examples or self.test_examples)[:1]
        text = "".join(format_prompt(q.question) + self.reference_solution(q) for q in first)
        if unknown is not None and unknown in tokenizer(text, add_special_tokens=False)["input_ids"]:
            raise ValueError("the tokenizer does not cover the multihop traces' characters (it writes the unknown "
                             "token); use a tokenizer with ASCII letters and JSON punctuation (the tiny models': "
                             "dlmrl.data.multihop_task.multihop_tokenizer)")

    @classmethod
    def check_options(cls, options: MultiHopOptions) -> int:
        """The options, and the number of held-out questions."""
        check_multihop_options(options)
        return len(build_world(options)[1]["test"])

    @classmethod
    def from_options(cls, options, tokenizer, mask_token_id: int | None, gen_length: int | None = None,
                     **resources) -> MultiHopTask:
        """The task with a canvas of ``gen_length`` tokens (``sampling.gen_length``; 160 when ``None``)."""
        return cls(tokenizer, mask_token_id, gen_length or 160, options, **resources)

    def in_context(self, mode: str) -> MultiHopTask:
        """A shallow copy playing its episodes in context ``mode`` (the same world, simulator and rewards)."""
        _check(mode in MODES, "context", f"must be one of {MODES}, got {mode!r}")
        other = copy.copy(self)
        other.options, other.context = replace(self.options, context=mode), mode
        return other

    @classmethod
    def check_policy(cls, options: MultiHopOptions, kind, evaluates: bool) -> None:
        """Episode evaluation plays the held-out questions with the policy's ``generate`` (an AR policy): a diffusion
        policy that evaluates needs ``eval_mode: sequence``."""
        _check(not (evaluates and not kind.autoregressive and options.eval_mode == "episodes"), "eval_mode",
               f"'episodes' plays the held-out questions turn by turn with an AR policy; model.kind {kind!r} decodes "
               "one sequence per question: set task.options.eval_mode: sequence (or turn held-out evaluation off: "
               "eval.before: false, eval.after: false, eval.eval_steps: 0)")

    @property
    def evaluates_episodes(self) -> bool:
        """Whether held-out evaluation plays episodes (``eval_mode: episodes``) rather than decoding one sequence."""
        return self.options.eval_mode == "episodes"

    # -- data ---------------------------------------------------------------------------------------------
    def train_batch(self, n: int, seed: int, step: int) -> list[MultiHopQuestion]:
        """Positions ``step·n .. step·n + n − 1`` of per-epoch permutations of the training questions, each
        permutation a function of ``(seed, epoch)`` (so of ``(seed, step)``: resumes see the same data)."""
        qs = self.train_examples
        if not qs:
            raise ValueError("the multihop task has no training questions (raise task.options.kb_scale)")
        return epoch_batch(qs, n, seed, step, "multihop")

    def test_batch(self, n: int) -> list[MultiHopQuestion]:
        """The first ``n`` held-out questions (``ValueError`` when fewer exist)."""
        if n > len(self.test_examples):
            raise ValueError(f"asked for {n} held-out questions, the multihop test split has {len(self.test_examples)}")
        return self.test_examples[:n]

    # -- encoding -----------------------------------------------------------------------------------------
    def encode(self, examples: Sequence[MultiHopQuestion], device: str | torch.device = "cpu") -> TaskBatch:
        """``[BOS] Question: ...\\n`` prompts (as the episodes encode their observations) and ``gen_length`` canvas
        positions, all written and scored."""
        return full_canvas_batch(self, examples, [format_prompt(e.question) for e in examples], device)

    def decode(self, canvas: torch.Tensor) -> list[str]:
        """``(B, L)`` long completion tokens -> texts up to the first EOS, special tokens skipped."""
        return decode_to_eos(self.tokenizer, canvas)

    # -- rewards and metrics ------------------------------------------------------------------------------
    def scores(self, examples: Sequence[MultiHopQuestion], texts: Sequence[str]) -> list[TraceScore]:
        """The single-sequence score of each completion (re-simulated observations)."""
        return [self.sequence_reward.score(t, e.answer) for e, t in zip(examples, texts, strict=True)]

    def rewards(self, examples: Sequence[MultiHopQuestion], texts: Sequence[str]) -> list[float]:
        """The MTR trace reward of each whole-trace completion."""
        return [s.reward for s in self.scores(examples, texts)]

    def reward_table(self, examples: Sequence[MultiHopQuestion], texts: Sequence[str]) -> torch.Tensor:
        """``(B, 5)`` float32: answer, consistency, valid, observed, grounded (the trainer logs each and combines
        them with ``w_ans``, ``w_cons``, 0, 0, 0 into the reward)."""
        return torch.tensor([s.parts() for s in self.scores(examples, texts)], dtype=torch.float32).reshape(
            len(texts), len(COMPONENTS))

    def metrics(self, examples: Sequence[MultiHopQuestion], texts: Sequence[str]) -> dict:
        """The held-out metrics of single-sequence completions (:func:`trace_metrics`)."""
        return trace_metrics(examples, self.scores(examples, texts))

    def episode_metrics(self, examples: Sequence[MultiHopQuestion], envs: Sequence) -> dict:
        """The held-out metrics of played episodes (:func:`trace_metrics` of each ended environment's ``score``)."""
        return trace_metrics(examples, [env.score for env in envs])

    def reference_solution(self, example: MultiHopQuestion) -> str:
        """The scripted agent's complete trace (DaGRPO's anchors; the SFT target)."""
        return ScriptedAgent(self.simulator).completion(example)
