"""GSM8K grade-school math as a task (``task.name: gsm8k``, ``openai/gsm8k``), with d1's prompts and rewards
(arXiv 2504.12216, repository ``dllm-reasoning/d1``).

Templates: ``d1`` (d1's RL prompt, ``diffu-grpo/data_utils.py``: ``SYSTEM_PROMPT`` then the question), ``d1_eval``
(``eval/gsm8k.py``'s ``GSM_SYSTEM_PROMPT``, asking for ``\\boxed{}`` inside ``<answer>``; the assistant turn starts
with ``<reasoning>``, d1's ``add_reasoning=True``), ``plain`` (the question alone), or a format string over
``{question}``.
"""

from __future__ import annotations

import re
from typing import ClassVar

from dlmrl.data.prompts import D1_SYSTEM_PROMPT, PromptTemplate, literal
from dlmrl.data.task import TASKS
from dlmrl.data.text_examples import gsm8k_examples
from dlmrl.data.text_tasks import TextTask
from dlmrl.rewards.gsm8k import gsm8k_correctness

__all__ = ["GSM8KTask"]

_CALCULATOR = re.compile(r"<<[^<>]*>>")  # GSM8K's calculator annotations, "<<48/2=24>>"

# d1 eval/gsm8k.py
D1_EVAL_GSM8K = ("You are a math expert. You will be given a question to solve. Solve it step by step. Wrap the "
                 "final answer in a \\boxed{}. \nRespond in the following format:\n<reasoning>\nYour reasoning "
                 "here\n</reasoning>\n<answer>\n\\boxed{...}\n</answer>")


@TASKS.register("gsm8k")
class GSM8KTask(TextTask):
    """GSM8K grade-school math (``openai/gsm8k``): 2.0 for the right final number; d1's format rewards optional."""

    name = "gsm8k"
    CORRECT = 2.0
    d1_format_rewards = ("xmlcount", "soft_format", "strict_format", "int_format")
    templates: ClassVar[dict[str, PromptTemplate]] = {
        "d1": PromptTemplate(literal(D1_SYSTEM_PROMPT) + "\n\n{question}"),
        "d1_eval": PromptTemplate(literal(D1_EVAL_GSM8K) + "\n\n{question}", "<reasoning>"),
        "plain": PromptTemplate("{question}"),
    }
    DEFAULTS: ClassVar[dict[str, str | None]] = {"dataset": "openai/gsm8k", "subset": "main", "split": "train",
                                                 "test_split": "test"}
    converter = staticmethod(gsm8k_examples)

    def correctness(self, example, text: str) -> float:
        return gsm8k_correctness(text, example.answer)

    def sft_answer(self, example) -> str:
        """d1's format around GSM8K's worked solution (calculator annotations removed) and the final answer."""
        reasoning = _CALCULATOR.sub("", example.solution).strip()
        return f"<reasoning>\n{reasoning}\n</reasoning>\n<answer>\n{example.answer}\n</answer>"
