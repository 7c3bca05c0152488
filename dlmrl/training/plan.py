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
from dlmrl.kinds import kind_of


def _model_section(cfg: Config) -> dict:
    m = cfg.model
    kind = kind_of(m.kind)
    out: dict = {"name_or_path": m.name_or_path, "kind": m.kind, "dtype": m.dtype,
                 "trust_remote_code": m.trust_remote_code}
    path = Path(kind.model_path(m.name_or_path))
    if path.is_dir():
        out["source"] = f"local folder {path}"
        if (path / "adapter_config.json").is_file():
            out["source"] += " (a LoRA adapter: its base model is loaded with it)"
    else:
        out["source"] = "hub id (not contacted by --dry-run; downloaded by the run)"
    out.update(kind.plan_model(cfg, path))  # (the family, its mask id, a block model's attention)
    out["token_logprobs"] = _token_logprobs_line(cfg, str(out.get("family", m.family)).split()[0])
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
    if not cfg.estimator.logits_chunk:
        return ("from full logits: (positions x vocabulary) float32 for every canvas of a forward call "
                "(estimator.logits_chunk 0)")
    return kind_of(cfg.model.kind).plan_token_logprobs(cfg, family)


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
        if cfg.train.sync_ref_model:
            tr = cfg.train
            lora = getattr(cfg.model, "use_peft", False)
            total = tr.max_steps * _updates_per_step(tr)  # (optimizer steps in the run)
            out["reference_model"] = (
                ("the base with a second adapter" if lora else "a second copy of the model")
                + f" that follows the policy: every {tr.ref_model_sync_steps} optimizer steps ref <- "
                f"{tr.ref_model_mixup_alpha:g} x policy + {1 - tr.ref_model_mixup_alpha:g} x ref"
                + (" (mixed on the adapter factors lora_A and lora_B)" if lora else "")
                + " (train.sync_ref_model; TRL's sync_ref_model)"
                + (f"; never within the {total} optimizer steps of this run: lower train.ref_model_sync_steps"
                   if tr.ref_model_sync_steps > total else ""))
    else:
        out["reference_model"] = "none (beta = 0)"
    if o.ratio_level == "none":
        out["ratio"] = "none: the loss weights the current policy's log-likelihood (no old-policy pass, no clip)"
    elif one_step:
        out["ratio"] = ("1 at every token (one optimizer step per rollout batch, from the policy that sampled it): "
                        "the clip does not act")
    out["collapse_monitor"] = _collapse_line(cfg.train, watches_kl=o.beta > 0)
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
        kind = kind_of(cfg.model.kind)
        out["tools_in_rollout"] = {
            "env": tr.env, "max_turns": tr.max_turns,
            "token_budget": f"{kind.generation_budget(cfg.sampling.gen_length, preset)} tokens per trajectory, "
                            f"actions and observations together ({kind.plan_budget(preset)})",
            "turn_stops_at": kind.turn_stops_at,
            "rows": "one per trajectory: the policy's turns with the environment's observations appended between "
                    "them",
            "observation_tokens": "context only: not in the loss, the log-probs, the KL or entropy terms or any "
                                  "length normalisation",
            "logged": "turns_mean, tool_errors_mean, observation_tokens_mean per step"}
    return out


def _collapse_line(tr, watches_kl: bool) -> str:
    """What the collapse monitor (:mod:`dlmrl.training.collapse`) watches and does, from ``train.collapse_*``: its
    own rule (:func:`~dlmrl.training.collapse.watched`), the KL left out of the line when the run has none."""
    from dlmrl.training.collapse import FLOORS, watched

    if tr.collapse_window <= 0:
        return "off (train.collapse_window 0): sample_nll (and kl) are still logged, nothing fires"
    phrase = {"rise": f"above {tr.collapse_ratio:g} x", "fall": f"below 1/{tr.collapse_ratio:g} x"}
    groups: dict[tuple[str, ...], list[str]] = {}  # (the series that fire the same ways share a phrase)
    for series, ways in watched(tr.collapse_direction).items():
        if ways and (series != "kl" or watches_kl):
            groups.setdefault(ways, []).append(series)
    rule = ", or ".join(f"{' or '.join(names)} {' or '.join(phrase[w] for w in ways)}" for ways, names in groups.items())
    action = ("warns and stops after that step's checkpoint (train.stop_on_collapse)" if tr.stop_on_collapse
              else "warns")
    floor = f"; a kl baseline under {FLOORS['kl']:g} is not multiplied" if any("kl" in n for n in groups.values()) else ""
    return (f"{action} when {rule} the median of its previous {tr.collapse_window} steps "
            f"(train.collapse_direction {tr.collapse_direction}, collapse_ratio, collapse_window{floor})")


def _estimator_section(cfg: Config, spec: RunSpec) -> dict:
    """The likelihood the kind trains with (:meth:`~dlmrl.kinds.base.PolicyKind.plan_estimator`: an estimator's own
    description, its NFE, what chose it)."""
    return kind_of(cfg.model.kind).plan_estimator(cfg, spec)


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
    if not kind_of(cfg.model.kind).denoises or t.name != "sudoku" or t.answer_mode != "infill":
        return None
    if t.train_file:
        from dlmrl.data.sudoku import load_sudoku_file

        counts = [len(e.blanks) for e in load_sudoku_file(t.train_file)]
        return min(counts), max(counts), sum(counts) / len(counts)
    return t.min_blanks, t.max_blanks, (t.min_blanks + t.max_blanks) / 2


def _sampler_section(cfg: Config, preset, written: tuple[int, int, float] | None) -> dict:
    """The kind's sampler (:meth:`~dlmrl.kinds.base.PolicyKind.plan_sampler`)."""
    return kind_of(cfg.model.kind).plan_sampler(cfg, preset, written)


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
    tr = cfg.train
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
    out.update(kind_of(cfg.model.kind).plan_scoring(cfg, nfe_scoring, processes))  # (canvases scored per update)
    out.update(_update_structure(cfg, processes))
    out["max_steps"] = tr.max_steps
    return out


def _updates_per_step(tr) -> int:
    """Optimizer steps per rollout step: ``num_iterations`` passes of ``steps_per_generation`` mini-batches."""
    return tr.num_iterations * tr.steps_per_generation


def _update_structure(cfg: Config, processes: int) -> dict:
    """How a rollout batch becomes optimizer steps: ``num_iterations`` passes of ``steps_per_generation``
    mini-batches of whole groups (:func:`dlmrl.training.update.split_minibatches`), and the LR schedule's length
    in optimizer steps."""
    tr = cfg.train
    count, passes = tr.steps_per_generation, tr.num_iterations
    per_step = _updates_per_step(tr)
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
        "sampler": _sampler_section(cfg, preset, written),
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
