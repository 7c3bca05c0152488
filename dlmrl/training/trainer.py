"""The group-optimizer trainer: one loop that reads top to bottom (rollout, reward, advantages, old scores,
μ updates, log, checkpoint), on ``accelerate``.

``train.algorithm`` picks a preset (:data:`dlmrl.objectives.presets.ALGORITHMS`): its
:class:`~dlmrl.objectives.objective.GroupObjective` is the loss over per-token scores and its advantage
estimator turns rewards into advantages. ``model.kind`` picks the policy: ``diffusion`` (masked-diffusion
sampler, per-token ELBO contributions on MaskPlans) or ``ar`` (``generate``, exact token log-probs); see
:mod:`dlmrl.training.rollout`. The default (``gdpo`` on the tiny diffusion model) is GDPO.

The presets' rollout-side parts run here too: DAPO's dynamic sampling resamples new prompts until the batch
holds ``prompts_per_step`` groups whose rewards differ (bounded extra rounds), DaGRPO adds the reference
solution as an off-policy anchor row to each failed group, Flow-GRPO plays multi-turn episodes in an
environment (:mod:`dlmrl.envs`, :mod:`dlmrl.training.episodes`) with one training row per turn. Rows therefore
carry their own group (and trajectory) ids. ``train.max_completions`` ends a run once that many completions
have been sampled (an equal rollout budget across algorithms).

Every random draw of step ``s`` comes from a generator seeded with ``(seed, s)``, so a run resumed
from a checkpoint takes exactly the same steps as an uninterrupted one.

:func:`train` loads the configured model and builds the configured task, or takes them already built (the Python
API, :class:`dlmrl.api.Trainer`, passes its policy and its dataset task), and calls the run's callbacks
(:mod:`dlmrl.training.callbacks`).
Reference: GDPO, arXiv 2510.08554 (Algorithm 1).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import shutil
import signal
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator, DistributedDataParallelKwargs
from tqdm.auto import tqdm
from transformers import get_scheduler

from dlmrl.config import (
    Config,
    ConfigError,
    RunSpec,
    check_cache_family,
    flatten,
    load_yaml,
    resolve_run,
    save_yaml,
    to_dict,
    validate,
)
from dlmrl.data.encoding import pad_token_id
from dlmrl.envs import default_env, make_env
from dlmrl.models.ar import HapoTemperature
from dlmrl.models.loading import load_policy
from dlmrl.models.lora import (
    AdapterDisabledPolicy,
    is_peft_model,
    prepare_for_training,
    register_adapter_checkpointing,
    save_final_model,
)
from dlmrl.models.sampler import left_to_right_reveal_steps
from dlmrl.objectives.advantage_registry import AdvantageInputs
from dlmrl.objectives.entropy import HapoEntropyStats, hapo_entropy_stats
from dlmrl.objectives.objective import GroupObjective
from dlmrl.objectives.pairwise import ngram_jaccard
from dlmrl.objectives.segments import delimiter_token_ids, sentence_segments
from dlmrl.objectives.shaping import soft_overlong_punishment
from dlmrl.rewards.functions import RewardFunctions, ScoresEachReward
from dlmrl.training.callbacks import Callbacks
from dlmrl.training.checkpoint import atomic_dir, latest_checkpoint, staging_dir, write_json_atomic
from dlmrl.training.distributed import (
    Processes,
    check_process_split,
    check_sharding_backend,
    gather_rollout,
    group_share,
    launched_processes,
    loss_share,
)
from dlmrl.training.episodes import rollout_episodes, trajectory_reward_parts, trajectory_rewards
from dlmrl.training.evaluation import evaluate_with_config, primary_metric
from dlmrl.training.logging import MetricsWriter, plot_curves, read_metrics
from dlmrl.training.rollout import (
    ARScorer,
    DiffusionScorer,
    Rollout,
    RolloutMismatch,
    SamplingStats,
    add_anchors,
    example_key,
    fill_informative_groups,
    fresh_prompts,
    rollout_ar,
    rollout_diffusion,
)

#: the objective's metrics averaged over a step's μ updates (and combined over processes)
UPDATE_METRICS = ("loss", "ratio_mean", "ratio_min", "ratio_max", "clip_frac_low", "clip_frac_high", "kl")


@dataclass
class RunState:
    """What a checkpoint needs beyond model/optimizer/scheduler: the next step, eval-before, the cumulative
    rollout counts (``completions_total``, ``nfe_sampling_total``) and HAPO's previous-step statistics."""

    step: int = 0
    eval_before: dict | None = None
    train_seconds: float = 0.0
    hapo_stats: dict | None = None  # HAPO: the previous step's entropy statistics (adaptive temperature)
    completions_total: int = 0  # sampled completions so far (every round, every turn; not anchors)
    nfe_sampling_total: int | float = 0  # the steps' nfe_sampling summed (threshold decoding: means, fractional)

    def state_dict(self) -> dict:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict) -> None:
        self.step, self.eval_before = state["step"], state["eval_before"]
        self.train_seconds = state.get("train_seconds", 0.0)
        self.hapo_stats = state.get("hapo_stats")
        self.completions_total = state.get("completions_total", 0)
        self.nfe_sampling_total = state.get("nfe_sampling_total", 0)


