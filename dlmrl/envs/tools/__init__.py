"""Simulated tools, multi-hop questions, ReAct traces, MTR's trace reward and tool-use episodes.

MTR (arXiv 2510.06825): tools declared as OpenAI function schemas (:mod:`.toolset`), a simulator that
answers schema-validated calls (:mod:`.simulator`) from a seeded synthetic knowledge base
(:mod:`.knowledge_base`), ReAct traces (:mod:`.react`) written by a scripted agent for SFT (:mod:`.agent`),
and a composite trace reward (:mod:`.trace_reward`). Multi-hop questions split by entity with EM/F1
(:mod:`.multihop`, :mod:`.qa_metrics`). Episodes in ReAct and AgentFlow-memory modes (AgentFlow,
arXiv 2510.05592; :mod:`.env`).
"""

from dlmrl.envs.tools.agent import ScriptedAgent, sft_pairs
from dlmrl.envs.tools.env import MultiHopMemoryEnv, MultiHopReactEnv, ToolEnv
from dlmrl.envs.tools.knowledge_base import RELATIONS, Entity, KnowledgeBase
from dlmrl.envs.tools.multihop import MultiHopQuestion, generate_questions, split_questions
from dlmrl.envs.tools.qa_metrics import exact_match, f1_score, normalize_answer
from dlmrl.envs.tools.react import Action, Step, Trace, format_prompt, format_trace, parse_trace
from dlmrl.envs.tools.simulator import ERROR_PREFIX, Observation, ToolSimulator
from dlmrl.envs.tools.toolset import ToolSet, kb_tools
from dlmrl.envs.tools.trace_reward import MTRTraceReward, TraceScore

__all__ = ["ERROR_PREFIX", "RELATIONS", "Action", "Entity", "KnowledgeBase", "MTRTraceReward", "MultiHopMemoryEnv",
           "MultiHopQuestion", "MultiHopReactEnv", "Observation", "ScriptedAgent", "Step", "ToolEnv", "ToolSet",
           "ToolSimulator", "Trace", "TraceScore", "exact_match", "f1_score", "format_prompt", "format_trace",
           "generate_questions", "kb_tools", "normalize_answer", "parse_trace", "sft_pairs", "split_questions"]
