"""A scripted ReAct agent writing correct complete traces, and SFT pairs from them.

MTR (arXiv 2510.06825) has an AutoAgent (an LLM) write think-act-observe traces for Stage-1 SFT. Here the
agent is rule-based **(dlmrl interpretation)**: for a :class:`MultiHopQuestion` it follows the question's
relation chain, one ``lookup`` per hop, reading each hop's entity from the simulator's observation (not
from the gold chain), then gives the last observation as its final answer::

    Thought: I need the director of Kavoni.
    Action: lookup[{"entity": "Kavoni", "relation": "directed_by"}]
    Observation: Tesu Rabelo
    ...
    Thought: I have the answer.
    Final Answer: Nelina

Against the knowledge base's simulator every trace is correct and scores full MTR reward (1.2 at the
default weights).
"""

from __future__ import annotations

from collections.abc import Iterable

from dlmrl.envs.tools.env import MODES, ToolEnv
from dlmrl.envs.tools.multihop import MultiHopQuestion, phrase
from dlmrl.envs.tools.react import Action, Step, Trace, format_prompt, format_step, format_trace
from dlmrl.envs.tools.simulator import ToolSimulator

__all__ = ["FORMS", "ScriptedAgent", "sft_pairs"]

#: the SFT forms: one whole trace per question, or one pair per turn of an episode in each context mode
FORMS = ("trace", *MODES)
FINAL_THOUGHT = "I have the answer."


class ScriptedAgent:
    """The rule-based AutoAgent.

    Args:
        simulator: the tools it calls (its observations decide the next hop).
    """

    def __init__(self, simulator: ToolSimulator):
        self.simulator = simulator

    def trace(self, question: MultiHopQuestion) -> Trace:
        """The complete trace (thoughts, actions, the simulator's observations, final answer)."""
        steps, entity = [], question.topic
        for relation in question.relations:
            action = Action.of("lookup", {"entity": entity, "relation": relation})
            observation = self.simulator.run(action).text
            steps.append(Step(f"I need {phrase(relation, entity)}.", action, observation))
            entity = observation
        steps.append(Step(FINAL_THOUGHT))
        return Trace(tuple(steps), entity)

    def turns(self, question: MultiHopQuestion) -> list[str]:
        """The agent's turn texts for an episode: the trace's steps without their observations (one
        ``Thought:``/``Action:`` pair per hop), the last one with its ``Final Answer:``."""
        trace = self.trace(question)
        out = [format_step(Step(s.thought, s.action)) for s in trace.steps]
        out[-1] += f"Final Answer: {trace.final_answer}\n"
        return out

    def completion(self, question: MultiHopQuestion) -> str:
        """The trace as text, the completion of :func:`~dlmrl.envs.tools.react.format_prompt`."""
        return format_trace(self.trace(question))


def sft_pairs(questions: Iterable[MultiHopQuestion], simulator: ToolSimulator, form: str = "trace",
              max_turns: int = 8) -> list[tuple[str, str]]:
    """``(prompt, completion)`` text pairs of the scripted agent, for supervised fine-tuning.

    Args:
        questions: the questions (the train split: test entities then never appear).
        simulator: the tools. form: ``"trace"``: one pair per question, the prompt
            ``"Question: ...\\n"`` and the whole trace, observations included (the single-sequence form);
            ``"react"`` / ``"memory"``: one pair per turn, the prompt exactly as :class:`ToolEnv` shows it in
            that mode and the agent's turn text (episodes' form; the environment calls the simulator
            again, so it should be deterministic).
        max_turns: the episodes' turn limit (per-turn forms; at least hops + 1).
    Returns:
        The pairs, question by question (turn by turn).
    Raises:
        ValueError: an unknown form. RuntimeError: a question needing more than ``max_turns`` turns.
    """
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    agent = ScriptedAgent(simulator)
    pairs = []
    for q in questions:
        if form == "trace":
            pairs.append((format_prompt(q.question), agent.completion(q)))
            continue
        env = ToolEnv(simulator, max_turns, form)
        obs, done = env.reset(q), False
        for text in agent.turns(q):
            if done:
                raise RuntimeError(f"{q.question!r} needs {q.hops + 1} turns, more than max_turns={max_turns}")
            pairs.append((obs, text))
            obs, done, _ = env.step(text)
    return pairs