def check_same_config(cfg: Config, saved_path: Path) -> None:
    """Refuse to resume a run with settings other than the ones it was started with.

    ``output_dir`` and ``estimator.micro_batch`` may differ (e.g. a smaller micro_batch to fit another machine).

    Raises:
        ConfigError: listing the keys whose values differ from the saved ``config.yaml``.
    """
    saved = Config()
    load_yaml(saved, saved_path)
    old, new = dict(flatten(to_dict(saved))), dict(flatten(to_dict(cfg)))
    free = ("output_dir", "estimator.micro_batch")  # micro_batch changes memory and speed, not the steps taken
    diff = [f"{k}: {old[k]!r} -> {new[k]!r}" for k in old if k not in free and old[k] != new[k]]
    if diff:
        raise ConfigError(f"--resume must use the run's own settings ({saved_path}); these differ: "
                          + "; ".join(diff))


def check_run_folder(cfg: Config, resume: bool) -> Path | None:
    """The output folder's state against ``--resume``: the checkpoint to resume from (``None`` for a new run).

    Raises:
        FileNotFoundError: ``resume`` with no checkpoint and no run in ``output_dir``, or with checkpoints but
            no ``config.yaml``. A run stopped before its first checkpoint resumes from step 0 (``None``).
        ConfigError: a new run into a folder that holds one, or a resume with other settings
            (:func:`check_same_config`).
    """
    out = Path(cfg.output_dir)
    ckpt = latest_checkpoint(out) if resume else None
    if resume and ckpt is None:
        if not (out / "config.yaml").exists():
            raise FileNotFoundError(f"--resume: no checkpoint under {out / 'checkpoints'}")
        # stopped before its first checkpoint (Ctrl-C in the first evaluation, kill -9 before save_steps):
        # nothing to continue, so the run starts again from step 0 with its own settings (the same seeds
        # give the same run)
        check_same_config(cfg, out / "config.yaml")
        return None
    if resume and not (out / "config.yaml").exists():
        raise FileNotFoundError(f"--resume: {out} has checkpoints but no config.yaml (the run's settings); "
                                "restore it, or start a new run in another --output-dir")
    if not resume and (latest_checkpoint(out) is not None or (out / "config.yaml").exists()):
        raise ConfigError(f"output_dir {out} already holds a run; "
                          "continue that run with --resume or choose a new --output-dir")
    if resume and (out / "config.yaml").exists():
        check_same_config(cfg, out / "config.yaml")
    return ckpt


def step_generator(seed: int, step: int) -> torch.Generator:
    """The generator all randomness of one step comes from."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def canvas_token_id(policy) -> int | None:
    """The token a task writes on the canvas: the policy's mask id (an AR policy has none; its tokenizer may)."""
    mask_id = getattr(policy, "mask_token_id", None)
    return mask_id if mask_id is not None else getattr(policy.tokenizer, "mask_token_id", None)


def build_task(cfg: Config, policy):
    """The configured task (:func:`dlmrl.config.build_task`; text tasks get a canvas of ``sampling.gen_length``; the
    dataset task gets the reward functions of ``train.reward_funcs`` and ``train.reward_weights``)."""
    from dlmrl.config.task_options import build_task as build_data_task

    tr = cfg.train
    options = ({"reward_functions": RewardFunctions(tr.reward_funcs, tr.reward_weights, "train.reward_funcs")}
               if tr.reward_funcs else {})
    return build_data_task(cfg.task, policy.tokenizer, canvas_token_id(policy), gen_length=cfg.sampling.gen_length,
                           **options)


def build_estimator(cfg: Config, spec: RunSpec | None = None):
    """The training estimator of the config's ``estimator`` section (``estimator.name`` null: the algorithm
    preset's recipe estimator, else sdmc; see :func:`dlmrl.config.estimator_name`): ``spec``'s, the run's resolved
    config (:func:`dlmrl.config.validate` returns it), else the config resolved here."""
    return (spec or resolve_run(cfg)).estimator


def group_loss_fn(objective: GroupObjective, old: torch.Tensor | None, advantages: torch.Tensor,
                  mask: torch.Tensor, row_weight: float = 1.0, mismatch: RolloutMismatch | None = None, **inputs):
    """The loss of one μ update as a function of the current policy's per-token scores.

    Returns ``per_token (B', L) -> (row_weight · objective(per_token, old, advantages, mask, **inputs),
    metrics)``; ``old`` ``None`` (the first update, where old = current) uses ``per_token`` detached
    (ratio 1). ``inputs`` are :meth:`GroupObjective.compute`'s keyword inputs (``logp_ref``, ``entropy``,
    ``segment_ids``, ``group_ids``, ``num_tokens``). With the ``gdpo`` preset this is
    :func:`dlmrl.objectives.gdpo_loss` on ``per_token.sum(-1)``. ``mismatch``: the old-policy scores it uses are
    given to :meth:`RolloutMismatch.observe` (the first update's are kept), and with a cap its weights
    ``min(exp(logp_old − logp_rollout), C)`` multiply each token's policy loss (``weights`` of the objective).
    """
    def loss_fn(per_token: torch.Tensor):
        logp_old = per_token.detach() if old is None else old
        extra = inputs
        if mismatch is not None:
            mismatch.observe(logp_old)
            w = mismatch.weights()
            if w is not None:
                extra = {**inputs, "weights": w.to(per_token.dtype)}
        loss, metrics = objective(per_token, logp_old, advantages, mask, **extra)
        return loss * row_weight, metrics

    return loss_fn


