"""Tool-use episodes: the policy thinks and acts, the simulator observes, until a final answer.

Each turn the policy writes a thought and an action (``Thought: ...`` / ``Action: tool[{json}]``);
the environment answers the action with the :class:`ToolSimulator` and builds the next turn's prompt.
The episode ends at the first ``Final Answer:`` or after ``max_turns`` turns; the last turn's reward is
the :class:`MTRTraceReward` of the whole trajectory (every earlier turn's reward is 0), which Flow-GRPO
(AgentFlow, arXiv 2510.05592) broadcasts to every turn. Two context modes:

- ``"react"``: the full transcript (ReAct, arXiv 2210.03629, as MTR arXiv 2510.06825 trains it): the
  question, then every turn's text followed by its ``Observation:``.
- ``"memory"``: AgentFlow-style, each turn's prompt is the question plus a compact memory of the
  earlier actions and their observations, one line each (``- lookup[{...}] -> Kavoni``), without the
  thoughts **(dlmrl interpretation of AgentFlow's evolving memory)**.

A turn's text is read up to its first action or final answer (a policy's own ``Observation:`` and
anything after it are dropped, as a ReAct stop sequence would); only its first action runs. A turn
with neither gets the error observation :data:`NO_ACTION`. The reward scores the environment's
structured record (:attr:`ToolEnv.trace`: the turns' parsed steps and the simulator's observations),
never the transcript re-parsed, so a policy cannot forge an observation.
"""

from __future__ import annotations

from dataclasses import replace

from dlmrl.envs.base import ENVS, StepResult
from dlmrl.envs.tools.react import Step, Trace, format_prompt, parse_trace, sections
from dlmrl.envs.tools.simulator import ERROR_PREFIX, ToolSimulator
from dlmrl.envs.tools.trace_reward import MTRTraceReward, TraceScore

__all__ = ["MODES", "NO_ACTION", "MultiHopEnv", "MultiHopMemoryEnv", "MultiHopReactEnv", "ToolEnv", "cut_turn",
           "turn_end"]

MODES = ("react", "memory")
NO_ACTION = f"{ERROR_PREFIX} no action; write Action: tool[{{json arguments}}] or Final Answer: <answer>"


def cut_turn(text: str) -> str:
    """The part of a turn's text the environment reads: up to the end of its first ``Action:`` section or
    first ``Final Answer:`` line, or up to its first ``Observation:``, whichever comes first; right-stripped."""
    cut = len(text)
    for sec in sections(text):
        if sec.kind == "Observation":
            cut = sec.start
            break
        if sec.kind in ("Action", "Final Answer"):
            cut = sec.end
            break
    return text[:cut].rstrip()


def turn_end(text: str) -> int | None:
    """Where a turn being written ends, once it has (a ReAct stop rule): the end of the line of its first
    ``Action:`` (the call's closing line; the newline included), the end of the line of its first ``Final Answer:``
    (newline included), or the start of an ``Observation:`` the policy began writing itself (which is cut, as a
    stop sequence would). ``None`` while the turn may still go on (no such section yet, or its line is not
    finished). :func:`cut_turn` of the text up to this point keeps exactly the turn."""
    for sec in sections(text):
        if sec.kind == "Observation":
            return sec.start
        if sec.kind == "Action":
            newline = text.find("\n", sec.start)
            return None if newline < 0 else newline + 1
        if sec.kind == "Final Answer":  # (its section ends at its line's newline, or at the end of the text)
            return sec.end + 1 if sec.end < len(text) else None
    return None


