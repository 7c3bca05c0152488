"""``dlmrl train --dry-run``: everything a run builds that does not need the weights, as a plan to read.

:func:`build_plan` takes a validated :class:`~dlmrl.config.Config` and builds the algorithm preset (its
objective's parts), the training estimator (and its NFE), the task's data sources, prompt templates and
rewards, the sampler's schedule, the batch and scoring sizes that decide memory, the tracker and the
``accelerate`` process state. It reads a local checkpoint's ``config.json`` (never its code) to name the
family; it loads no weights, downloads nothing and contacts no hub (a hub id or hub dataset is only named). The
preset and the estimator are the config's :class:`~dlmrl.config.RunSpec`, the ones validation checked and the run
trains with.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from dlmrl.config import Config, RunSpec, resolve_run


def _model_section(cfg: Config) -> dict:
    from dlmrl.models.ar import resolve_ar_model_path
    from dlmrl.models.loading import resolve_model_path

    m = cfg.model
    out: dict = {"name_or_path": m.name_or_path, "kind": m.kind, "dtype": m.dtype,
                 "trust_remote_code": m.trust_remote_code}
    path = Path((resolve_ar_model_path if m.kind == "ar" else resolve_model_path)(m.name_or_path))
    family = m.family
    config: dict = {}
    if path.is_dir():
        out["source"] = f"local folder {path}"
        if (path / "adapter_config.json").is_file():
            out["source"] += " (a LoRA adapter: its base model is loaded with it)"
        elif (path / "config.json").is_file() and m.kind in ("diffusion", "block"):
            from dlmrl.models.families import detect_family
            from dlmrl.models.loading import needs_remote_code, read_checkpoint_config

            config = read_checkpoint_config(str(path))  # (a json file: no model code runs)
            out["model_type"] = config.get("model_type")
            if family == "auto":
                try:
                    family = f"{detect_family(config)} (detected)"
                except ValueError as e:
                    family = f"auto: {e}"
            out["remote_code"] = needs_remote_code(config)
    else:
        out["source"] = "hub id (not contacted by --dry-run; downloaded by the run)"
    from dlmrl.models.families import FAMILIES

    fam = family.split()[0]  # (the mask id a family fixes when neither tokenizer nor config names one)
    if m.kind == "block":
        out["block_size"] = m.block_size
        prompt = ("the prompt is cut into blocks too, counted back from its end: the family's trained layout" if fam in FAMILIES and FAMILIES.get(fam).prompt_blocks else
                  "the prompt is one clean block every block attends" if fam in FAMILIES else
                  "the prompt's layout is the detected family's: one clean block (tiny) or cut into blocks (sdar)")
        out["attention"] = (f"block-causal: blocks of {m.block_size} tokens, bidirectional inside a block, causal "
                            f"across blocks ({prompt})")
    if m.kind in ("diffusion", "block"):
        out["family"] = family
        default = FAMILIES.get(fam).default_mask_token_id if fam in FAMILIES else None
        if config.get("mask_token_id") is not None:  # (a local config.json, read above)
            out["mask_token_id"] = f"{config['mask_token_id']} (config.json) unless the tokenizer names another"
        elif default is not None:
            out["mask_token_id"] = f"{default} unless the tokenizer or config.json names another"
    out["token_logprobs"] = _token_logprobs_line(cfg, fam)
    if getattr(m, "use_peft", False):
        out["lora"] = {"r": m.lora_r, "alpha": m.lora_alpha, "dropout": m.lora_dropout,
                       "target_modules": m.lora_target_modules}
    elif hasattr(m, "use_peft"):
        out["lora"] = "off (every weight is trained)"
    if hasattr(m, "gradient_checkpointing"):
        out["gradient_checkpointing"] = m.gradient_checkpointing
    return out


def _token_logprobs_line(cfg: Config, family: str) -> str:
    """How scoring takes the chosen tokens' log-probs (``estimator.logits_chunk``), for the model section."""
    from dlmrl.models.canvas_scores import describe_head_split
    from dlmrl.models.families import FAMILIES

    chunk = cfg.estimator.logits_chunk
    if not chunk:
        return ("from full logits: (positions x vocabulary) float32 for every canvas of a forward call "
                "(estimator.logits_chunk 0)")
    if cfg.model.kind == "ar":
        return (f"from the model's output head (get_output_embeddings), completion positions only, {chunk} per "
                "head call, recomputed in the backward (a model that changes the head's output is refused)")
    line = describe_head_split(family if family in FAMILIES else None)
    if family in FAMILIES and FAMILIES.get(family).output_head is None:
        return line
    return f"{line}, scored positions only, {chunk} per head call, recomputed in the backward"