def measures_rollout_mismatch(scorer) -> bool:
    """Whether the scorer's old-policy scores are log-probs of the distribution the sampler drew from: the
    ``trajectory`` estimator with merge 1 and the sampled order (the trainer then logs the rollout log-prob gap
    and may correct it, ``train.rollout_is_cap``). Merged canvases (merge > 1) score a token from an earlier canvas
    than the one it was drawn from, and the ELBO estimators' per-token terms are no token log-probs, so the gap is
    not defined there (not logged)."""
    from dlmrl.estimators.trajectory import Trajectory

    est = getattr(scorer, "estimator", None)
    return isinstance(est, Trajectory) and est.merge == 1 and est.order == "sampled"


def mismatch_metrics(mismatch: RolloutMismatch | None, processes: Processes, cap: float | None) -> dict:
    """The step's ``rollout_logp_gap_mean`` / ``rollout_logp_gap_max`` (mean and max ``|logp_old − logp_rollout|``
    per sampled token of the scored rows, over every process) and, with a cap, ``rollout_is_weight_mean``;
    ``None`` values when no token was scored. ``mismatch`` ``None``: this process scored no rows of its own."""
    part = ((*mismatch.gap(), mismatch.weight_sum()) if mismatch is not None and mismatch.logp_old is not None
            else (0.0, 0, 0.0, 0.0))
    parts = processes.gather(part)
    total, count = sum(p[0] for p in parts), sum(p[1] for p in parts)
    out = {"rollout_logp_gap_mean": total / count if count else None,
           "rollout_logp_gap_max": max(p[2] for p in parts if p[1]) if count else None}
    if cap is not None:
        out["rollout_is_weight_mean"] = sum(p[3] for p in parts) / count if count else None
    return out


def shaped_rewards(preset, rewards: torch.Tensor, lengths: torch.Tensor, max_length: int) -> torch.Tensor:
    """Task rewards plus DAPO's soft overlong punishment when the preset asks for it
    (``L_cache = round(fraction · L_max)``, at least 1)."""
    if preset.overlong_cache_fraction is None:
        return rewards
    cache = max(1, round(preset.overlong_cache_fraction * max_length))
    return rewards + soft_overlong_punishment(lengths, max_length, cache)


def sample_groups(policy, task, cfg: Config, preset, examples: list, generator: torch.Generator, max_length: int,
                  temperature_fn=None, env: str | None = None, processes: Processes | None = None,
                  pad_id: int = 0) -> Rollout:
    """Step 1 for one batch of prompts: G completions per prompt (``env``: G episodes per prompt, one row per
    turn, :func:`dlmrl.training.episodes.rollout_episodes`) with ``rewards`` (task) and ``train_rewards``
    (plus DAPO's soft overlong punishment when the preset has it; episodes: the trajectory's final reward).

    With several ``processes`` each samples (and rewards) its share of the prompts, every row with the random
    numbers it has in the whole batch, and the shares are gathered: every process returns the whole batch
    (:mod:`dlmrl.training.distributed`)."""
    G = cfg.train.num_generations
    share = processes.share(len(examples)) if processes is not None and processes.count > 1 else None
    if env is not None:
        ro = rollout_episodes(policy, task, lambda: make_env(env, task, cfg.train.max_turns),
                              examples if share is None else examples[share[0] : share[1]], G, generator,
                              max_length, cfg.sampling.temperature, temperature_fn,
                              processes if share is not None else None)
        return ro if share is None else gather_rollout(ro, processes, pad_id)
    if cfg.model.kind == "ar":
        ro = rollout_ar(policy, task, cfg, examples, generator, max_new_tokens=max_length,
                        temperature_fn=temperature_fn, prompts=share)
    else:
        ro = rollout_diffusion(policy, task, cfg, examples, generator, prompts=share)
    texts = task.decode(ro.completion)
    if isinstance(task, ScoresEachReward):  # (a sum of reward functions: each one's values are logged too)
        ro.reward_parts = task.reward_table(ro.examples, texts)  # (B, F), NaN where a function returned None
        ro.rewards = task.reward_functions.combine(ro.reward_parts)  # (B,) TRL's weighted nansum
    else:
        ro.rewards = torch.tensor(task.rewards(ro.examples, texts), dtype=torch.float32)  # (B,)
    ro.train_rewards = shaped_rewards(preset, ro.rewards, ro.completion_mask.sum(-1).cpu(), max_length)
    return ro if share is None else gather_rollout(ro, processes, pad_id)