class ToolEnv:
    """One tool-use episode on a question (an example with ``question`` and ``answer`` attributes, e.g. a
    :class:`~dlmrl.envs.tools.multihop.MultiHopQuestion`).

    Args:
        simulator: answers the actions. max_turns: the most turns of an episode (>= 1).
        mode: ``"react"`` or ``"memory"`` (module docstring).
        reward: scores the trajectory; default ``MTRTraceReward(simulator.tools)`` (EM, weights 1.0 and
            0.2; observations are the environment's own, so they are not re-checked).
    Raises:
        ValueError: ``max_turns < 1`` or an unknown mode.
    Attributes:
        tasks: the tasks it serves (``("multihop",)``). transcript: the ReAct text so far (after the prompt).
        score: the :class:`TraceScore` once the episode ended, else ``None``.
    """

    tasks = ("multihop",)

    def __init__(self, simulator: ToolSimulator, max_turns: int = 4, mode: str = "react",
                 reward: MTRTraceReward | None = None):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.simulator, self.max_turns, self.mode = simulator, max_turns, mode
        self.reward = reward if reward is not None else MTRTraceReward(simulator.tools)
        self.example, self.done, self.transcript = None, False, ""
        self.score: TraceScore | None = None
        self.last_observation: str | None = None

    @property
    def appends_observations(self) -> bool:
        """Whether each turn's context is the previous one plus the turn and its observation (``react`` mode), so
        that the tools can run inside one growing sequence (:mod:`dlmrl.training.tool_loop`); ``memory`` mode
        rewrites the context every turn."""
        return self.mode == "react"

    @staticmethod
    def turn_end(text: str) -> int | None:
        """The stop rule of a turn being written (:func:`turn_end`)."""
        return turn_end(text)

    def observation_text(self, turn_text: str) -> str:
        """The text the environment appends after the turn ``turn_text`` it just stepped: ``"Observation: <obs>\\n"``
        (on a line of its own: a newline first when the turn did not end with one), or ``""`` when the turn had no
        observation (a final answer)."""
        if self.last_observation is None:
            return ""
        return ("" if turn_text.endswith("\n") else "\n") + f"Observation: {self.last_observation}\n"

    @property
    def tool_errors(self) -> int:
        """The turns so far whose observation is an error (a call that did not parse, an unknown tool, invalid
        arguments, no action at all): observations starting with ``Error:``."""
        return sum(1 for s in getattr(self, "_steps", ()) if s.observation is not None
                   and s.observation.startswith(ERROR_PREFIX))

    def close(self, drop_last_observation: bool = False) -> float:
        """End the episode now (the policy stopped writing, or the sequence ran out of tokens) and score it; returns
        the trace reward.

        Args:
            drop_last_observation: the last turn's observation never reached the policy (no room in the sequence):
                remove it from the record (the step keeps its thought and action) and score again, so the reward
                counts only what the policy saw.
        Raises:
            RuntimeError: before ``reset``.
        """
        if self.example is None:
            raise RuntimeError("close() needs reset() first")
        if drop_last_observation and self._steps and self.last_observation is not None:
            self._steps[-1] = replace(self._steps[-1], observation=None)
            self.last_observation = None
            self.score = None
        if self.score is None:
            self.done = True
            self.score = self.reward.score(self.trace, self.example.answer)
        return self.score.reward

    @property
    def reward_parts(self) -> tuple[float, ...] | None:
        """The final score's components (:data:`~dlmrl.envs.tools.trace_reward.COMPONENTS` order) once the
        episode ended, else ``None``; the episode rollout logs them per step."""
        return None if self.score is None else self.score.parts()

    @property
    def trace(self) -> Trace:
        """The episode so far as a :class:`Trace` (what the reward scores)."""
        return Trace(tuple(self._steps), self._final)

    def reset(self, example) -> str:
        """Start an episode on ``example``; returns the first prompt (``"Question: ...\\n"``, plus
        ``"Memory:\\n"`` in memory mode).

        Raises:
            TypeError: an example without ``question`` and ``answer``.
        """
        if not (hasattr(example, "question") and hasattr(example, "answer")):
            raise TypeError(f"a tool-use example needs question and answer attributes, got {type(example).__name__}")
        self.example, self.done, self.turn, self.score = example, False, 0, None
        self._steps: list[Step] = []
        self._final: str | None = None
        self._memory: list[str] = []
        self.transcript = ""
        self.last_observation = None
        return self._context()

    def _context(self) -> str:
        prompt = format_prompt(self.example.question)
        if self.mode == "react":
            return prompt + self.transcript
        return prompt + "Memory:\n" + "".join(f"- {m}\n" for m in self._memory)

    def step(self, text: str) -> StepResult:
        """Play one turn: the policy's ``text`` (thought and action, or final answer).

        Returns:
            ``StepResult(next prompt, done, reward)``: reward 0 until the last turn, then the trace reward.
        Raises:
            RuntimeError: before ``reset`` or after the episode ended.
        """
        if self.example is None or self.done:
            raise RuntimeError("step() needs reset() first and may not run past the end of the episode")
        self.turn += 1
        kept = cut_turn(text)
        parsed = parse_trace(kept)
        steps = list(parsed.steps)
        head = kept + "\n" if kept else ""
        if parsed.actions:
            # cut_turn stops after the first action, so it is the last step's
            obs = self.simulator.run(steps[-1].action).text
            steps[-1] = replace(steps[-1], observation=obs)
            self._memory.append(f"{steps[-1].action.raw} -> {obs}")
        elif parsed.final_answer is not None:
            self._final, obs = parsed.final_answer, None
        else:
            obs = NO_ACTION
            if steps and steps[-1].observation is None:
                steps[-1] = replace(steps[-1], observation=obs)
            else:
                steps.append(Step(observation=obs))
            self._memory.append(f"(no action) -> {obs}")
        self._steps += steps
        self.last_observation = obs
        self.transcript += head + ("" if obs is None else f"Observation: {obs}\n")
        self.done = self._final is not None or self.turn >= self.max_turns
        reward = 0.0
        if self.done:
            self.score = self.reward.score(self.trace, self.example.answer)
            reward = self.score.reward
        return StepResult(self._context(), self.done, reward)


@ENVS.register("multihop_react")
class MultiHopReactEnv(ToolEnv):
    """Tool-use episodes with the full ReAct transcript as context.

    Built as ``cls(task, max_turns)`` (:data:`dlmrl.envs.ENVS`): ``task.simulator`` answers the actions
    and ``task.trace_reward`` (optional) scores the trajectory.
    """

    def __init__(self, task, max_turns: int = 4):
        super().__init__(task.simulator, max_turns, "react", getattr(task, "trace_reward", None))


@ENVS.register("multihop_memory")
class MultiHopMemoryEnv(ToolEnv):
    """Tool-use episodes, AgentFlow-style: the question plus a compact memory of earlier actions.

    Built as ``cls(task, max_turns)``, from ``task.simulator`` and optionally ``task.trace_reward``.
    """

    def __init__(self, task, max_turns: int = 4):
        super().__init__(task.simulator, max_turns, "memory", getattr(task, "trace_reward", None))


@ENVS.register("multihop")
class MultiHopEnv(ToolEnv):
    """Tool-use episodes in the task's own context mode (``task.context``: ``"react"`` or ``"memory"``; the
    ``multihop`` task's ``task.options.context``), the default environment of that task.

    Built as ``cls(task, max_turns)``, from ``task.simulator``, ``task.context`` and optionally ``task.trace_reward``.
    """

    def __init__(self, task, max_turns: int = 4):
        super().__init__(task.simulator, max_turns, getattr(task, "context", "react"),
                         getattr(task, "trace_reward", None))
