"""Everything a training run is built from, before its first step: the accelerator and processes, the policy (and
its KL reference), the task, the scorer, the optimizer and schedule, the run's state and metrics file
(:func:`set_up_run`, gathered in one :class:`Run`), and the functions that load and check each piece.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator, DistributedDataParallelKwargs
from transformers import get_scheduler

from dlmrl.config import (
    Config,
    ConfigError,
    RunSpec,
    flatten,
    resolve_run,
    save_yaml,
    to_dict,
)
from dlmrl.data.encoding import pad_token_id
from dlmrl.envs import default_env
from dlmrl.evaluation.configured import evaluate_with_config
from dlmrl.evaluation.heldout import check_held_out_size, primary_metric
from dlmrl.kinds import PolicyKind, kind_of, policy_kind
from dlmrl.models.lora import (
    REFERENCE_ADAPTER,
    AdapterDisabledPolicy,
    ReferenceAdapterPolicy,
    add_reference_adapter,
    is_peft_model,
    peft_model_of,
    prepare_for_training,
    register_adapter_checkpointing,
)
from dlmrl.objectives.segments import delimiter_token_ids
from dlmrl.rewards.functions import RewardFunctions
from dlmrl.training.distributed import (
    GradientSync,
    Processes,
    check_process_split,
    check_sharding_backend,
    launched_processes,
)
from dlmrl.training.logging import MetricsWriter
from dlmrl.training.precision import keep_float32_master_weights, wants_master_weights
from dlmrl.training.reference_sync import SyncedReference, adapter_pairs
from dlmrl.training.run_folder import RunState, check_run_folder
from dlmrl.training.sharding import (
    SHARDED_MODES,
    GatheredScorer,
    check_launch,
    gathered,
    register_checkpointing,
    shard_policy,
)


@dataclass
class Run:
    """One training run's parts, built by :func:`set_up_run` (the loop in :func:`dlmrl.training.trainer.train`
    reads them).

    Attributes:
        cfg, preset: the config and its algorithm preset (``vocab_size`` filled in for ESPO's clip rule).
        kind: the policy kind of ``model.kind`` (:mod:`dlmrl.kinds`).
        out: the output folder. ckpt: the checkpoint resumed from, or ``None``.
        accelerator, processes: ``accelerate``'s and dlmrl's view of the processes (W = ``processes.count``).
        policy, ref: the trained policy (prepared by ``accelerate``) and the frozen KL reference (or ``None``).
        task: the task. scorer: the kind's scorer (:meth:`~dlmrl.kinds.base.PolicyKind.build_scorer`).
        optimizer, scheduler: AdamW and the ``train.lr_scheduler_type`` schedule (one step per update).
        state: the :class:`RunState` a checkpoint holds. metrics_writer: ``metrics.jsonl`` (main process only).
        own_grad_sync: DDP gradients averaged once per update by the loop, not by DDP per backward.
        delimiters: sentence delimiter token ids (presets that need ``segment_ids``), else ``None``.
        max_length: the generation budget in tokens (AR: the answer + EOS, DAPO: its overlong cache past it).
        pad_id: prompt padding id. env: the environment of a multi-turn preset (episodes), or ``train.env`` with any
            other preset (tools inside the rollout, :mod:`dlmrl.training.tool_loop`), else ``None``.
        gap_measured: the rollout log-prob gap is defined and logged (the kind's
            :meth:`~dlmrl.kinds.base.PolicyKind.measures_rollout_gap`).
        metric: the held-out headline metric. solved: the reward meaning "fully right" (``solve_rate``), or ``None``.
        sharding: the FSDP2 sharding of ``train.sharding: fsdp2`` (:class:`dlmrl.training.sharding.Sharding`), else
            ``None``.
        synced_ref: ``train.sync_ref_model``'s mix of the policy into the reference
            (:class:`dlmrl.training.reference_sync.SyncedReference`), else ``None``.
    """

    cfg: Config
    kind: PolicyKind
    preset: object
    out: Path
    ckpt: Path | None
    accelerator: Accelerator
    processes: Processes
    policy: object
    ref: object | None
    task: object
    scorer: object
    optimizer: torch.optim.Optimizer
    scheduler: object
    state: RunState
    metrics_writer: MetricsWriter | None
    own_grad_sync: bool
    delimiters: torch.Tensor | None
    max_length: int
    pad_id: int
    env: str | None
    gap_measured: bool
    metric: str
    solved: float | None
    sharding: object | None = None
    synced_ref: object | None = None

    @property
    def objective(self):
        return self.preset.objective

    @property
    def needs(self) -> frozenset[str]:
        """The inputs the preset's loss and advantages need (``entropy``, ``segment_ids``, ...)."""
        return self.preset.required_inputs


def set_up_run(cfg: Config, spec: RunSpec, resume: bool, policy=None, task=None) -> Run:
    """Build a run of the validated ``cfg`` (``spec``: what :func:`dlmrl.config.validate` resolved it to): check the
    processes and the output folder, load (or take) the policy and its KL reference, build (or take) the task,
    prepare model, optimizer and schedule with ``accelerate``, and load the newest checkpoint when resuming.

    Raises:
        ConfigError: processes that do not split the batch, a run folder that holds another run, a policy of another
            kind, a model that cannot be loaded.
        FileNotFoundError: ``resume`` with no run in ``output_dir``.
    """
    check_process_split(cfg, launched_processes(), spec.preset)  # (accelerate launch: the batch must split)
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
    check_process_split(cfg, processes.count, spec.preset)
    configure_deepspeed(accelerator, tr.max_grad_norm)
    torch.manual_seed(tr.seed)

    preset, kind = spec.preset, kind_of(cfg.model.kind)
    given = policy is not None
    if given:
        check_policy(cfg, policy)
    policy = prepare_for_training(policy if given else load_configured_policy(cfg), cfg.model, kind)  # LoRA, checkpoint
    if preset.objective.parts.clip_rule.needs_vocab_size and preset.objective.vocab_size is None:
        preset = preset.with_overrides(vocab_size=len(policy.tokenizer))
    objective = preset.objective
    ref = None  # the frozen initial model for the KL term (not for a KL toward the rollout policy)
    wants_ref = "logp_ref" in objective.required_inputs
    if wants_ref and is_peft_model(policy.model) and tr.sync_ref_model:
        add_reference_adapter(policy.model)  # (LoRA, a reference that follows the policy: a second adapter)
        ref = ReferenceAdapterPolicy(policy)
    elif wants_ref and is_peft_model(policy.model):
        ref = AdapterDisabledPolicy(policy)  # LoRA: the base itself, adapter disabled (no second copy)
    elif wants_ref:
        # the initial model, frozen (a given policy: a copy of its model; the tokenizer is shared)
        ref = dataclasses.replace(policy, model=copy.deepcopy(policy.model)) if given else load_configured_policy(cfg)
        ref.model.requires_grad_(False).eval().to(accelerator.device)
    if wants_master_weights(cfg.model):  # (full fine-tuning in bfloat16: float32 weights, bfloat16 compute)
        keep_float32_master_weights(policy.model)
        if ref is not None and not isinstance(ref, AdapterDisabledPolicy):
            keep_float32_master_weights(ref.model)  # (computes as the policy does: the KL starts at 0)
    sharding = None
    if tr.sharding in SHARDED_MODES:  # (before the optimizer: it must hold the sharded parameters)
        check_launch(accelerator)
        sharding = shard_policy(policy, ref, accelerator.device)
    task = build_task(cfg, policy) if task is None else task
    if cfg.eval.before or cfg.eval.after or cfg.eval.eval_steps:  # (hub data is counted only now it is loaded)
        check_held_out_size(task, cfg.eval.num_puzzles)
    estimator = build_estimator(cfg, spec) if kind.scores_with_estimators else None
    scorer = kind.build_scorer(policy, ref, cfg, estimator, objective, processes.count)
    if tr.steps_per_generation > 1 and kind.measures_rollout_gap(scorer):
        # (the rollout log-prob gap is measured on old scores taken before any step: with several mini-batches the
        # updates' own scores come from a moved policy, so a ratio-free objective's scorer takes them too)
        scorer.old_scores = True
    if sharding is not None:  # (old and reference scores: parameters gathered once, as for the rollout)
        scorer = GatheredScorer(scorer, sharding.models)
    delimiters = delimiter_token_ids(policy.tokenizer) if "segment_ids" in preset.required_inputs else None
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=tr.learning_rate, betas=(tr.adam_beta1, tr.adam_beta2),
                                  weight_decay=tr.weight_decay)
    # the schedule moves once per optimizer step: num_iterations passes of steps_per_generation mini-batches per
    # rollout step (max_steps and warmup_steps count rollout steps)
    per_step = tr.num_iterations * tr.steps_per_generation
    scheduler = get_scheduler(tr.lr_scheduler_type, optimizer, num_warmup_steps=tr.warmup_steps * per_step,
                              num_training_steps=max(tr.max_steps * per_step, 1))
    with warnings.catch_warnings():
        # DDP without buffer synchronisation in forward: the buffers are not trained, and processes may run
        # different numbers of forward passes (AR sampling stops when a process's rows are done). (torch 2.13
        # renames broadcast_buffers to forward_sync_buffers, which accelerate does not pass yet.)
        warnings.filterwarnings("ignore", message=".*broadcast_buffers.*", category=FutureWarning)
        if sharding is None:
            policy.model, optimizer, scheduler = accelerator.prepare(policy.model, optimizer, scheduler)
        else:  # (model and optimizer are FSDP2's and saved by torch.distributed.checkpoint; no DDP wrapper)
            scheduler = accelerator.prepare(scheduler)
            register_checkpointing(accelerator, policy.model, optimizer)
    # DDP: each process back-propagates its share without DDP's per-backward all-reduce (the number of backward
    # calls differs between shares with micro-batches) and gradients are averaged once per update
    # (FSDP2: its reduce-scatter in every backward averages the gradients)
    own_grad_sync = processes.count > 1 and isinstance(policy.model, torch.nn.parallel.DistributedDataParallel)
    if processes.count > 1 and not own_grad_sync:
        # FSDP / DeepSpeed: every forward and backward gathers or reduces across the processes, so every process
        # runs the same scoring passes (the largest share's count, padded with passes of loss weight 0) and
        # gradients are reduced on an update's last backward only
        scorer.lockstep = GradientSync(processes, policy.model, accelerator)
    state = RunState()
    accelerator.register_for_checkpointing(state)
    synced_ref = None
    if tr.sync_ref_model and ref is not None:  # (TR-DPO / TRL's sync_ref_model: dlmrl.training.reference_sync)
        own = accelerator.unwrap_model(policy.model)
        if isinstance(ref, ReferenceAdapterPolicy):
            synced_ref = SyncedReference(adapter_pairs(own, peft_model_of(own).active_adapter, REFERENCE_ADAPTER),
                                         tr.ref_model_mixup_alpha, tr.ref_model_sync_steps)
        else:
            synced_ref = SyncedReference.full(ref.model, own, tr.ref_model_mixup_alpha, tr.ref_model_sync_steps)
            accelerator.register_for_checkpointing(ref.model)  # (its weights move: every checkpoint holds them)
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
    max_length = kind.generation_budget(task.gen_length, preset)
    return Run(cfg=cfg, kind=kind, preset=preset, out=out, ckpt=ckpt, accelerator=accelerator, processes=processes,
               policy=policy, ref=ref, task=task, scorer=scorer, optimizer=optimizer, scheduler=scheduler,
               state=state, metrics_writer=metrics_writer, own_grad_sync=own_grad_sync, delimiters=delimiters,
               max_length=max_length,
               pad_id=pad_token_id(policy.tokenizer),  # (prompt padding: the pad id, else EOS, else 0)
               env=(tr.env or default_env(cfg.task.name)) if preset.multi_turn else tr.env,  # (else: tools in the loop)
               gap_measured=kind.measures_rollout_gap(scorer),  # (rollout_logp_gap_*)
               metric=primary_metric(task), solved=solved_reward(task), sharding=sharding, synced_ref=synced_ref)


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


