"""Prompt templates for the text tasks (d1's ``<reasoning>``/``<answer>`` format) and their rendering.

A :class:`PromptTemplate` is a ``str.format`` template for the **user message** over the example's fields,
plus an optional **assistant prefix** written after the generation prompt. :func:`render_prompt` wraps the
user message with the tokenizer's chat template (``apply_chat_template(..., add_generation_prompt=True)``)
when it has one, and uses it as plain text (followed by a newline) otherwise.

Built-in templates, per task (the wording is d1's, arXiv 2504.12216, repository ``dllm-reasoning/d1``):

- ``d1``: the RL training prompts of ``diffu-grpo/data_utils.py``: ``SYSTEM_PROMPT`` ("Respond in the
  following format: <reasoning> ... </answer>") then the question (GSM8K), or the math-expert instruction
  and the problem (MATH), or the Countdown instruction with the numbers and target.
- ``d1_eval``: the evaluation prompts of ``eval/gsm8k.py`` (``GSM_SYSTEM_PROMPT``), ``eval/math500.py``
  (``MATH500_SYSTEM_PROMPT``, including its stray ``"``) and ``eval/countdown.py`` (``CTD_SYSTEM_PROMPT``
  and ``Numbers: [..]\\nTarget: N``), which ask for ``\\boxed{}`` inside ``<answer>``; the assistant turn starts
  with ``<reasoning>`` (d1's ``add_reasoning=True``).
- ``plain``: the question alone.

Sudoku in text form (``task.answer_mode: text``, for instruction-tuned models) has ``d1`` (the system prompt of
``diffu-grpo/data_utils.py``'s ``get_sudoku_questions`` and ``Solve the following Sudoku puzzle: <puzzle>``)
and ``plain`` (the 16-character puzzle alone); custom templates use ``{puzzle}``.

A custom template is any other string: a ``str.format`` template over the task's fields (``{question}``
for every task; ``{nums}`` and ``{target}`` for Countdown).
"""

from __future__ import annotations

import string
from dataclasses import dataclass

__all__ = ["TEMPLATES", "PromptTemplate", "check_template", "get_template", "render_prompt"]


def _lit(text: str) -> str:
    """A literal for a ``str.format`` template."""
    return text.replace("{", "{{").replace("}", "}}")


# d1 diffu-grpo/data_utils.py
D1_SYSTEM_PROMPT = "\nRespond in the following format:\n<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>\n"
D1_MATH_INSTRUCTION = ("You are a math expert. You will be given a question to solve. Solve it step by step. "
                       "Wrap the final answer in a \\boxed{}. \n\n")
D1_COUNTDOWN_INSTRUCTION = (
    "Using only the numbers {nums}, create an arithmetic expression that evaluates to exactly {target}. You must "
    "use all numbers from the list, and each number must be used exactly once. You may use the operations +, -, "
    "*, and / as needed. After reasoning, provide only your final expression inside <answer></answer> tags "
    "without including an equals sign or the target number. For example, if the numbers are [2, 3, 4] and the "
    "target is 5, a valid answer is: <answer>\n2*4-3\n</answer>"
)
# d1 eval/gsm8k.py, eval/math500.py, eval/countdown.py
D1_EVAL_GSM8K = ("You are a math expert. You will be given a question to solve. Solve it step by step. Wrap the "
                 "final answer in a \\boxed{}. \nRespond in the following format:\n<reasoning>\nYour reasoning "
                 "here\n</reasoning>\n<answer>\n\\boxed{...}\n</answer>")
D1_EVAL_MATH = ("You are a math expert. You will be given a question to solve. Solve it step by step. Wrap the "
                "final answer in a \\boxed{}.\nRespond in the following format:\n<reasoning>\nYour reasoning "
                "here\n</reasoning>\n<answer>\n\\boxed{...}\n</answer>\" \n")
D1_EVAL_COUNTDOWN = (
    "Using only the provided numbers, create an arithmetic expression that evaluates to exactly the provided "
    "target number. You may use the operations +, -, *, and / as needed, but each number must be used exactly "
    "once. Think step-by-step. After reasoning, provide only your final expression inside \\boxed{} tags without "
    "including an equals sign or the target number. For example: \\boxed{a + b * c}Respond in the following "
    "format:\n<reasoning>\nYour reasoning here\n</reasoning>\n<answer>\n\\boxed{...}\n</answer>"
)

# d1 diffu-grpo/data_utils.py (get_sudoku_questions): the system prompt, then "Solve the following Sudoku
# puzzle: <puzzle>"
D1_SUDOKU_SYSTEM_PROMPT = (
    "\nPlease solve the following 4x4 Sudoku puzzle. The puzzle is provided as a 16-character string reading "
    "left-to-right, top-to-bottom, where '0' represents empty cells.\n\nRules:\n- Fill empty cells with digits "
    "1-4\n- Each row must contain digits 1-4 exactly once\n- Each column must contain digits 1-4 exactly once\n"
    "- Each 2x2 box must contain digits 1-4 exactly once\n\nImportant: Your solution must be a COMPLETE "
    "16-character string with only the digits 1-4, representing your final solved grid.\n\nRespond in this "
    "exact format:\n<reasoning>\nYour step-by-step solving process\n</reasoning>\n<answer>\n[16-character "
    "solution string with no spaces or separators]\n</answer>\n"
)


