"""Held-out evaluation: decode the test split and score it with the task's own metrics (``task.metrics``).

Every task reports a dict of metrics over the whole split; its **primary metric** (:func:`primary_metric`) is
the headline number the trainer logs as ``eval_<name>`` and compares before/after training: Sudoku's
``cell_accuracy`` (correct blank cells / all blank cells, d1's metric), the text tasks' ``accuracy`` (fraction
of completions whose answer is right: GSM8K, MATH, Countdown).

``protocol`` (``eval.protocol``, :mod:`dlmrl.evaluation.protocol`) picks how the text tasks are scored:
``strict`` (the task's metrics) or d1's evaluation parser (``d1``, ``d1_fixed``).
:func:`dlmrl.evaluation.configured.evaluate_with_config` runs an evaluation with a config's settings (its preset's, :mod:`dlmrl.evaluation.presets`) and writes the
result's ``record`` (:mod:`dlmrl.evaluation.record`) beside the figures.
"""

from __future__ import annotations

import torch

from dlmrl.evaluation.protocol import canvas_texts, protocol_metrics
from dlmrl.models.sampler import generate


def primary_metric(task) -> str:
    """The name of ``task``'s headline metric: ``task.primary_metric`` (:class:`~dlmrl.data.task.Task`: Sudoku
    ``cell_accuracy``, text tasks ``accuracy``, by default ``mean_reward``)."""
    return task.primary_metric


def task_metrics(task, examples: list, texts: list[str]) -> dict:
    """``task.metrics(examples, texts)`` as a new dict (the base :class:`~dlmrl.data.task.Task`'s: ``mean_reward``
    and ``num_examples``)."""
    return dict(task.metrics(examples, texts))


def check_held_out_size(task, num_puzzles: int) -> None:
    """Refuse ``eval.num_puzzles`` above the size of ``task``'s held-out split, known once the task has loaded it
    (hub data: the config check could not count it), so a run stops before it trains or decodes anything.

    Raises:
        ConfigError: naming ``eval.num_puzzles``, the number asked and the split's size.
    """
    from dlmrl.errors import ConfigError

    size = len(task.test_examples)
    if num_puzzles > size:
        raise ConfigError(f"config key 'eval.num_puzzles': {num_puzzles} held-out examples asked, the held-out split "
                          f"of task {getattr(task, 'name', type(task).__name__)!r} has {size}; set eval.num_puzzles "
                          f"{size} or less (0 = the whole split)")


def held_out_examples(task, num: int) -> list:
    """The first ``num`` held-out examples (``num`` 0: the whole split)."""
    return task.test_batch(num if num > 0 else len(task.test_examples))


def _summary(task, examples: list, texts: list[str], nfe: int, protocol: str = "strict",
             canvas_text: list[str] | None = None, metrics: dict | None = None, **extra) -> dict:
    metrics = task_metrics(task, examples, texts) if metrics is None else metrics
    if protocol != "strict":  # (the protocol's figures lead; the strict ones come alongside)
        metrics = {**protocol_metrics(task, examples, canvas_text or [], protocol), "strict": metrics}
    name = primary_metric(task)
    if name not in metrics:
        raise KeyError(f"task {type(task).__name__}: primary metric {name!r} is not among its metrics "
                       f"{sorted(metrics)}")
    return {**metrics, "primary_metric": name, "protocol": protocol, "num_puzzles": len(examples), "nfe": nfe,
            **extra}


def _decode_held_out(policy, task, num_puzzles: int, batch_size: int, decode) -> tuple[list, list[str], list[int]]:
    """The held-out examples, their decoded texts and each chunk's NFE: ``decode(batch, start) -> (texts, nfe)``
    on chunks of ``batch_size`` encoded examples, the model in eval mode (restored afterwards)."""
    was_training = policy.model.training
    policy.model.eval()
    examples = held_out_examples(task, num_puzzles)
    texts: list[str] = []
    nfes: list[int] = []
    for start in range(0, len(examples), batch_size):
        chunk_texts, nfe = decode(task.encode(examples[start : start + batch_size], device=policy.device), start)
        texts += chunk_texts
        nfes.append(nfe)
    if was_training:
        policy.model.train()
    return examples, texts, nfes