def sample_step(policy, task, cfg: Config, preset, step: int, generator: torch.Generator, max_length: int,
                temperature_fn=None, env: str | None = None, pad_id: int = 0,
                processes: Processes | None = None) -> tuple[Rollout, SamplingStats]:
    """Step 1 of the loop: the step's prompts (``task.train_batch(prompts_per_step, seed, step)``) sampled with
    :func:`sample_groups`; with the preset's dynamic sampling (DAPO), groups of equal rewards are dropped and
    new prompts (:func:`~dlmrl.training.rollout.fresh_prompts`, none drawn before in the step) sampled, at
    most ``dynamic_sampling_max_rounds`` extra rounds (:func:`~dlmrl.training.rollout.fill_informative_groups`).
    With several ``processes`` every round is sampled in shares and gathered, so every process sees the whole
    batch, takes the same decisions and runs the same number of rounds.

    Returns:
        The batch to train on and what sampling it cost (:class:`~dlmrl.training.rollout.SamplingStats`).
    """
    tr = cfg.train
    examples = task.train_batch(tr.prompts_per_step, tr.seed, step)

    def sample(batch: list) -> Rollout | None:
        if not batch:
            return None
        return sample_groups(policy, task, cfg, preset, batch, generator, max_length, temperature_fn, env,
                             processes, pad_id)

    ro = sample(examples)
    if not preset.dynamic_sampling:
        return ro, SamplingStats(1, len(ro), 0, ro.nfe, ro.sampling_passes(),
                                 trajectory_rewards(ro) if env else ro.rewards,
                                 trajectory_reward_parts(ro) if env else ro.reward_parts)
    seen = {example_key(e) for e in examples}
    return fill_informative_groups(
        ro, lambda r: sample(fresh_prompts(task, tr.prompts_per_step, tr.seed, step, r, seen)),
        tr.prompts_per_step, tr.num_generations, preset.dynamic_sampling_max_rounds, pad_id)


def load_configured_policy(cfg: Config):
    """``load_policy`` (diffusion) or ``load_ar_policy`` (ar) with the ``model`` section; a load failure becomes
    a ``ConfigError`` naming the model."""
    m = cfg.model
    try:
        if m.kind == "ar":
            from dlmrl.models.ar import load_ar_policy

            return load_ar_policy(m.name_or_path, m.trust_remote_code, m.dtype)
        policy = load_policy(m.name_or_path, m.family, m.trust_remote_code, m.dtype)
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.name_or_path {m.name_or_path!r} (family {m.family!r}) cannot be loaded: {e}") from e
    check_policy(cfg, policy)
    return policy


def check_policy(cfg: Config, policy) -> None:
    """What only a loaded (or given) policy can tell: its kind is ``model.kind``, and with ``sampling.cache`` its
    family has a block cache (a detected family is known only now; refused before any rollout).

    Raises:
        ConfigError: naming ``model.kind`` or ``sampling.cache``.
    """
    from dlmrl.models.ar import AutoregressivePolicy

    kind = "ar" if isinstance(policy, AutoregressivePolicy) else "diffusion"
    if kind != cfg.model.kind:
        raise ConfigError(f"config key 'model.kind': the policy is a {kind} policy ({type(policy).__name__}) but "
                          f"model.kind is {cfg.model.kind!r}")
    if cfg.sampling.cache != "none" and kind == "diffusion":  # (a detected family is known only now)
        check_cache_family(policy.family, cfg.sampling.cache, cfg.model.name_or_path)


def evaluate_config(cfg: Config, policy, task) -> dict:
    """Held-out evaluation with the ``eval`` section's settings (its ``preset``'s, protocol ``eval.protocol``; AR:
    left-to-right decoding, ``eval.steps`` unused), with the result's ``record``
    (:func:`dlmrl.training.evaluation.evaluate_with_config`)."""
    return evaluate_with_config(cfg, policy, task)


def solved_reward(task) -> float | None:
    """The reward that means "fully right" for the rollout ``solve_rate``: the task's correctness reward (Sudoku 1,
    GSM8K/MATH 2, Countdown 1); ``None`` when format rewards are added (the sum then does not say which answers
    were right)."""
    return task.solved_reward  # (None: no reward means solved, e.g. reward functions)


def tracker_config(cfg: Config) -> dict:
    """The config flattened to dotted keys with scalar values, as trackers store hyperparameters (TensorBoard's
    ``add_hparams`` takes no ``None`` or lists)."""
    return {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in flatten(to_dict(cfg))}


