"""A run's folder: what a checkpoint holds beyond the model (:class:`RunState`), whether a folder may be started or
resumed, saving a checkpoint atomically, and the files a finished run leaves (``summary.json``, the reward curve,
``final_model/``).

A checkpoint folder is written under a staging name and renamed when complete, so a crash or Ctrl-C mid-save
leaves the previous checkpoint as the newest; the two newest are kept.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from accelerate import Accelerator

from dlmrl.config import Config, ConfigError, flatten, load_yaml, to_dict
from dlmrl.models.lora import save_final_model
from dlmrl.training.checkpoint import (
    atomic_dir,
    checkpoints,
    latest_checkpoint,
    resumable_checkpoint,
    staging_dir,
    write_json_atomic,
    write_manifest,
)
from dlmrl.training.logging import plot_curves, read_metrics

#: the training run's config saved inside a final model (``final_model/``, ``Trainer.save``): ``dlmrl eval --model``
#: reads it as it reads a run folder's ``config.yaml``, so a moved folder is evaluated with its run's settings
RUN_CONFIG = "dlmrl_config.yaml"


@dataclass
class RunState:
    """What a checkpoint needs beyond model/optimizer/scheduler: the next step, eval-before, the cumulative
    rollout counts (``completions_total``, ``nfe_sampling_total``), HAPO's previous-step statistics and the collapse
    monitor's running baselines."""

    step: int = 0
    eval_before: dict | None = None
    train_seconds: float = 0.0
    hapo_stats: dict | None = None  # HAPO: the previous step's entropy statistics (adaptive temperature)
    completions_total: int = 0  # sampled completions so far (every round, every turn; not anchors)
    nfe_sampling_total: int | float = 0  # the steps' nfe_sampling summed (threshold decoding: means, fractional)
    collapse: dict | None = None  # the collapse monitor's running baselines (dlmrl.training.collapse)
    optimizer_steps: int = 0  # optimizer steps so far (train.sync_ref_model counts them)

    def state_dict(self) -> dict:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict) -> None:
        self.step, self.eval_before = state["step"], state["eval_before"]
        self.train_seconds = state.get("train_seconds", 0.0)
        self.hapo_stats = state.get("hapo_stats")
        self.completions_total = state.get("completions_total", 0)
        self.nfe_sampling_total = state.get("nfe_sampling_total", 0)
        self.collapse = state.get("collapse")
        self.optimizer_steps = state.get("optimizer_steps", 0)


def check_same_config(cfg: Config, saved_path: Path, steps_done: int | None = None) -> None:
    """Refuse to resume a run with settings other than the ones it was started with.

    ``output_dir``, ``estimator.micro_batch`` and ``estimator.logits_chunk`` may differ (e.g. a smaller
    micro_batch to fit another machine), and so may the memory plan's ``train.memory_budget`` and
    ``model.architecture``.
    With ``steps_done`` (the step of the checkpoint the run resumes from) ``train.max_steps`` may change too, to
    extend a run (a finished one included) or end it earlier, but not below the steps done; the learning-rate
    schedule then spans the new ``train.max_steps`` (warned about).

    Raises:
        ConfigError: listing the keys whose values differ from the saved ``config.yaml``; naming
            ``train.max_steps`` when it is below ``steps_done``.
    Warns:
        UserWarning: ``train.max_steps`` changed (the schedule's decay now runs to the new last step).
    """
    saved = Config()
    load_yaml(saved, saved_path, chosen=False)
    old, new = dict(flatten(to_dict(saved))), dict(flatten(to_dict(cfg)))
    free = ["output_dir", "estimator.micro_batch", "estimator.logits_chunk"]  # (memory and speed, not the steps taken)
    # (the memory plan's inputs: a budget for another machine, the architecture numbers; training reads neither)
    free += ["train.memory_budget"] + [k for k in {**old, **new} if k.startswith("model.architecture.")]
    if steps_done is not None and old["train.max_steps"] != new["train.max_steps"]:
        if new["train.max_steps"] < steps_done:
            raise ConfigError(f"config key 'train.max_steps': --resume continues a run that has done {steps_done} "
                              f"steps; {new['train.max_steps']} is below them (use {steps_done} or more)")
        free.append("train.max_steps")
    diff = [f"{k}: {old[k]!r} -> {new[k]!r}" for k in old if k not in free and old[k] != new[k]]
    if diff:
        raise ConfigError(f"--resume must use the run's own settings ({saved_path}); these differ: "
                          + "; ".join(diff))
    if "train.max_steps" in free:
        import warnings

        warnings.warn(f"--resume with train.max_steps {old['train.max_steps']} -> {new['train.max_steps']} (after "
                      f"{steps_done} steps done): the learning-rate schedule ({cfg.train.lr_scheduler_type}) now "
                      f"spans {new['train.max_steps']} steps, so the steps after {steps_done} follow it",
                      UserWarning, stacklevel=3)