def _algorithm_section(cfg: Config, preset) -> dict:
    o = preset.objective
    out = {"name": preset.name, "reference": preset.reference, "policies": list(preset.policies),
           "advantage": preset.advantage, "ratio_level": o.ratio_level,
           "epsilon": o.epsilon, "epsilon_high": o.epsilon_high if o.epsilon_high is not None else o.epsilon,
           "clip_rule": o.clip_rule, "loss_type": o.loss_type, "beta": o.beta,
           "num_iterations": cfg.train.num_iterations, "steps_per_generation": cfg.train.steps_per_generation}
    # (one optimizer step per rollout batch starts at the policy that sampled it: every ratio is 1)
    one_step = cfg.train.num_iterations == 1 and cfg.train.steps_per_generation == 1
    # each part as it describes itself: its name and settings (weighting only when there is one)
    for kind, part in zip(("clip_rule", "loss_type", "weighting"), o.parts):
        if kind != "weighting" or part.name != "none":
            out[f"{kind}_settings"] = dataclasses.asdict(part)
    if o.beta > 0 and o.kl_reference == "old":
        out["kl"] = f"{o.kl_kind} at {o.kl_level} level, toward the rollout policy" + (
            " (0 with gradient 0 here: one optimizer step per rollout batch, ratio 1; set "
            "train.steps_per_generation > 1)" if one_step and o.kl_kind != "k1" else "")
        out["reference_model"] = "none (the KL is taken toward the rollout policy's own scores)"
    elif o.beta > 0:
        out["kl"] = f"{o.kl_kind} at {o.kl_level} level"
        out["reference_model"] = ("the base under the disabled adapter (no second copy)"
                                  if getattr(cfg.model, "use_peft", False) else "a frozen second copy of the model")
    else:
        out["reference_model"] = "none (beta = 0)"
    if o.ratio_level == "none":
        out["ratio"] = "none: the loss weights the current policy's log-likelihood (no old-policy pass, no clip)"
    elif one_step:
        out["ratio"] = ("1 at every token (one optimizer step per rollout batch, from the policy that sampled it): "
                        "the clip does not act")
    if cfg.train.rollout_is_cap is not None:
        out["rollout_is_cap"] = cfg.train.rollout_is_cap
        out["rollout_correction"] = (f"each token's policy loss x min(exp(logp_old - logp_rollout), "
                                     f"{cfg.train.rollout_is_cap:g}), detached (truncated importance sampling, TRL's "
                                     "vllm_importance_sampling_cap)")
    for part in ("dynamic_sampling", "overlong_cache_fraction", "adaptive_temperature_tau", "anchor_threshold",
                 "multi_turn"):
        value = getattr(preset, part)
        if value not in (None, False):
            out[part] = value
    tr = cfg.train
    if preset.multi_turn:
        from dlmrl.envs import default_env

        out["episodes"] = {"env": tr.env or default_env(cfg.task.name), "max_turns": tr.max_turns,
                           "rows": "one per turn (context, response), the trajectory's final reward on each"}
    elif tr.env is not None:
        from dlmrl.training.run_setup import generation_budget

        out["tools_in_rollout"] = {
            "env": tr.env, "max_turns": tr.max_turns,
            "token_budget": f"{generation_budget(cfg.model.kind, cfg.sampling.gen_length, preset)} tokens per "
                            "trajectory, actions and observations together (" + (
                                "the canvas, sampling.gen_length" if cfg.model.kind != "ar" else
                                "sampling.gen_length + 1, the AR completion width" if preset.overlong_cache_fraction
                                is None else "sampling.gen_length + 1 and DAPO's overlong cache past it; its length "
                                "punishment counts the policy's tokens") + ")",
            "turn_stops_at": {"ar": "the end of the line of its first Action: or Final Answer:",
                              "block": "the end of the block where that line ends (model.block_size)",
                              "diffusion": "the end of the segment where that line ends (sampling.block_length; "
                                           "segment rounds)"}[cfg.model.kind],
            "rows": "one per trajectory: the policy's turns with the environment's observations appended between "
                    "them",
            "observation_tokens": "context only: not in the loss, the log-probs, the KL or entropy terms or any "
                                  "length normalisation",
            "logged": "turns_mean, tool_errors_mean, observation_tokens_mean per step"}
    return out