@torch.no_grad()
def evaluate(policy, task, num_puzzles: int = 256, steps: int = 8, block_length: int | None = None,
             temperature: float = 0.0, batch_size: int = 256, seed: int = 0,
             sampler_options: dict | None = None, protocol: str = "strict") -> dict:
    """Decode ``num_puzzles`` held-out examples with the diffusion sampler and score them with the task's metrics.

    Args:
        policy: a masked-diffusion policy.
        task: a task with ``test_batch``, ``encode``, ``decode``, ``rewards`` and (usually) ``metrics``.
        num_puzzles: held-out examples to decode (0 = the whole split).
        steps: denoising steps per canvas; ``block_length`` defaults to the task's canvas length
            (``task.gen_length``: 16 for Sudoku, ``sampling.gen_length`` for the text tasks).
        temperature: 0 = greedy (the reported metric).
        sampler_options: more :func:`~dlmrl.models.sampler.generate` keywords (``threshold``, ``threshold_factor``,
            ``cache``); with a threshold ``nfe`` is the mean over the last chunk's rows (data-dependent).
        protocol: ``strict`` | ``d1`` | ``d1_fixed`` (module docstring; d1's are scored on the whole canvas
            decoded with its special tokens, as d1's ``eval/eval.py`` decodes it).
    Returns:
        ``task.metrics`` over the split (Sudoku: ``cell_accuracy`` over blanks, ``solve_rate``, ``mean_reward``;
        text tasks: ``accuracy``, ``mean_reward``; fractions in [0, 1]) plus ``primary_metric`` (the headline
        metric's name), ``protocol``, ``num_puzzles`` (examples decoded), ``nfe`` (forward passes per canvas),
        ``gen_length`` and ``steps``; with ``d1``/``d1_fixed`` the protocol's figures
        (:func:`~dlmrl.evaluation.protocol.protocol_metrics`) and the strict ones under ``strict``.
    """
    gen = torch.Generator().manual_seed(seed)
    raw: list[str] = []

    def decode(batch, start):
        out = generate(policy, batch.prompt_ids, batch.prompt_mask, gen_length=task.gen_length,
                       block_length=block_length or task.gen_length, steps=steps, temperature=temperature,
                       canvas=batch.canvas, generator=gen, **(sampler_options or {}))
        adaptive = any((sampler_options or {}).get(k) is not None for k in ("threshold", "threshold_factor"))
        if protocol != "strict":
            raw.extend(canvas_texts(policy.tokenizer, out.canvas))
        return task.decode(out.canvas), round(float(out.row_nfe.double().mean()), 3) if adaptive else out.nfe

    examples, texts, nfes = _decode_held_out(policy, task, num_puzzles, batch_size, decode)
    nfe = nfes[-1] if nfes else 0  # (the last chunk's, as reported before; chunks may skip steps differently)
    return _summary(task, examples, texts, nfe, protocol, raw, gen_length=task.gen_length, steps=steps)


@torch.no_grad()
def evaluate_ar(policy, task, num_puzzles: int = 256, batch_size: int = 256, temperature: float = 0.0,
                seed: int = 0, protocol: str = "strict") -> dict:
    """Decode ``num_puzzles`` held-out examples left to right with an AR policy and score them with the task's
    metrics (as :func:`evaluate`; ``nfe`` = decoding steps, forward passes per sequence).

    The budget is ``task.gen_length + 1`` new tokens (Sudoku: the 16 cells then EOS; a 17th cell before EOS
    makes the answer malformed), as in training. With ``d1``/``d1_fixed`` the completions are decoded with their
    special tokens (padding after the end included).
    """
    raw: list[str] = []

    def decode(batch, start):
        completion, mask = policy.generate(batch.prompt_ids, batch.prompt_mask, task.gen_length + 1,
                                           temperature=temperature, generator=seed + start)
        if protocol != "strict":
            raw.extend(canvas_texts(policy.tokenizer, completion))
        return task.decode(completion), int(mask.sum(-1).max())

    examples, texts, nfes = _decode_held_out(policy, task, num_puzzles, batch_size, decode)
    nfe = max(nfes, default=0)
    return _summary(task, examples, texts, nfe, protocol, raw, max_new_tokens=task.gen_length + 1)