def load_configured_policy(cfg: Config):
    """The policy of the ``model`` section, loaded by its kind (:meth:`~dlmrl.kinds.base.PolicyKind.load`) and
    checked (:func:`check_policy`); a load failure becomes a ``ConfigError`` naming the model."""
    m = cfg.model
    kind = kind_of(m.kind)
    try:
        policy = kind.load(m)
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.name_or_path {m.name_or_path!r} (family {m.family!r}) cannot be loaded: {e}") from e
    check_policy(cfg, policy)
    return policy


def check_policy(cfg: Config, policy) -> None:
    """What only a loaded (or given) policy can tell: it is a policy of ``model.kind``
    (:meth:`~dlmrl.kinds.base.PolicyKind.owns`), and what its kind checks on it
    (:meth:`~dlmrl.kinds.base.PolicyKind.check_loaded`: a block policy's size; with ``sampling.cache`` a detected
    family's block cache, known only now; refused before any rollout).

    Raises:
        ConfigError: naming ``model.kind``, ``model.block_size`` or ``sampling.cache``.
    """
    kind = kind_of(cfg.model.kind)
    if not kind.owns(policy):
        raise ConfigError(f"config key 'model.kind': the policy is a {policy_kind(policy).name} policy "
                          f"({type(policy).__name__}) but model.kind is {cfg.model.kind!r}")
    kind.check_loaded(cfg, policy)


def evaluate_config(cfg: Config, policy, task, trained_steps: int | None = None) -> dict:
    """Held-out evaluation with the ``eval`` section's settings (its ``preset``'s, protocol ``eval.protocol``; AR:
    left-to-right decoding, ``eval.steps`` unused), with the result's ``record``
    (:func:`dlmrl.evaluation.configured.evaluate_with_config`); a sharded policy's parameters are gathered once for
    it (:func:`dlmrl.training.sharding.gathered`: processes may decode different numbers of passes)."""
    with gathered(policy.model):
        return evaluate_with_config(cfg, policy, task, trained_steps=trained_steps)


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