def _estimator_section(cfg: Config, spec: RunSpec) -> dict:
    """The estimator's own description (:meth:`~dlmrl.estimators.configurable.ConfigurableEstimator.describe`: its
    settings by field name, its NFE and the formula), what chose it, and whether the NFE is a bound."""
    if cfg.model.kind == "ar":
        return {"name": "exact token log-probs (AR)", "nfe": 1}
    d = spec.estimator.describe(cfg.sampling.gen_length)  # (a canvas-dependent NFE: its bound at gen_length)
    out: dict = {"name": spec.estimator_name, "nfe": d.nfe, "nfe_formula": d.nfe_formula, "chosen_by": spec.chosen_by,
                 **d.settings}
    if d.nfe_is_bound or (d.name == "trajectory" and cfg.sampling.adaptive):
        # (data-dependent: the trajectory's steps or tokens; the figure is the bound)
        out["nfe_is"] = "at most, per completion (it depends on the rollout; the run logs nfe_scoring per step)"
    return {**out, **d.notes}


def _task_section(cfg: Config) -> dict:
    from dlmrl.config.task_options import task_options
    from dlmrl.data import TASKS, DatasetTask, SudokuTextTask, TextTask

    t = cfg.task
    cls = TASKS.get(t.name)
    options = task_options(t)
    out: dict = {"name": t.name}
    if issubclass(cls, DatasetTask):
        return {**out, **_dataset_task_section(cfg, cls, options)}
    text_form = t.name != "sudoku" or t.answer_mode == "text"
    if t.name == "sudoku":
        out["answer_mode"] = t.answer_mode
        out["train_data"] = t.train_file or f"generated puzzles ({t.min_blanks}-{t.max_blanks} blanks)"
        out["test_data"] = t.test_file or "the shipped 256-puzzle held-out split"
        out["primary_metric"] = "cell_accuracy"
        out["reward"] = "fraction of blank cells right (d1's Sudoku metric)"
    elif hasattr(cls, "describe"):  # (a task that describes itself: recommend)
        return {**out, **cls.describe(options)}
    elif not issubclass(cls, TextTask):  # (a task registered from outside: its settings as given)
        return {**out, "options": dataclasses.asdict(options), "primary_metric": cls.primary_metric}
    else:
        sources = cls.sources(options)
        for which, (source, split, subset, _) in sources.items():
            local = Path(source).exists()
            where = "local file, checked" if local else "hub dataset, loaded by the run"
            out[f"{which}_data"] = f"{source}{f' [{subset}]' if subset else ''} split {split!r} ({where})"
        out["primary_metric"] = cls.primary_metric
        out["reward"] = f"correctness {cls.CORRECT:g} for a right answer (d1's reward functions)"
    if text_form:
        from dlmrl.data.text_tasks import parse_format_rewards

        text_cls = SudokuTextTask if t.name == "sudoku" else cls
        extra = parse_format_rewards(t.format_rewards, text_cls.d1_format_rewards)
        out["reward"] += f" + format rewards {', '.join(extra)}" if extra else ""
        out["prompt_template"] = t.prompt_template
        out["test_prompt_template"] = t.test_prompt_template or t.prompt_template
        out["chat_template"] = t.chat_template
        out["format_rewards"] = t.format_rewards
    return out


def _dataset_task_section(cfg: Config, cls, options) -> dict:
    """The dataset task's sources, prompt column and reward functions (their names as the logs give them)."""
    from dlmrl.rewards.functions import RewardFunctions

    t, tr = cfg.task, cfg.train
    out: dict = {}
    for which, (source, split, subset, _) in cls.sources(options).items():
        where = "local file, checked" if Path(source).exists() else "hub dataset, loaded by the run"
        out[f"{which}_data"] = f"{source}{f' [{subset}]' if subset else ''} split {split!r} ({where})"
    if "test" not in cls.sources(options):
        out["test_data"] = "none (no held-out evaluation)"
    funcs = RewardFunctions(tr.reward_funcs, tr.reward_weights, "train.reward_funcs")
    out.update(prompt_column=t.prompt_column, chat_template=t.chat_template, primary_metric="mean_reward",
               reward="weighted sum of the reward functions (None = not applicable, left out: TRL's nansum)",
               reward_funcs=[{"name": n, "spec": spec, "weight": float(w)}
                             for n, spec, w in zip(funcs.names, tr.reward_funcs, funcs.weights.tolist())])
    return out