@torch.no_grad()
def evaluate_ranking(policy, task, num_puzzles: int = 0, batch_size: int = 256) -> dict:
    """Held-out evaluation of a task that ranks a catalogue (``task.evaluates_ranking``, the ``recommend`` task):
    per example one greedy completion (``task.gen_length + 1`` new tokens) and a constrained beam search of
    ``task.options.beam_size`` items after ``task.ranking_context`` (:mod:`dlmrl.models.constrained_beam`), scored by
    ``task.metrics(examples, texts, ranked)`` (Recall@K, NDCG@K and the greedy metrics). AR policies only.
    """
    from dlmrl.models.constrained_beam import constrained_beam_search

    tok, ranked = task.tokenizer, []
    bos = getattr(tok, "bos_token", None) or ""

    def decode(batch, start):
        completion, mask = policy.generate(batch.prompt_ids, batch.prompt_mask, task.gen_length + 1, temperature=0.0)
        texts = task.decode(completion)
        contexts = [task.ranking_context(e, t) for e, t in zip(batch.examples, texts)]
        rows = [i for i, c in enumerate(contexts) if c is not None]  # (a reasoning chain without the marker: none)
        ids = [tok(bos + contexts[i], add_special_tokens=False)["input_ids"] for i in rows]
        beams = constrained_beam_search(policy, ids, task.sids, task.code_token_ids, task.options.beam_size,
                                        task.pad_token_id, batch_size)
        found = dict(zip(rows, beams))
        ranked.extend([sid for sid, _ in found.get(i, [])] for i in range(len(texts)))
        return texts, int(mask.sum(-1).max())

    examples, texts, nfes = _decode_held_out(policy, task, num_puzzles, batch_size, decode)
    return _summary(task, examples, texts, max(nfes, default=0), metrics=task.metrics(examples, texts, ranked),
                    mode="beam", beam_size=task.options.beam_size, max_new_tokens=task.gen_length + 1)


def evaluate_task_episodes(policy, task, num_puzzles: int = 0, batch_size: int = 256) -> dict:
    """Held-out evaluation by episodes, for a task whose answers need its environment (``task.evaluates_episodes``,
    the ``multihop`` task: test questions are about entities only its simulated tools know): one greedy episode per
    held-out example in the task's default environment, at most ``task.options.max_turns`` turns of
    ``task.options.turn_length`` new tokens (:func:`dlmrl.training.episodes.evaluate_episodes`), scored by
    ``task.episode_metrics(examples, envs)``. AR policies only.

    Raises:
        ValueError: a policy without ``generate`` (a diffusion policy: set the task's ``eval_mode: sequence``).
    """
    from dlmrl.envs import default_env, make_env
    from dlmrl.training.episodes import evaluate_episodes

    if not hasattr(policy, "generate"):
        raise ValueError(f"task {task.name!r} evaluates by playing episodes, which needs an AR policy; for a "
                         "diffusion policy set task.options.eval_mode: sequence")
    o = task.options
    examples = held_out_examples(task, num_puzzles)
    envs = evaluate_episodes(policy, task, lambda: make_env(default_env(task.name), task, o.max_turns), examples,
                             o.turn_length, batch_size)
    return _summary(task, examples, [], 0, "strict", None, metrics=task.episode_metrics(examples, envs),
                    mode="episodes", max_turns=o.max_turns, max_new_tokens=o.turn_length)
