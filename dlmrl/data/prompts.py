"""Prompt templates and their rendering; each task keeps its own templates (``templates`` on the task class).

A :class:`PromptTemplate` is a ``str.format`` template for the **user message** over the example's fields,
plus an optional **assistant prefix** written after the generation prompt. :func:`render_prompt` wraps the
user message with the tokenizer's chat template (``apply_chat_template(..., add_generation_prompt=True)``)
when it has one, and uses it as plain text (followed by a newline) otherwise.

A task's built-in templates live in its module, next to the task (GSM8K's in :mod:`dlmrl.data.gsm8k_task`, ...);
this module holds what several tasks share: d1's format instruction (:data:`D1_SYSTEM_PROMPT`, the start of
d1's GSM8K, MATH and Countdown training prompts, arXiv 2504.12216, ``diffu-grpo/data_utils.py``) and the checks.
A custom template is any string that is not a built-in name: a ``str.format`` template over the task's fields
(its ``template_fields``).
"""

from __future__ import annotations

import string
from dataclasses import dataclass

__all__ = ["D1_SYSTEM_PROMPT", "PromptTemplate", "check_template", "get_template", "literal", "render_prompt",
           "uses_chat_template"]


def literal(text: str) -> str:
    """``text`` as a literal inside a ``str.format`` template (braces doubled)."""
    return text.replace("{", "{{").replace("}", "}}")


# d1 diffu-grpo/data_utils.py: SYSTEM_PROMPT, which the GSM8K, MATH and Countdown training prompts start with
D1_SYSTEM_PROMPT = "\nRespond in the following format:\n<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>\n"


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


def check_template(templates: dict[str, PromptTemplate], fields: tuple[str, ...], template: str,
                   task: str = "this task's") -> str | None:
    """Why ``template`` is not usable (None if it is): neither one of the task's built-in ``templates`` nor a format
    string over its ``fields``."""
    if template in templates:
        return None
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as e:
        return f"not a built-in template ({', '.join(templates)}) nor a valid format string: {e}"
    if not names:
        return (f"not a built-in template ({', '.join(templates)}) and no field placeholder "
                f"(use {', '.join('{' + f + '}' for f in fields)})")
    bad = [n for n in names if n not in fields]
    if bad:
        return f"unknown placeholder {{{bad[0]}}}; {task} templates may use {', '.join('{' + f + '}' for f in fields)}"
    return None


def get_template(templates: dict[str, PromptTemplate], fields: tuple[str, ...], template: str,
                 task: str = "this task's") -> PromptTemplate:
    """The built-in template ``template`` of ``templates``, or a custom format string over ``fields``.

    Raises:
        ValueError: if :func:`check_template` finds a problem.
    """
    problem = check_template(templates, fields, template, task)
    if problem is not None:
        raise ValueError(f"prompt template {template!r}: {problem}")
    return templates.get(template) or PromptTemplate(template)


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