@dataclass(frozen=True)
class PromptTemplate:
    """A user-message template and the text the assistant turn starts with.

    Attributes:
        user: ``str.format`` template over the example's fields.
        assistant_prefix: appended after the generation prompt (d1's evaluation starts with ``<reasoning>``).
    """

    user: str
    assistant_prefix: str = ""

    def format(self, fields: dict) -> str:
        return self.user.format(**fields)


TEMPLATES: dict[str, dict[str, PromptTemplate]] = {
    "gsm8k": {
        "d1": PromptTemplate(_lit(D1_SYSTEM_PROMPT) + "\n\n{question}"),
        "d1_eval": PromptTemplate(_lit(D1_EVAL_GSM8K) + "\n\n{question}", "<reasoning>"),
        "plain": PromptTemplate("{question}"),
    },
    "math": {
        "d1": PromptTemplate(_lit(D1_SYSTEM_PROMPT) + "\n\n" + _lit(D1_MATH_INSTRUCTION) + "{question}"),
        "d1_eval": PromptTemplate(_lit(D1_EVAL_MATH) + "\n\n{question}", "<reasoning>"),
        "plain": PromptTemplate("{question}"),
    },
    "countdown": {
        "d1": PromptTemplate(_lit(D1_SYSTEM_PROMPT) + "\n" + D1_COUNTDOWN_INSTRUCTION),  # ({nums}, {target})
        "d1_eval": PromptTemplate(_lit(D1_EVAL_COUNTDOWN) + "\n\n{question}", "<reasoning>"),
        "plain": PromptTemplate("{question}"),
    },
    "dataset": {  # the dataset task's prompts are its prompt column as written (dlmrl.data.dataset_task)
        "plain": PromptTemplate("{prompt}"),
    },
    "sudoku": {  # task.answer_mode text (dlmrl.data.sudoku_text)
        "d1": PromptTemplate(_lit(D1_SUDOKU_SYSTEM_PROMPT) + "\n\nSolve the following Sudoku puzzle: {puzzle}\n"),
        "plain": PromptTemplate("{puzzle}"),
    },
}

#: fields a custom template may use, per task
FIELDS = {"gsm8k": ("question",), "math": ("question",), "countdown": ("question", "nums", "target"),
          "sudoku": ("puzzle",), "dataset": ("prompt",)}


def check_template(task: str, template: str) -> str | None:
    """Why ``template`` is not usable for ``task`` (None if it is): neither a built-in name nor a format
    string over the task's fields."""
    if template in TEMPLATES.get(task, {}):
        return None
    allowed = FIELDS.get(task, ("question",))
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as e:
        return f"not a built-in template ({', '.join(TEMPLATES.get(task, {}))}) nor a valid format string: {e}"
    if not names:
        return (f"not a built-in template ({', '.join(TEMPLATES.get(task, {}))}) and no field placeholder "
                f"(use {', '.join('{' + f + '}' for f in allowed)})")
    bad = [n for n in names if n not in allowed]
    if bad:
        return f"unknown placeholder {{{bad[0]}}}; {task} templates may use {', '.join('{' + f + '}' for f in allowed)}"
    return None


def get_template(task: str, template: str) -> PromptTemplate:
    """The built-in template ``template`` of ``task``, or a custom format string.

    Raises:
        ValueError: if :func:`check_template` finds a problem.
    """
    problem = check_template(task, template)
    if problem is not None:
        raise ValueError(f"prompt template {template!r}: {problem}")
    return TEMPLATES.get(task, {}).get(template) or PromptTemplate(template)


def uses_chat_template(tokenizer, chat_template: str) -> bool:
    """``chat_template``: ``auto`` (use the tokenizer's when it has one), ``on`` (required) or ``off``.

    Raises:
        ValueError: ``on`` with a tokenizer that has no chat template.
    """
    has = bool(getattr(tokenizer, "chat_template", None))
    if chat_template == "on" and not has:
        raise ValueError("task.chat_template is 'on' but the tokenizer has no chat template")
    return has and chat_template != "off"


def render_prompt(tokenizer, user: str, assistant_prefix: str = "", chat: bool = True) -> str:
    """The prompt text: the chat template around the user message (with the generation prompt) when ``chat``,
    else ``user + "\\n"``; then ``assistant_prefix``."""
    if chat:
        text = tokenizer.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True,
                                             tokenize=False)
    else:
        text = user + "\n"
    return text + assistant_prefix
