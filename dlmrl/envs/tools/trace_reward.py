"""MTR's composite trace reward: answer correctness plus internal consistency (arXiv 2510.06825).

MTR's abstract names the reward ("balances answer correctness and internal consistency") but not its
terms; this form is a **(dlmrl interpretation)**::

    R = w_ans * answer + w_cons * consistency,   consistency = (valid + observed + grounded) / 3

over a ReAct trace (:func:`~dlmrl.envs.tools.react.parse_trace`), with ``w_ans = 1.0``, ``w_cons = 0.2``:

- ``answer``: EM (or token F1, ``metric="f1"``) of the final answer against the gold
  (:mod:`~dlmrl.envs.tools.qa_metrics`); 0 without a final answer.
- ``valid``: the fraction of actions that parse (``name[{json}]``), name a declared tool and have
  schema-valid arguments (:meth:`ToolSet.check`).
- ``observed``: the fraction of actions followed by their observation: an ``Observation:`` in the same
  step; with a ``simulator``, it must also equal (up to whitespace) what the simulator answers to that
  action, so a completion that writes its own observations gets no credit for made-up ones.
- ``grounded``: 1 when the normalised final answer is a contiguous run of the normalised tokens of an
  observation that follows an action (one equal to the simulator's answer, when a simulator is given),
  not an error observation, of a tool other than those in ``ground_exclude`` (default ``search``: its result
  lists names matching the query, so a search for the answer, or for a common letter, would ground any name;
  dlmrl interpretation); with ``ground_in_thoughts=True`` thoughts count too (a weaker check: a policy can write
  any answer into a thought).

Edge cases: a trace **without actions** has ``valid = observed = 0`` and nothing to be grounded in, so
its consistency is 0; a trace **without a final answer** (or with an empty one) has ``answer = 0`` and
``grounded = 0``, but keeps the credit of its valid, observed actions. A complete correct trace scores
``w_ans + w_cons`` (1.2 by default).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from dlmrl.envs.tools.qa_metrics import exact_match, f1_score, normalize_answer
from dlmrl.envs.tools.react import Step, Trace, parse_trace
from dlmrl.envs.tools.simulator import ToolSimulator, is_error
from dlmrl.envs.tools.toolset import ToolSet
from dlmrl.rewards.extract import completion_text

__all__ = ["COMPONENTS", "MTRTraceReward", "TraceScore"]

#: the logged components of a :class:`TraceScore`, in the order of :meth:`TraceScore.parts`
COMPONENTS = ("answer", "consistency", "valid", "observed", "grounded")


@dataclass(frozen=True)
class TraceScore:
    """A trace's reward and its components (log them separately).

    Attributes:
        reward: ``w_ans * answer + w_cons * consistency``. answer: EM or F1 in [0, 1].
        consistency: the mean of ``valid``, ``observed``, ``grounded``. valid, observed: fractions of the
            actions (0 without actions). grounded: 0 or 1. n_actions: the number of ``Action:`` lines.
        final_answer: the final answer (``None`` when the trace has none).
    """

    reward: float
    answer: float
    consistency: float
    valid: float
    observed: float
    grounded: float
    n_actions: int
    final_answer: str | None

    def as_dict(self) -> dict:
        return asdict(self)

    def parts(self) -> tuple[float, ...]:
        """The components named by :data:`COMPONENTS` (answer, consistency, valid, observed, grounded)."""
        return tuple(float(getattr(self, name)) for name in COMPONENTS)


class MTRTraceReward:
    """The composite trace reward (formula and edge cases in the module docstring).

    Args:
        tools: the declared tools (a :class:`ToolSet`, or OpenAI declarations).
        w_ans, w_cons: the weights (1.0 and 0.2). metric: ``"em"`` or ``"f1"`` for the answer term.
        simulator: check observations against it (``observed`` and ``grounded``); ``None`` when the
            observations come from the environment itself, or when the simulator is not deterministic
            (an LLM): then an observation only has to be there.
        ground_in_thoughts: let a thought ground the answer as well as an observation.
        ground_exclude: tools whose observations never ground the answer (default ``("search",)``).
    Raises:
        ValueError: an unknown metric, or a negative weight.
    """

    def __init__(self, tools: ToolSet | Sequence[Mapping], w_ans: float = 1.0, w_cons: float = 0.2,
                 metric: str = "em", simulator: ToolSimulator | None = None, ground_in_thoughts: bool = False,
                 ground_exclude: tuple[str, ...] = ("search",)):
        if metric not in ("em", "f1"):
            raise ValueError(f"metric must be 'em' or 'f1', got {metric!r}")
        if w_ans < 0 or w_cons < 0:
            raise ValueError(f"weights must be >= 0, got w_ans={w_ans}, w_cons={w_cons}")
        self.tools = tools if isinstance(tools, ToolSet) else ToolSet(tools)
        self.w_ans, self.w_cons, self.metric = float(w_ans), float(w_cons), metric
        self.simulator, self.ground_in_thoughts = simulator, ground_in_thoughts
        self.ground_exclude = tuple(ground_exclude)

    def _observed(self, step: Step) -> bool:
        if step.observation is None:
            return False
        if self.simulator is None:
            return True
        return step.observation.split() == self.simulator.run(step.action).text.split()

    def score(self, trace: str | Trace, gold: str | Sequence[str]) -> TraceScore:
        """Score one trace (a string is parsed with :func:`parse_trace`; never raises on one).

        Args:
            trace: the trace text or a parsed :class:`Trace`. gold: the gold answer(s).
        Returns:
            :class:`TraceScore`.
        Raises:
            ValueError: an empty list of gold answers.
        """
        if not isinstance(gold, str) and not list(gold):
            raise ValueError("no gold answer")
        if isinstance(trace, str):
            trace = parse_trace(trace)
        acting = [s for s in trace.steps if s.action is not None]
        n = len(acting)
        valid = sum(a.ok and self.tools.check(a.name, a.arguments).ok for a in (s.action for s in acting))
        observed = [s for s in acting if self._observed(s)]
        sources = [s.observation for s in observed
                   if not is_error(s.observation) and s.action.name not in self.ground_exclude]
        if self.ground_in_thoughts:
            sources += [s.thought for s in trace.steps if s.thought]
        final = trace.final_answer
        answer = 0.0
        grounded = 0.0
        if final is not None:
            answer = (exact_match if self.metric == "em" else f1_score)(final, gold)
            grounded = float(_contains_run(final, sources))
        v, o = (valid / n, len(observed) / n) if n else (0.0, 0.0)
        consistency = (v + o + grounded) / 3
        return TraceScore(self.w_ans * answer + self.w_cons * consistency, answer, consistency, v, o, grounded,
                          n, final)

    def score_batch(self, completions: Sequence, answer: Sequence) -> list[TraceScore]:
        """:meth:`score` of each completion (a string or TRL's conversational form) against its gold."""
        return [self.score(completion_text(c), a) for c, a in zip(completions, answer, strict=True)]

    def __call__(self, prompts: Sequence, completions: Sequence, answer: Sequence, **_columns) -> list[float]:
        """TRL's reward shape ``f(prompts, completions, answer=..., **columns) -> list[float]``."""
        return [s.reward for s in self.score_batch(completions, answer)]


def _contains_run(answer: str, sources: Sequence[str]) -> bool:
    """Whether the normalised ``answer`` is a non-empty contiguous run of a normalised source's tokens."""
    want = normalize_answer(answer).split()
    if not want:
        return False
    k = len(want)
    for src in sources:
        toks = normalize_answer(src).split()
        if any(toks[i:i + k] == want for i in range(len(toks) - k + 1)):
            return True
    return False
