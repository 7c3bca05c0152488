"""MATH as a task (``task.name: math``; train: ``ankner/math-500`` train, d1's; held out: ``HuggingFaceH4/MATH-500``),
with d1's prompts and rewards (arXiv 2504.12216, repository ``dllm-reasoning/d1``).

Templates: ``d1`` (d1's RL prompt, ``diffu-grpo/data_utils.py``: ``SYSTEM_PROMPT``, the math-expert instruction and
the problem), ``d1_eval`` (``eval/math500.py``'s ``MATH500_SYSTEM_PROMPT``, its stray ``"`` included; the assistant
turn starts with ``<reasoning>``), ``plain``, or a format string over ``{question}``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import ClassVar

from dlmrl.data.loading import is_local_file
from dlmrl.data.prompts import D1_SYSTEM_PROMPT, PromptTemplate, literal
from dlmrl.data.task import TASKS
from dlmrl.data.text_examples import math_examples
from dlmrl.data.text_tasks import TextOptions, TextTask
from dlmrl.rewards.math_reward import math_correctness
from dlmrl.rewards.math_verifier import MathVerifier, default_verifier

__all__ = ["MathOptions", "MathTask"]

# d1 diffu-grpo/data_utils.py
D1_MATH_INSTRUCTION = ("You are a math expert. You will be given a question to solve. Solve it step by step. "
                       "Wrap the final answer in a \\boxed{}. \n\n")
# d1 eval/math500.py
D1_EVAL_MATH = ("You are a math expert. You will be given a question to solve. Solve it step by step. Wrap the "
                "final answer in a \\boxed{}.\nRespond in the following format:\n<reasoning>\nYour reasoning "
                "here\n</reasoning>\n<answer>\n\\boxed{...}\n</answer>\" \n")


@dataclass(frozen=True)
class MathOptions(TextOptions):
    """:class:`~dlmrl.data.text_tasks.TextOptions` and math-verify's limits.

    Attributes:
        verify_timeout: seconds math-verify may spend on one answer (in a worker process, killed past it).
        verify_workers: math-verify worker processes.
    """

    verify_timeout: float = 1.0
    verify_workers: int = 2


@TASKS.register("math")
class MathTask(TextTask):
    """MATH: 2.0 when math-verify finds the last ``\\boxed{}`` equal to the answer.

    Args:
        verifier: the math-verify pool (default: one with the options' limits, :func:`default_verifier`).
        Others: as :class:`~dlmrl.data.text_tasks.TextTask`.
    """

    name = "math"
    options_class = MathOptions
    CORRECT = 2.0
    d1_format_rewards = ("boxed_in_answer",)
    templates: ClassVar[dict[str, PromptTemplate]] = {
        "d1": PromptTemplate(literal(D1_SYSTEM_PROMPT) + "\n\n" + literal(D1_MATH_INSTRUCTION) + "{question}"),
        "d1_eval": PromptTemplate(literal(D1_EVAL_MATH) + "\n\n{question}", "<reasoning>"),
        "plain": PromptTemplate("{question}"),
    }
    DEFAULTS: ClassVar[dict[str, str | None]] = {"dataset": "ankner/math-500", "subset": None, "split": "train",
                                                 "test_dataset": "HuggingFaceH4/MATH-500", "test_split": "test"}
    converter = staticmethod(math_examples)

    def __init__(self, *args, verifier: MathVerifier | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.verifier = verifier

    @classmethod
    def from_options(cls, options: MathOptions, tokenizer, mask_token_id, gen_length=None, **resources) -> MathTask:
        verifier = resources.pop("verifier", None) or default_verifier(options.verify_timeout, options.verify_workers)
        return super().from_options(options, tokenizer, mask_token_id, gen_length, verifier=verifier, **resources)

    def correctness(self, example, text: str) -> float:
        return math_correctness(text, example.answer, self.verifier)

    @classmethod
    def check_options(cls, options: MathOptions) -> int | None:
        """As :meth:`TextTask.check_options`, and warn about the gold answers of local files that math-verify cannot
        read as math (they score 0 for every completion), naming the file and line.

        Warns:
            UserWarning: listing the first such records.
        """
        cls.check_prompt_options(options)
        test_size = None
        verifier = None
        for which, (source, _, _, key) in cls.sources(options).items():
            if not is_local_file(source):
                continue
            examples = cls.load_split(options, which)
            test_size = len(examples) if which == "test" else test_size
            verifier = verifier or default_verifier(options.verify_timeout, options.verify_workers)
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