def configure_deepspeed(accelerator: Accelerator, max_grad_norm: float) -> None:
    """DeepSpeed (``accelerate launch`` with a DeepSpeed config) sizes its batch from a dataloader, which this loop
    has none of: one rollout batch per process per update (``train_micro_batch_size_per_gpu`` 1), and it clips
    gradients itself: with ``train.max_grad_norm`` (0 = off), unless the DeepSpeed config sets a value."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is None:
        return
    ds = plugin.deepspeed_config
    if ds.get("train_micro_batch_size_per_gpu", "auto") == "auto":
        ds["train_micro_batch_size_per_gpu"] = 1
    if ds.get("gradient_clipping", "auto") == "auto":
        ds["gradient_clipping"] = max_grad_norm


def train(cfg: Config, resume: bool = False, progress: bool = True, *, policy=None, task=None,
          callbacks=()) -> dict:
    """Run the configured algorithm; write the run files (see README); return ``summary.json``'s content.

    Args:
        cfg: the run's config.
        resume: continue from the newest checkpoint in ``output_dir``.
        progress: show the progress bar.
        policy: an already-built policy to train (in place) instead of loading ``model.name_or_path``: a
            :class:`~dlmrl.models.policy.MaskedDiffusionPolicy` or an
            :class:`~dlmrl.models.ar.AutoregressivePolicy`, of ``model.kind``; the ``model`` section's LoRA and
            checkpointing switches still apply, and a KL reference is a frozen copy of it.
        task: an already-built task instead of the ``task`` section's (its data and rewards are then not
            validated here: whoever built it checked them, as :class:`dlmrl.api.Trainer` does).
        callbacks: objects with any of ``on_log(record)``, ``on_step_end(step, record)``,
            ``on_evaluate(metrics)`` (:class:`~dlmrl.training.callbacks.Callback`).
    Raises:
        ConfigError: on an invalid config (before any model is loaded), or a ``policy`` of another kind.
        FileNotFoundError: ``resume=True`` with no checkpoint in ``output_dir``.
        dlmrl.rewards.functions.RewardFunctionError: a reward function returned the wrong number of values.
    """
    spec = validate(cfg, data=task is None)  # (the config resolved once: its preset and estimator)
    hooks = Callbacks(callbacks)
    check_process_split(cfg, launched_processes())  # (accelerate launch: the batch must split over the processes)
    check_sharding_backend()  # (FSDP / DeepSpeed on a machine without GPUs: refused, never silently plain DDP)
    tr, out = cfg.train, Path(cfg.output_dir)
    ckpt = check_run_folder(cfg, resume)
    out.mkdir(parents=True, exist_ok=True)
    # (the schedule moves once per update whatever the process count: the global batch is the 1-process batch)
    accelerator = Accelerator(log_with=None if tr.report_to == "none" else tr.report_to, project_dir=str(out),
                              kwargs_handlers=[DistributedDataParallelKwargs(broadcast_buffers=False)],
                              step_scheduler_with_optimizer=False)
    processes = Processes.from_accelerator(accelerator)
    if launched_processes() > processes.count:
        raise ConfigError(f"{launched_processes()} processes were launched (WORLD_SIZE) but accelerate set up "
                          f"{processes.count}: on a machine without GPUs launch with --cpu (or set "
                          "ACCELERATE_USE_CPU=1), so that the processes train together instead of each alone")
    check_process_split(cfg, processes.count)
    configure_deepspeed(accelerator, tr.max_grad_norm)
    torch.manual_seed(tr.seed)

    preset, is_ar = spec.preset, cfg.model.kind == "ar"
    given = policy is not None
    if given:
        check_policy(cfg, policy)
    policy = prepare_for_training(policy if given else load_configured_policy(cfg), cfg.model)  # LoRA, checkpointing
    if preset.objective.parts.clip_rule.needs_vocab_size and preset.objective.vocab_size is None:
        preset = preset.with_overrides(vocab_size=len(policy.tokenizer))
    objective = preset.objective
    ref = None  # the frozen initial model for the KL term (not for a KL toward the rollout policy)
    wants_ref = "logp_ref" in objective.required_inputs
    if wants_ref and is_peft_model(policy.model):
        ref = AdapterDisabledPolicy(policy)  # LoRA: the base itself, adapter disabled (no second copy)
    elif wants_ref:
        # the initial model, frozen (a given policy: a copy of its model; the tokenizer is shared)
        ref = dataclasses.replace(policy, model=copy.deepcopy(policy.model)) if given else load_configured_policy(cfg)
        ref.model.requires_grad_(False).eval().to(accelerator.device)
    task = build_task(cfg, policy) if task is None else task
    # (AR with one process: an entropy preset with μ = 1 takes its entropies from the update's own forward)
    scorer = (ARScorer(policy, ref, old_scores=objective.needs_old_scores, share_forward=processes.count == 1)
              if is_ar else
              DiffusionScorer(policy, ref, build_estimator(cfg, spec), cfg.estimator.micro_batch or None,
                              old_scores=objective.needs_old_scores))
    needs = preset.required_inputs
    delimiters = delimiter_token_ids(policy.tokenizer) if "segment_ids" in needs else None
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=tr.learning_rate, betas=(tr.adam_beta1, tr.adam_beta2),
                                  weight_decay=tr.weight_decay)
    total_updates = tr.max_steps * tr.num_iterations
    scheduler = get_scheduler(tr.lr_scheduler_type, optimizer, num_warmup_steps=tr.warmup_steps * tr.num_iterations,
                              num_training_steps=max(total_updates, 1))
    with warnings.catch_warnings():
        # DDP without buffer synchronisation in forward: the buffers are not trained, and processes may run
        # different numbers of forward passes (AR sampling stops when a process's rows are done). (torch 2.13
        # renames broadcast_buffers to forward_sync_buffers, which accelerate does not pass yet.)
        warnings.filterwarnings("ignore", message=".*broadcast_buffers.*", category=FutureWarning)
        policy.model, optimizer, scheduler = accelerator.prepare(policy.model, optimizer, scheduler)
    # DDP: each process back-propagates its share without DDP's per-backward all-reduce (the number of backward
    # calls differs between shares with micro-batches) and gradients are averaged once per update
    own_grad_sync = processes.count > 1 and isinstance(policy.model, torch.nn.parallel.DistributedDataParallel)
    if processes.count > 1 and not own_grad_sync and cfg.estimator.micro_batch:
        raise ConfigError("config key 'estimator.micro_batch': with DeepSpeed or FSDP every process must run one "
                          "backward per update; set estimator.micro_batch 0")
    state = RunState()
    accelerator.register_for_checkpointing(state)
    register_adapter_checkpointing(accelerator)  # LoRA: checkpoints hold the adapter, not the frozen base
    if ckpt is None and resume:
        accelerator.print(f"--resume: {out} has no checkpoint yet (stopped before the first); starting it again "
                          "from step 0 with its own settings")
    if ckpt is not None:
        accelerator.load_state(str(ckpt))
        accelerator.print(f"resumed from {ckpt} at step {state.step}")
    if accelerator.is_main_process:
        save_yaml(cfg, out / "config.yaml")
    if tr.report_to != "none":  # (TensorBoard: <output_dir>/dlmrl/; wandb/trackio: project "dlmrl", run = folder)
        accelerator.init_trackers("dlmrl", config=tracker_config(cfg),
                                  init_kwargs={"wandb": {"name": out.name}, "trackio": {"name": out.name}})
    metrics_writer = (MetricsWriter(out / "metrics.jsonl", resume_step=state.step if ckpt else None)
                      if accelerator.is_main_process else None)
    metric, solved = primary_metric(task), solved_reward(task)  # held-out headline metric; rollout "right" reward

    def held_out() -> dict:
        metrics = evaluate_config(cfg, policy, task)
        hooks.on_evaluate(metrics)
        return metrics

    if cfg.eval.before and state.eval_before is None:
        state.eval_before = held_out()
        accelerator.print(f"held-out {metric} before: {state.eval_before[metric]:.4f}")

    def save_checkpoint() -> None:
        # (accelerate warns that the tied lm_head is stored once; that is expected for the tiny model)
        quiet = logging.getLogger("accelerate.utils.other")
        level, _ = quiet.level, quiet.setLevel(logging.ERROR)
        final = out / "checkpoints" / f"step-{state.step}"
        # the main process makes and renames the folder; every process saves into it (accelerate writes its
        # files); with one process the waits do nothing
        with atomic_dir(final) if accelerator.is_main_process else nullcontext(None):
            accelerator.wait_for_everyone()
            accelerator.save_state(str(staging_dir(final)), safe_serialization=True)
            accelerator.wait_for_everyone()
        quiet.setLevel(level)
        if accelerator.is_main_process:
            for old in sorted((out / "checkpoints").glob("step-*"), key=lambda p: int(p.name.split("-")[1]))[:-2]:
                shutil.rmtree(old, ignore_errors=True)
        accelerator.wait_for_everyone()

    # Ctrl-C / SIGTERM: finish the current step, save a checkpoint, exit resumable.
    stop = {"now": False}
    previous_handlers = {sig: signal.signal(sig, lambda *_: stop.update(now=True))
                         for sig in (signal.SIGINT, signal.SIGTERM)}
    bar = tqdm(total=tr.max_steps, initial=state.step, desc=tr.algorithm,
               disable=not progress or not accelerator.is_main_process)
    G = tr.num_generations
    gap_measured = not is_ar and measures_rollout_mismatch(scorer)  # (rollout_logp_gap_* logged)
    max_length = task.gen_length + 1 if is_ar else task.gen_length  # generation budget (AR: the grid + EOS)
    if is_ar and preset.overlong_cache_fraction is not None:
        # (dlmrl interpretation) DAPO's cache sits past the answer: L_max = (L + 1) / (1 − fraction), so a
        # complete answer is never punished and only tokens beyond it are
        max_length = math.ceil(max_length / (1 - preset.overlong_cache_fraction))
    pad_id = pad_token_id(policy.tokenizer)  # (prompt padding: the pad id, else EOS, else 0)
    env = (tr.env or default_env(cfg.task.name)) if preset.multi_turn else None

    def budget_spent() -> bool:
        return bool(tr.max_completions) and state.completions_total >= tr.max_completions

    try:
        while state.step < tr.max_steps and not stop["now"] and not budget_spent():
            t0 = time.time()
            gen = step_generator(tr.seed, state.step)
            # 1. rollout and rewards: G completions per prompt (flow_grpo: G episodes, one row per turn; DAPO:
            #    only groups whose rewards differ, with new prompts sampled until there are enough)
            policy.model.eval()
            temperature_fn = None
            if is_ar and preset.adaptive_temperature_tau is not None:
                # HAPO: temperature T·(1 + τ·ĥ_t), ĥ normalised by the previous step's statistics
                stats = HapoEntropyStats(**state.hapo_stats) if state.hapo_stats else None
                temperature_fn = HapoTemperature(stats, preset.adaptive_temperature_tau)

            ro, sampled = sample_step(policy, task, cfg, preset, state.step, gen, max_length, temperature_fn, env,
                                      pad_id, processes)  # (several processes: every one holds the whole batch)
            t1 = time.time()
            # 2. DaGRPO: each group with no reward above the threshold gets its reference solution as an anchor
            anchors = 0
            if preset.anchor_threshold is not None and len(ro):
                ro, anchors = add_anchors(ro, task, preset.anchor_threshold, cfg.model.kind,
                                          getattr(policy, "eos_token_id", None), pad_id,
                                          lambda r, n: shaped_rewards(preset, r, n, max_length),
                                          lambda m: left_to_right_reveal_steps(m, cfg.sampling.block_length,
                                                                               cfg.sampling.steps))
            group_ids = ro.group_ids  # (B,) groups need not be G consecutive rows (anchors, episodes)
            # 3. advantages; the rows to score (A = 0 rows when that cannot change the loss). Entropy-based
            #    advantages wait for the old scores (step 4).
            adv_inputs = {"mask": ro.completion_mask, "group_ids": group_ids, "trajectory_ids": ro.trajectories()}
            if preset.advantage == "dagrpo":  # distinctiveness: token 3-gram Jaccard within each group
                adv_inputs["similarity"] = ngram_jaccard(ro.completion, ro.completion_mask, group_ids)
            keep = torch.ones(len(ro), dtype=torch.bool)
            adv = None
            if "entropy" not in needs and len(ro):
                adv = preset.advantages(AdvantageInputs(ro.train_rewards, G, **adv_inputs))
                if objective.can_skip_zero_rows(adv):
                    keep = adv != 0
            rows = torch.nonzero(keep).squeeze(-1)
            # (a loss normalised by the whole batch's token count, dapo, needs no rescaling by the rows kept)
            row_weight = 1.0 if objective.parts.loss_type.uses_num_tokens else len(rows) / max(len(ro), 1)
            sub = ro.rows(rows)
            num_tokens = sub.completion_mask.sum().clamp(min=1).float()  # (dapo: the whole batch's tokens)
            # several processes: each scores its share of the groups (a share without rows scores one row
            # with loss weight 0, so every process runs the same updates), weighted so that the average of
            # the processes' losses is the loss of the whole batch (distributed.loss_share)
            local, share, own_rows = None, 1.0, True
            if processes.count > 1 and len(rows):
                local = group_share(group_ids[rows], processes.index, processes.count)  # (n,) rows of sub
                share = loss_share(objective.parts.loss_type, sub.completion_mask[local], sub.completion_mask)
                row_weight *= processes.count * share
                if not len(local):
                    local, row_weight, share, own_rows = torch.zeros(1, dtype=torch.long), 0.0, 0.0, False
            mine = sub if local is None else sub.rows(local)
            mine_rows = rows if local is None else rows[local]  # this process's rows of ro
            # 4. old (and reference) scores, once per rollout batch (diffusion: on the μ MaskPlans)
            old = (scorer.prepare(sub, tr.num_iterations, gen, entropy="entropy" in needs, rows=local,
                                  advantages=adv[rows] if adv is not None else None) if len(rows)
                   else None)  # (no row to score: this batch carries no signal)
            entropy = old.entropy if old is not None else None  # (n, L) this process's rows
            if entropy is not None and local is not None:
                entropy = processes.gather_rows(entropy, local if row_weight else local[:0], len(sub))  # whole batch
            if preset.adaptive_temperature_tau is not None and old is not None:
                stats = hapo_entropy_stats(entropy, sub.completion_mask, objective.hapo_entropy_pivot)  # the loss's rule
                state.hapo_stats = dataclasses.asdict(stats)
            if adv is None and old is not None:  # (here every row is kept: sub is ro)
                adv = preset.advantages(AdvantageInputs(ro.train_rewards, G, entropy=entropy, **adv_inputs))
            adv_rows = adv[mine_rows] if adv is not None else None
            inputs = {"entropy": old.entropy if old is not None else None, "group_ids": group_ids[mine_rows],
                      "num_tokens": num_tokens}
            if mine.anchor is not None:
                inputs["anchor"] = mine.anchor  # ratio π/sg[π], loss weight anchor_weight
            if delimiters is not None:
                inputs["segment_ids"] = sentence_segments(torch.isin(mine.completion, delimiters), mine.completion_mask)
            # the sampler's recorded log-probs against the exact old-policy scores of the same trajectory (the
            # first update's), and the truncated-IS weights of train.rollout_is_cap
            mismatch = None
            if old is not None and gap_measured and mine.token_logprobs is not None:
                valid = mine.completion_mask.bool() & (mine.reveal_step >= 0)
                if mine.anchor is not None:
                    valid &= ~mine.anchor.bool()[:, None]
                mismatch = RolloutMismatch(mine.token_logprobs, valid, tr.rollout_is_cap)
            t2 = time.time()
            # 5. μ inner updates (diffusion: each on a fresh MaskPlan shared by old/new/ref)
            policy.model.train()
            logs: list[dict] = []
            lr_used = scheduler.get_last_lr()[0]
            updates = tr.num_iterations if old is not None else 0
            with warnings.catch_warnings():  # torch warns when the schedule moves without an optimizer step
                warnings.simplefilter("ignore", UserWarning)
                for _ in range(tr.num_iterations - updates):
                    scheduler.step()  # nothing to learn from this batch; keep the schedule on the step count
            seconds_scoring = seconds_optimizer = 0.0
            for j in range(updates):
                # score with grad and back-propagate the preset's loss (diffusion: in chunks of micro_batch
                # canvases, a two-pass surrogate with the same gradient, when they do not fit in one call)
                loss_fn = group_loss_fn(objective, old.old[j], adv_rows, mine.completion_mask, row_weight,
                                        logp_ref=old.ref[j], **inputs,
                                        **({"mismatch": mismatch} if mismatch is not None else {}))
                t_scoring = time.time()
                with accelerator.no_sync(policy.model) if own_grad_sync else nullcontext():
                    loss, m = scorer.backward(j, loss_fn, accelerator.backward)
                t_optimizer = time.time()
                seconds_scoring += t_optimizer - t_scoring
                if own_grad_sync:
                    processes.average_gradients(policy.model.parameters())
                if tr.max_grad_norm > 0:
                    m["grad_norm"] = float(accelerator.clip_grad_norm_(policy.model.parameters(), tr.max_grad_norm))
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
                seconds_optimizer += time.time() - t_optimizer
                logs.append({**m, "loss": loss.item()})
            # 6. log
            state.step += 1
            state.completions_total += sampled.completions
            state.nfe_sampling_total += sampled.nfe
            elapsed = time.time() - t0
            state.train_seconds += elapsed
            rewards = sampled.rewards  # the policy's own samples: every round (episodes: per trajectory)
            record = {"step": state.step, "reward_mean": rewards.mean().item(), "reward_std": rewards.std().item(),
                      "solve_rate": (rewards == solved).float().mean().item() if solved is not None else None,
                      "rows_scored": len(rows),
                      "groups_dropped": sampled.groups_dropped, "rollout_rounds": sampled.rounds,
                      "completions_sampled": sampled.completions, "completions_total": state.completions_total,
                      "lr": lr_used, "nfe_sampling": sampled.nfe, "nfe_sampling_total": state.nfe_sampling_total,
                      "sampling_passes": sampled.passes,
                      "nfe_scoring": scorer.nfe,
                      "seconds_rollout": t1 - t0, "seconds_scoring_old": t2 - t1, "seconds_update": time.time() - t2,
                      "seconds_scoring": seconds_scoring, "seconds_optimizer": seconds_optimizer,
                      "seconds_step": elapsed}
            if sampled.reward_parts is not None:  # each reward function's rewards/<name>/mean and /std (TRL's)
                record.update(task.reward_functions.metrics(sampled.reward_parts))
            if gap_measured and ro.token_logprobs is not None:
                record.update(mismatch_metrics(mismatch if own_rows else None, processes, tr.rollout_is_cap))
            if preset.anchor_threshold is not None:
                record["anchors"] = anchors
            if env is not None:
                record["turns_mean"] = len(ro) / max(len(sampled.rewards), 1)
            for key in (*UPDATE_METRICS, "grad_norm"):
                vals = [lg[key] for lg in logs if key in lg]
                record[key] = sum(vals) / len(vals) if vals else None
            if updates:  # (several processes: the whole batch's values from the shares')
                record.update(processes.combine_metrics({k: record[k] for k in UPDATE_METRICS}, share))
            if cfg.eval.eval_steps and state.step % cfg.eval.eval_steps == 0:
                record[f"eval_{metric}"] = held_out()[metric]
            stop["now"] = processes.any(stop["now"])  # (a signal that reached one process stops them all)
            if accelerator.is_main_process and state.step % tr.logging_steps == 0:
                metrics_writer.write(record)
                if tr.report_to != "none":
                    accelerator.log({k: v for k, v in record.items() if isinstance(v, (int, float))}, step=state.step)
                hooks.on_log(record)
            bar.update(1)
            bar.set_postfix(reward=f"{record['reward_mean']:.3f}", rows=len(rows))
            # 7. checkpoint (also when the rollout budget train.max_completions is spent: the run ends here)
            if (state.step % tr.save_steps == 0 or state.step == tr.max_steps or stop["now"]
                    or budget_spent()):
                save_checkpoint()
            if budget_spent():
                accelerator.print(f"rollout budget spent: {state.completions_total} completions sampled "
                                  f"(train.max_completions {tr.max_completions}) at step {state.step}")
            hooks.on_step_end(state.step, record)  # (after the checkpoint: a callback that raises leaves it resumable)
    finally:
        bar.close()
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
    if stop["now"]:  # the loop saved a checkpoint after the step it finished
        accelerator.print(f"interrupted at step {state.step}; continue with --resume")
        raise KeyboardInterrupt

    eval_after = held_out() if cfg.eval.after else None
    summary = {"eval_before": state.eval_before, "eval_after": eval_after, "steps": state.step,
               "stop_reason": "max_completions" if budget_spent() else "max_steps",
               "completions_total": state.completions_total, "nfe_sampling_total": state.nfe_sampling_total,
               "train_seconds": round(state.train_seconds, 1)}
    if eval_after and state.eval_before:
        summary[f"{metric}_gain"] = eval_after[metric] - state.eval_before[metric]
        accelerator.print(f"held-out {metric}: before {state.eval_before[metric]:.4f} after {eval_after[metric]:.4f}")
    if accelerator.is_main_process:
        logged = read_metrics(out / "metrics.jsonl")
        if logged:
            summary["final_metrics"] = logged[-1]
        write_json_atomic(out / "summary.json", summary)
        plot_curves(out / "metrics.jsonl", out / "reward_curve.png", summary)
        with atomic_dir(out / "final_model") as tmp:
            # (LoRA: the adapter, the tokenizer and a note of the base model)
            save_final_model(accelerator.unwrap_model(policy.model), policy.tokenizer, tmp, cfg.model)
    accelerator.wait_for_everyone()
    if processes.count > 1:
        # (gloo's worker threads may still be dropping the tensors of the last collectives, which takes the GIL;
        # end_training destroys the process group holding the GIL and would wait for them forever: let them
        # finish first. pytorch/pytorch#56297, #75097)
        time.sleep(0.2)
    accelerator.end_training()
    return summary
