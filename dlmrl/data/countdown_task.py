"""Countdown as a task (``task.name: countdown``, ``Jiayi-Pan/Countdown-Tasks-3to4``; d1's test JSONL works as
``task.test_file``), with d1's prompts and reward (arXiv 2504.12216, repository ``dllm-reasoning/d1``).

Templates: ``d1`` (d1's RL prompt, ``diffu-grpo/data_utils.py``: ``SYSTEM_PROMPT`` and the Countdown instruction with
the numbers and target), ``d1_eval`` (``eval/countdown.py``'s ``CTD_SYSTEM_PROMPT`` and ``Numbers: [..]\\nTarget: N``;
the assistant turn starts with ``<reasoning>``), ``plain``, or a format string over ``{question}``, ``{nums}``,
``{target}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dlmrl.data.loading import DataError
from dlmrl.data.prompts import D1_SYSTEM_PROMPT, PromptTemplate, literal
from dlmrl.data.task import TASKS
from dlmrl.data.text_examples import countdown_examples
from dlmrl.data.text_tasks import TextOptions, TextTask
from dlmrl.rewards.countdown import CORRECT as COUNTDOWN_CORRECT
from dlmrl.rewards.countdown import countdown_score

__all__ = ["CountdownOptions", "CountdownTask"]

# d1 diffu-grpo/data_utils.py (a str.format template over {nums}, {target})
D1_COUNTDOWN_INSTRUCTION = (
    "Using only the numbers {nums}, create an arithmetic expression that evaluates to exactly {target}. You must "
    "use all numbers from the list, and each number must be used exactly once. You may use the operations +, -, "
    "*, and / as needed. After reasoning, provide only your final expression inside <answer></answer> tags "
    "without including an equals sign or the target number. For example, if the numbers are [2, 3, 4] and the "
    "target is 5, a valid answer is: <answer>\n2*4-3\n</answer>"
)
# d1 eval/countdown.py
D1_EVAL_COUNTDOWN = (
    "Using only the provided numbers, create an arithmetic expression that evaluates to exactly the provided "
    "target number. You may use the operations +, -, *, and / as needed, but each number must be used exactly "
    "once. Think step-by-step. After reasoning, provide only your final expression inside \\boxed{} tags without "
    "including an equals sign or the target number. For example: \\boxed{a + b * c}Respond in the following "
    "format:\n<reasoning>\nYour reasoning here\n</reasoning>\n<answer>\n\\boxed{...}\n</answer>"
)


@dataclass(frozen=True)
class CountdownOptions(TextOptions):
    """:class:`~dlmrl.data.text_tasks.TextOptions` and ``num_numbers``: keep only problems with this many numbers
    (d1 trains on 3); 0 = all."""

    num_numbers: int = 0


@TASKS.register("countdown")
class CountdownTask(TextTask):
    """Countdown: 1.0 for an expression that uses each number once and hits the target, 0.1 for a wrong one, 0 for
    none."""

    name = "countdown"
    options_class = CountdownOptions
    CORRECT = COUNTDOWN_CORRECT
    templates: ClassVar[dict[str, PromptTemplate]] = {
        "d1": PromptTemplate(literal(D1_SYSTEM_PROMPT) + "\n" + D1_COUNTDOWN_INSTRUCTION),
        "d1_eval": PromptTemplate(literal(D1_EVAL_COUNTDOWN) + "\n\n{question}", "<reasoning>"),
        "plain": PromptTemplate("{question}"),
    }
    template_fields = ("question", "nums", "target")
    DEFAULTS: ClassVar[dict[str, str | None]] = {"dataset": "Jiayi-Pan/Countdown-Tasks-3to4", "subset": None,
                                                 "split": "train[:-500]", "test_split": "train[-500:]"}
    converter = staticmethod(countdown_examples)

    @classmethod
    def filter_examples(cls, options: CountdownOptions, examples: list, where: str) -> list:
        k = options.num_numbers
        kept = [e for e in examples if len(e.nums) == k] if k else examples
        if not kept:
            raise DataError(f"{where}: no examples{f' with {k} numbers (task.num_numbers)' if k else ''}")
        return kept

    def correctness(self, example, text: str) -> float:
        return countdown_score(text, example.nums, example.target)