def written_tokens(cfg: Config) -> tuple[int, int, float] | None:
    """``(fewest, most, mean)`` tokens a completion writes when the task infills a canvas (Sudoku's
    ``answer_mode: infill``: only the blank cells are masked, the givens are already there), ``None`` when the
    whole canvas is written. From the training file's puzzles when one is set, else the generator's blank range
    (uniform, so the mean is its midpoint)."""
    t = cfg.task
    if cfg.model.kind not in ("diffusion", "block") or t.name != "sudoku" or t.answer_mode != "infill":
        return None
    if t.train_file:
        from dlmrl.data.sudoku import load_sudoku_file

        counts = [len(e.blanks) for e in load_sudoku_file(t.train_file)]
        return min(counts), max(counts), sum(counts) / len(counts)
    return t.min_blanks, t.max_blanks, (t.min_blanks + t.max_blanks) / 2


def _sampler_section(cfg: Config, written: tuple[int, int, float] | None) -> dict:
    s, ev = cfg.sampling, cfg.eval
    length = s.gen_length  # (validate holds Sudoku's grid modes to 16)
    if cfg.model.kind == "ar":
        from dlmrl.config.resolve import build_preset
        from dlmrl.training.run_setup import generation_budget

        budget = generation_budget("ar", length, build_preset(cfg))  # (DAPO: its overlong cache past the answer)
        return {"kind": "left to right (generate)", "max_new_tokens": budget, "temperature": s.temperature,
                "nfe_per_completion": f"at most {budget}"}
    if cfg.model.kind == "block":
        return _block_sampler_section(cfg, written)
    blocks = length // s.block_length
    cfg_factor = 2 if s.cfg_scale > 0 else 1
    out = {"gen_length": length, "block_length": s.block_length, "blocks": blocks, "steps": s.steps,
           "steps_per_block": s.steps // blocks, "tokens_per_step": round(length / s.steps, 3),
           "temperature": s.temperature, "remasking": s.remasking, "cfg_scale": s.cfg_scale,
           "threshold": s.threshold, "threshold_factor": s.threshold_factor, "cache": s.cache,
           "nfe_per_completion": s.steps * cfg_factor}
    if written is not None:  # (infill: a step reveals its share of the blank cells, not of the whole canvas)
        lo, hi, mean = written
        out["tokens_per_step"] = round(mean / s.steps, 3)
        out["tokens_note"] = (f"infill: only the blank cells are written ({lo}-{hi} of the {length} canvas cells, "
                              f"mean {mean:g}), revealed over the denoising steps")
    if s.cache != "none":
        out["cache_note"] = (f"{s.cache} cache (Fast-dLLM): a block's first pass runs over the whole sequence, its "
                             "later passes reuse the keys/values " + ("before the block" if s.cache == "prefix"
                                                                     else "outside the block") +
                             " (an approximation; with the trajectory estimator at merge 1 the run logs rollout_logp_gap_mean/max)")
    if s.adaptive:  # (threshold decoding: the steps depend on the model's confidence)
        rule = (f"reveal every masked position with confidence >= {s.threshold:g}" if s.threshold is not None
                else f"reveal the longest run of the most confident masked positions with confidence >= "
                     f"1 - {s.threshold_factor:g} / (n + 1)")
        out.update({"decoding": f"threshold (Fast-dLLM): {rule}, at least one per step; each block runs until "
                                "decoded (steps unused)",
                    "steps_per_block": f"1 to {s.block_length} (data-dependent)",
                    "tokens_per_step": "at least 1 (data-dependent)",
                    "nfe_per_completion": f"at most {length * cfg_factor} (data-dependent; the run logs "
                                          "nfe_sampling, the mean per completion)"})
    out.update(_early_stop(cfg, out["nfe_per_completion"]))
    out["eval"] = {"steps": ev.steps, "temperature": ev.temperature, "batch_size": ev.batch_size,
                   "examples": ev.num_puzzles or "the whole held-out split"}
    if s.adaptive or s.cache != "none":
        out["eval"]["decoding"] = ("the plain schedule (eval.steps), no cache; the threshold and the cache apply to "
                                   "rollouts")
    return out