def holds_run(output_dir: str | Path) -> bool:
    """Whether ``output_dir`` holds a run (a checkpoint or the run's ``config.yaml``): a new run there is refused."""
    out = Path(output_dir)
    return latest_checkpoint(out) is not None or (out / "config.yaml").exists()


def check_run_folder(cfg: Config, resume: bool) -> Path | None:
    """The output folder's state against ``--resume``: the checkpoint to resume from (``None`` for a new run), the
    newest intact one (:func:`~dlmrl.training.checkpoint.resumable_checkpoint`: a damaged newer one is passed over
    with a warning naming both).

    Raises:
        CheckpointError: ``resume`` where every checkpoint is damaged (naming the newest one's damaged file).
        FileNotFoundError: ``resume`` with no checkpoint and no run in ``output_dir``, or with checkpoints but
            no ``config.yaml``. A run stopped before its first checkpoint resumes from step 0 (``None``).
        ConfigError: a new run into a folder that holds one, or a resume with other settings
            (:func:`check_same_config`).
    """
    out = Path(cfg.output_dir)
    if resume and latest_checkpoint(out) is not None and not (out / "config.yaml").exists():
        raise FileNotFoundError(f"--resume: {out} has checkpoints but no config.yaml (the run's settings); "
                                "restore it, or start a new run in another --output-dir")
    ckpt = resumable_checkpoint(out) if resume else None
    if resume and ckpt is None:
        if not (out / "config.yaml").exists():
            raise FileNotFoundError(f"--resume: no checkpoint under {out / 'checkpoints'}")
        # stopped before its first checkpoint (Ctrl-C in the first evaluation, kill -9 before save_steps):
        # nothing to continue, so the run starts again from step 0 with its own settings (the same seeds
        # give the same run)
        check_same_config(cfg, out / "config.yaml", steps_done=0)
        return None
    if not resume and holds_run(out):
        raise ConfigError(f"output_dir {out} already holds a run; "
                          "continue that run with --resume or choose a new --output-dir")
    if resume and (out / "config.yaml").exists():  # (the checkpoint's step: a step-N folder holds N steps)
        check_same_config(cfg, out / "config.yaml", steps_done=int(ckpt.name.split("-")[1]) if ckpt else 0)
    return ckpt


def save_checkpoint(accelerator: Accelerator, out: Path, step: int) -> None:
    """Save the run's state (model, optimizer, scheduler, RNG, :class:`RunState`) as ``checkpoints/step-<step>``,
    atomically, and keep the two newest checkpoints."""
    # (accelerate warns that the tied lm_head is stored once; that is expected for the tiny model)
    quiet = logging.getLogger("accelerate.utils.other")
    level, _ = quiet.level, quiet.setLevel(logging.ERROR)
    final = out / "checkpoints" / f"step-{step}"
    # the main process makes and renames the folder; every process saves into it (accelerate writes its
    # files); with one process the waits do nothing
    with atomic_dir(final) if accelerator.is_main_process else nullcontext(None):
        accelerator.wait_for_everyone()
        accelerator.save_state(str(staging_dir(final)), safe_serialization=True)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:  # (every process's files are written: list them for the resume check)
            write_manifest(staging_dir(final))
    quiet.setLevel(level)
    if accelerator.is_main_process:
        for old in checkpoints(out)[2:]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()


def write_final_files(accelerator: Accelerator, out: Path, summary: dict, model, tokenizer, model_cfg,
                      mask_token_id: int | None = None) -> None:
    """The main process's last files: ``summary.json`` (with the last logged line as ``final_metrics``), the
    reward curve ``reward_curve.png`` and ``final_model/`` (LoRA: the adapter, the tokenizer and a note of the base
    model), each written atomically. ``final_model/`` also holds the run's ``config.yaml`` as :data:`RUN_CONFIG`,
    so ``dlmrl eval --model`` evaluates a moved copy as it evaluates the one in the run folder. A sharded model
    (``train.sharding: fsdp2``) is gathered into one state dict on the main process first (every process takes
    part) and saved in the same layout; ``mask_token_id``: the policy's, written into a full model's ``config.json``."""
    from dlmrl.training.sharding import full_state_dict

    state_dict = full_state_dict(model)  # (None: not sharded, saved as it is)
    if accelerator.is_main_process:
        logged = read_metrics(out / "metrics.jsonl")
        if logged:
            summary["final_metrics"] = logged[-1]
        write_json_atomic(out / "summary.json", summary)
        plot_curves(out / "metrics.jsonl", out / "reward_curve.png", summary)
        with atomic_dir(out / "final_model") as tmp:
            save_final_model(model, tokenizer, tmp, model_cfg, state_dict=state_dict, mask_token_id=mask_token_id)
            if (out / "config.yaml").is_file():
                shutil.copyfile(out / "config.yaml", tmp / RUN_CONFIG)
    accelerator.wait_for_everyone()