def _block_sampler_section(cfg: Config, written: tuple[int, int, float] | None) -> dict:
    """The block-diffusion sampler: blocks of ``model.block_size`` left to right, each denoised against the exact
    key/value cache of the prompt and the finished blocks (``block_generate``)."""
    s, ev, b = cfg.sampling, cfg.eval, cfg.model.block_size
    length = s.gen_length
    blocks = -(-length // b)
    per_block = s.steps // blocks
    out = {"kind": "block diffusion (block_generate)", "gen_length": length, "block_size": b, "blocks": blocks,
           "steps": s.steps, "steps_per_block": per_block,
           "tokens_per_step": round((written[2] if written else length) / s.steps, 3),
           "temperature": s.temperature, "remasking": s.remasking, "threshold": s.threshold,
           "threshold_factor": s.threshold_factor,
           "cache": "exact key/value cache of the prompt and the finished blocks (built once per block)",
           "nfe_per_completion": s.steps, "cache_passes_per_completion": blocks}
    if s.adaptive:
        out.update({"decoding": "threshold (Fast-dLLM) inside each block, at least one token per step",
                    "steps_per_block": f"1 to {b} (data-dependent)", "tokens_per_step": "at least 1",
                    "nfe_per_completion": f"at most {length} (data-dependent)"})
    out.update(_early_stop(cfg, out["nfe_per_completion"]))
    if ev.preset == "none":
        out["eval"] = {"steps": ev.steps, "steps_per_block": ev.steps // blocks if ev.steps % blocks == 0 else None,
                       "temperature": ev.temperature, "batch_size": ev.batch_size,
                       "examples": ev.num_puzzles or "the whole held-out split"}
    return out


def _early_stop(cfg: Config, nfe) -> dict:
    """``sampling.stop_at_eos`` as the rollout resolves it (:func:`dlmrl.training.rollout.stops_at_eos`: null = on
    for the block kind when the tokenizer has an EOS), and the NFE figure it makes a bound."""
    setting = cfg.sampling.stop_at_eos
    on = setting if setting is not None else cfg.model.kind == "block"
    if cfg.train.env is not None:  # (tools inside the rollout: the loop ends each turn itself)
        return {"stop_at_eos": "does not apply: the tool loop ends each turn itself"}
    if not on:
        return {"stop_at_eos": "off: every block is decoded"}
    bound = nfe if isinstance(nfe, str) else f"at most {nfe}"
    return {"stop_at_eos": ("a row ends at the block holding its first EOS (its later blocks: EOS, no loss); a "
                            "sampling call stops once all its rows have" + (" (the kind's default; needs an EOS in "
                            "the tokenizer)" if setting is None else "")),
            "nfe_per_completion": bound.split(" (")[0] + " (fewer when rows end early; the run logs nfe_sampling)"}


def _rollout_rows(cfg: Config, processes: int) -> dict:
    """Rows one process samples per rollout step and per sampling call (``sampling.rollout_batch_size``): its share of
    the prompts (whole groups; the largest share when they do not split evenly) times G."""
    tr, size = cfg.train, cfg.sampling.rollout_batch_size
    rows = -(-tr.prompts_per_step // processes) * tr.num_generations
    per_call = min(size, rows) if size else rows
    return {"rows_per_process": rows, "rows_per_sampling_call": per_call,
            "sampling_calls_per_process": -(-rows // per_call),
            "rollout_batch_size": size or "0 (the process's rows in one call)"}


def _accelerate_section() -> dict:
    """The process state ``accelerate`` sets up (``PartialState``; no model, no optimizer)."""
    try:
        from accelerate import PartialState

        state = PartialState()
    except Exception as e:  # noqa: BLE001 (a broken launch setup is reported in the plan)
        return {"error": f"{type(e).__name__}: {e}"}
    out = {"num_processes": state.num_processes, "process_index": state.process_index, "device": str(state.device),
           "distributed_type": str(state.distributed_type).split(".")[-1],
           "mixed_precision": os.environ.get("ACCELERATE_MIXED_PRECISION", "no")}
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
        out["deepspeed_zero_stage"] = os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE")
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true":
        out["fsdp_sharding_strategy"] = (os.environ.get("FSDP_SHARDING_STRATEGY")
                                         or os.environ.get("FSDP_RESHARD_AFTER_FORWARD"))
    return out


def _sizes_section(cfg: Config, nfe_scoring: int, processes: int, written: tuple[int, int, float] | None) -> dict:
    tr, e = cfg.train, cfg.estimator
    rows = tr.prompts_per_step * tr.num_generations
    out: dict = {"prompts_per_step": tr.prompts_per_step, "num_generations": tr.num_generations,
                 "completions_per_step": rows}
    if processes > 1:
        # (the trainer's rule, distributed.check_process_split: whole groups, so prompts split over processes)
        out["completions_per_process"] = (rows // processes if tr.prompts_per_step % processes == 0
                                          else f"{tr.prompts_per_step} prompts do not split over {processes} "
                                               "processes")
    length = cfg.sampling.gen_length  # (validate holds Sudoku's grid modes to 16)
    tokens = rows * length if written is None else round(rows * written[2], 1)
    out["completion_tokens_per_step"] = int(tokens) if tokens == int(tokens) else tokens  # (4096, not 4096.0)
    if written is not None:
        out["completion_tokens_note"] = (f"mean over the data: {rows} completions x {written[2]:g} blank cells "
                                         f"(infill; the canvas is {length} tokens, {rows * length} in all)")
    out["rollout"] = _rollout_rows(cfg, processes)
    if cfg.model.kind in ("diffusion", "block"):
        # (an optimizer step scores one mini-batch of the batch with grad: train.steps_per_generation, cut into whole
        # groups; each process scores its share of the mini-batch's groups: the figures are one process's, its
        # largest share)
        groups = -(-tr.prompts_per_step // tr.steps_per_generation)
        canvases = -(-groups // processes) * tr.num_generations * nfe_scoring
        if cfg.model.kind == "block":  # (each scoring canvas is a composite pass over [prompt | noisy | clean])
            out["scoring_pass"] = "composite: every block's noised copy next to the clean completion, 2L positions"
        out["scoring_canvases_per_update"] = canvases  # (at most, for data-dependent NFE)
        out["canvases_per_forward"] = min(e.micro_batch, canvases) if e.micro_batch else canvases
        out["scoring"] = ("two-pass chunks of estimator.micro_batch (memory of one chunk)"
                          if e.micro_batch and e.micro_batch < canvases else "one call with grad")
    out.update(_update_structure(cfg, processes))
    out["max_steps"] = tr.max_steps
    return out


def _update_structure(cfg: Config, processes: int) -> dict:
    """How a rollout batch becomes optimizer steps: ``num_iterations`` passes of ``steps_per_generation``
    mini-batches of whole groups (:func:`dlmrl.training.update.split_minibatches`), and the LR schedule's length
    in optimizer steps."""
    tr = cfg.train
    count, passes = tr.steps_per_generation, tr.num_iterations
    per_step = passes * count
    out: dict = {"updates_per_step": per_step, "steps_per_generation": count}
    groups = tr.prompts_per_step // count if tr.prompts_per_step % count == 0 else tr.prompts_per_step / count
    out["minibatch"] = {"groups": groups, "completions": groups * tr.num_generations}
    if processes > 1:
        out["minibatch"]["groups_per_process"] = (
            groups / processes if groups % processes else groups // processes) if groups >= processes else (
            f"{groups} groups over {processes} processes: {processes - groups} process(es) score no row in each "
            "optimizer step")
    order = (f"{passes} pass(es) over the batch, each in {count} mini-batches of {groups} whole groups "
             f"({groups * tr.num_generations} completions; groups shuffled per rollout step, the same split for "
             "every pass), one optimizer step each; each mini-batch's loss is its own mean in the preset's "
             "aggregation" if count > 1 else
             f"{passes} optimizer step(s), each on the whole batch")
    out["update_order"] = order + ("; old-policy scores from the rollout policy, once per batch, so from the second "
                                   "optimizer step on the ratio differs from 1" if per_step > 1 else
                                   "; the only step starts at the rollout policy (ratio 1)")
    out["lr_schedule"] = (f"{tr.max_steps * per_step} optimizer steps ({tr.max_steps} rollout steps x {per_step}), "
                          f"warm-up {tr.warmup_steps * per_step}")
    return out


def _memory_section(cfg: Config, nfe, processes: int, preset) -> dict:
    """The memory plan per process in GB, term by term (:func:`dlmrl.training.memory_config.memory_section`; ``nfe``
    the estimator's, a bound when data-dependent)."""
    from dlmrl.training.memory_config import memory_section

    return memory_section(cfg, nfe if isinstance(nfe, int) else 1, processes, preset.objective)


def _tracker_section(cfg: Config) -> dict:
    name = cfg.train.report_to
    out = {"report_to": name, "metrics_jsonl": "always"}
    if name != "none":
        out["project_dir"] = str(Path(cfg.output_dir))
    return out


def run_processes(accel: dict) -> int:
    """The processes the run will train with: ``accelerate launch --cpu --num_processes N`` without mpirun starts
    this process alone and ``dlmrl train`` then starts the N itself; otherwise the launch's ``WORLD_SIZE`` or
    accelerate's process count, whichever is larger (the run refuses a launch accelerate did not join)."""
    from dlmrl.training.distributed import launched_processes, requested_cpu_processes

    return requested_cpu_processes() or max(launched_processes(), int(accel.get("num_processes", 1)))


def build_plan(cfg: Config, resume: bool = False, spec: RunSpec | None = None, processes: int | None = None) -> dict:
    """The run's plan: sections ``model``, ``algorithm``, ``estimator``, ``task``, ``sampler``, ``sizes``,
    ``memory`` (per process, in GB), ``tracker``, ``accelerate``, ``output`` (plain values, YAML-printable). ``cfg``
    must be validated (:func:`dlmrl.config.validate`); nothing is loaded but local ``config.json`` files and local
    data files.
    ``resume``: the output state says which checkpoint ``--resume`` would continue from (and the run's refusals
    apply: no checkpoint, settings that differ from the run's own). ``spec``: the config resolved
    (:func:`~dlmrl.config.validate` returns it; default: resolved here), whose preset and estimator the plan shows.
    ``processes``: plan for that many processes instead of this launch's (``dlmrl train --dry-run --num-processes
    N``: the sizes and memory of the launch you will run elsewhere, e.g. 8 GPUs, planned on a laptop).

    Raises:
        ConfigError: what the run would refuse before loading a model, for the processes it would start (a batch
            that does not split over them, a preset that needs one process); with ``resume``, settings other than the
            run's own.
        FileNotFoundError: ``resume`` with no checkpoint in the output folder.
    """
    from dlmrl.training.distributed import check_process_split, check_sharding_backend

    spec = spec or resolve_run(cfg)
    preset = spec.preset
    written = written_tokens(cfg)  # (an infill task's blanks: read from its training file once for two sections)
    estimator = _estimator_section(cfg, spec)
    accel = _accelerate_section()
    planned = processes is not None
    processes = processes if planned else run_processes(accel)
    check_process_split(cfg, processes, spec.preset)  # (the run's own check, with the run's process count)
    check_sharding_backend()
    if planned:
        accel["planned_processes"] = processes  # (--num-processes: sizes and memory are for that launch)
    elif processes != accel.get("num_processes", processes):
        accel["processes_the_run_trains_with"] = processes
    out_dir = Path(cfg.output_dir)
    if resume:  # the run's own check: a checkpoint to continue from, and the run's own settings
        from dlmrl.training.run_folder import check_run_folder

        ckpt = check_run_folder(cfg, resume=True)
        state = f"resumes from {ckpt}" if ckpt is not None else "resumes from step 0 (stopped before its first checkpoint)"
    elif (out_dir / "config.yaml").exists() or (out_dir / "checkpoints").is_dir():
        state = "holds a run (use --resume or a new --output-dir)"
    else:
        state = "new"
    return {
        "model": _model_section(cfg),
        "algorithm": _algorithm_section(cfg, preset),
        "estimator": estimator,
        "task": _task_section(cfg),
        "sampler": _sampler_section(cfg, written),
        "sizes": _sizes_section(cfg, estimator["nfe"], processes, written),
        "memory": _memory_section(cfg, estimator["nfe"], processes, preset),
        "tracker": _tracker_section(cfg),
        "accelerate": accel,
        "output": {"output_dir": str(out_dir),
                   "state": state},
    }


def format_plan(plan: dict) -> str:
    """The plan as YAML, sections in build order."""
    import yaml

    return yaml.safe_dump(plan, sort_keys=False, width=110, allow_unicode=True)
