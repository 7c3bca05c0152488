"""The GDPO trainer: one loop that reads top to bottom (rollout, reward, advantages, old scores, μ updates,
log, checkpoint), on ``accelerate``.

Every random draw of step ``s`` comes from a generator seeded with ``(seed, s)``, so a run resumed
from a checkpoint takes exactly the same steps as an uninterrupted one.
Reference: GDPO, arXiv 2510.08554 (Algorithm 1).
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm
from transformers import get_scheduler

from dlmrl.config import Config, ConfigError, TrainConfig, load_yaml, save_yaml, to_dict, validate
from dlmrl.data import TASKS
from dlmrl.estimators import score
from dlmrl.estimators.factory import make_estimator
from dlmrl.estimators.scoring import score_and_backward
from dlmrl.models.loading import load_policy
from dlmrl.models.sampler import generate
from dlmrl.objectives import gdpo_loss, group_advantages
from dlmrl.training.checkpoint import atomic_dir, latest_checkpoint, write_json_atomic
from dlmrl.training.evaluation import evaluate
from dlmrl.training.logging import MetricsWriter, plot_curves


@dataclass
class RunState:
    """What a checkpoint needs beyond model/optimizer/scheduler: the next step and eval-before."""

    step: int = 0
    eval_before: dict | None = None
    train_seconds: float = 0.0

    def state_dict(self) -> dict:
        return {"step": self.step, "eval_before": self.eval_before, "train_seconds": self.train_seconds}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.eval_before = state["step"], state["eval_before"]
        self.train_seconds = state.get("train_seconds", 0.0)


def check_same_config(cfg: Config, saved_path: Path) -> None:
    """Refuse to resume a run with settings other than the ones it was started with.

    ``output_dir`` and ``estimator.micro_batch`` may differ (e.g. a smaller micro_batch to fit another machine).

    Raises:
        ConfigError: listing the keys whose values differ from the saved ``config.yaml``.
    """
    saved = Config()
    load_yaml(saved, saved_path)

    def flat(d, prefix=""):
        for k, v in d.items():
            yield from flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]

    old, new = dict(flat(to_dict(saved))), dict(flat(to_dict(cfg)))
    free = ("output_dir", "estimator.micro_batch")  # micro_batch changes memory and speed, not the steps taken
    diff = [f"{k}: {old[k]!r} -> {new[k]!r}" for k in old if k not in free and old[k] != new[k]]
    if diff:
        raise ConfigError(f"--resume must use the run's own settings ({saved_path}); these differ: "
                          + "; ".join(diff))


def step_generator(seed: int, step: int) -> torch.Generator:
    """The generator all randomness of one step comes from."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def build_task(cfg: Config, policy):
    t = cfg.task
    return TASKS.get(t.name)(policy.tokenizer, policy.mask_token_id, answer_mode=t.answer_mode,
                             min_blanks=t.min_blanks, max_blanks=t.max_blanks,
                             train_file=t.train_file, test_file=t.test_file)


def build_estimator(cfg: Config):
    e = cfg.estimator
    return make_estimator(e.name, e.num_nodes, e.samples_per_node, e.masking, e.stratified, e.p_mask_prompt,
                          e.t_min, e.t_max)


def gdpo_loss_fn(tr: TrainConfig, elbo_old: torch.Tensor | None, advantages: torch.Tensor, lengths: torch.Tensor,
                 elbo_ref: torch.Tensor | None, row_weight: float):
    """The loss of one μ update as a function of the current policy's per-token scores.

    Returns ``per_token (B', L) -> (row_weight · gdpo_loss, metrics)`` on ``ELBO = per_token.sum(-1)``;
    ``elbo_old`` ``None`` (the first update, where old = current) uses the new ELBO detached (ratio 1).
    """
    def loss_fn(per_token: torch.Tensor):
        new = per_token.sum(-1)  # (B',)
        old = new.detach() if elbo_old is None else elbo_old
        loss, metrics = gdpo_loss(new, old, advantages, lengths, tr.epsilon, tr.epsilon_high, tr.beta, elbo_ref)
        return loss * row_weight, metrics

    return loss_fn


def load_configured_policy(cfg: Config):
    """``load_policy`` with the ``model`` section; a load failure becomes a ``ConfigError`` naming the model."""
    m = cfg.model
    try:
        return load_policy(m.name_or_path, m.family, m.trust_remote_code, m.dtype)
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.name_or_path {m.name_or_path!r} (family {m.family!r}) cannot be loaded: {e}") from e


def evaluate_config(cfg: Config, policy, task) -> dict:
    """Held-out evaluation with the ``eval`` section's settings."""
    return evaluate(policy, task, num_puzzles=cfg.eval.num_puzzles, steps=cfg.eval.steps,
                    block_length=cfg.sampling.block_length, temperature=cfg.eval.temperature,
                    batch_size=cfg.eval.batch_size, seed=cfg.train.seed)


def train(cfg: Config, resume: bool = False, progress: bool = True) -> dict:
    """Run GDPO as configured; write the run files (see README); return ``summary.json``'s content.

    Raises:
        ConfigError: on an invalid config (before any model is loaded).
        FileNotFoundError: ``resume=True`` with no checkpoint in ``output_dir``.
    """
    validate(cfg)
    tr, out = cfg.train, Path(cfg.output_dir)
    ckpt = latest_checkpoint(out) if resume else None
    if resume and ckpt is None:
        raise FileNotFoundError(f"--resume: no checkpoint under {out / 'checkpoints'}")
    if not resume and (latest_checkpoint(out) is not None or (out / "config.yaml").exists()):
        raise ConfigError(f"output_dir {out} already holds a run; "
                          "continue that run with --resume or choose a new --output-dir")
    if resume and (out / "config.yaml").exists():
        check_same_config(cfg, out / "config.yaml")
    out.mkdir(parents=True, exist_ok=True)
    accelerator = Accelerator(log_with=None if tr.report_to == "none" else tr.report_to, project_dir=str(out))
    torch.manual_seed(tr.seed)

    policy = load_configured_policy(cfg)
    ref = load_configured_policy(cfg) if tr.beta > 0 else None  # frozen initial model for the KL term
    if ref is not None:
        ref.model.requires_grad_(False).eval().to(accelerator.device)
    task, estimator = build_task(cfg, policy), build_estimator(cfg)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=tr.learning_rate, betas=(tr.adam_beta1, tr.adam_beta2),
                                  weight_decay=tr.weight_decay)
    total_updates = tr.max_steps * tr.num_iterations
    scheduler = get_scheduler(tr.lr_scheduler_type, optimizer, num_warmup_steps=tr.warmup_steps * tr.num_iterations,
                              num_training_steps=max(total_updates, 1))
    policy.model, optimizer, scheduler = accelerator.prepare(policy.model, optimizer, scheduler)
    state = RunState()
    accelerator.register_for_checkpointing(state)
    if ckpt is not None:
        accelerator.load_state(str(ckpt))
        accelerator.print(f"resumed from {ckpt} at step {state.step}")
    if accelerator.is_main_process:
        save_yaml(cfg, out / "config.yaml")
    if tr.report_to != "none":
        accelerator.init_trackers("dlmrl", config=None)
    metrics_writer = MetricsWriter(out / "metrics.jsonl", resume_step=state.step if ckpt else None)

    if cfg.eval.before and state.eval_before is None:
        state.eval_before = evaluate_config(cfg, policy, task)
        accelerator.print(f"held-out cell accuracy before: {state.eval_before['cell_accuracy']:.4f}")

    def save_checkpoint() -> None:
        # (accelerate warns that the tied lm_head is stored once; that is expected for the tiny model)
        quiet = logging.getLogger("accelerate.utils.other")
        level, _ = quiet.level, quiet.setLevel(logging.ERROR)
        with atomic_dir(out / "checkpoints" / f"step-{state.step}") as tmp:
            accelerator.save_state(str(tmp), safe_serialization=True)
        quiet.setLevel(level)
        for old in sorted((out / "checkpoints").glob("step-*"), key=lambda p: int(p.name.split("-")[1]))[:-2]:
            shutil.rmtree(old, ignore_errors=True)

    # Ctrl-C / SIGTERM: finish the current step, save a checkpoint, exit resumable.
    stop = {"now": False}
    previous_handlers = {sig: signal.signal(sig, lambda *_: stop.update(now=True))
                         for sig in (signal.SIGINT, signal.SIGTERM)}
    bar = tqdm(total=tr.max_steps, initial=state.step, desc="gdpo", disable=not progress)
    G, s_cfg = tr.num_generations, cfg.sampling
    micro_batch = cfg.estimator.micro_batch or None  # canvases per forward call when scoring; None = all
    try:
        while state.step < tr.max_steps and not stop["now"]:
            t0 = time.time()
            gen = step_generator(tr.seed, state.step)
            # 1. rollout: G completions per prompt
            examples = task.train_batch(tr.prompts_per_step, tr.seed, state.step)
            batch = task.encode(examples, device=policy.device).repeat(G)
            policy.model.eval()
            rollout = generate(policy, batch.prompt_ids, batch.prompt_mask, gen_length=task.gen_length,
                               block_length=s_cfg.block_length, steps=s_cfg.steps, temperature=s_cfg.temperature,
                               remasking=s_cfg.remasking, cfg_scale=s_cfg.cfg_scale, canvas=batch.canvas,
                               generator=gen)
            completion = rollout.canvas  # (B, L)
            t1 = time.time()
            # 2. rewards
            rewards = torch.tensor(task.rewards(batch.examples, task.decode(completion)), dtype=torch.float32)
            # 3. advantages (group statistics)
            adv = group_advantages(rewards, G, tr.scale_rewards)  # (B,)
            # Rows with A = 0 add exactly nothing to the clipped surrogate; with β = 0 they need no scoring.
            rows = torch.arange(len(adv)) if tr.beta > 0 else torch.nonzero(adv != 0).squeeze(-1)
            row_weight = len(rows) / len(adv)
            p_ids, p_mask = batch.prompt_ids[rows], batch.prompt_mask[rows]
            comp, comp_mask = completion[rows], batch.completion_mask[rows]
            lengths = comp_mask.sum(-1).float()  # (B',) tokens scored
            # (no row to score: every group's rewards were equal, so this batch carries no signal)
            plans = ([estimator.make_plan(comp_mask, gen, p_mask) for _ in range(tr.num_iterations)]
                     if len(rows) else [])
            # 4. old (and reference) scores, once per rollout batch, on the same MaskPlans
            with torch.no_grad():
                old = [None] + [score(policy, p_ids, p_mask, comp, comp_mask, plan, micro_batch).sequence
                                for plan in plans[1:]]
                ref_scores = ([score(ref, p_ids, p_mask, comp, comp_mask, plan, micro_batch).sequence
                               for plan in plans]
                              if ref is not None else [None] * len(plans))
            t2 = time.time()
            # 5. μ inner updates, each on a fresh MaskPlan shared by old/new/ref
            policy.model.train()
            logs: list[dict] = []
            lr_used = scheduler.get_last_lr()[0]
            with warnings.catch_warnings():  # torch warns when the schedule moves without an optimizer step
                warnings.simplefilter("ignore", UserWarning)
                for _ in range(tr.num_iterations - len(plans)):
                    scheduler.step()  # nothing to learn from this batch; keep the schedule on the step count
            for j, plan in enumerate(plans):
                # score with grad and back-propagate the GDPO loss; in chunks of micro_batch canvases
                # (two-pass surrogate, same gradient) when they do not all fit in one forward call
                loss_fn = gdpo_loss_fn(tr, old[j], adv[rows], lengths, ref_scores[j], row_weight)
                loss, m, _ = score_and_backward(policy, p_ids, p_mask, comp, comp_mask, plan, loss_fn, micro_batch,
                                                backward=accelerator.backward)
                if tr.max_grad_norm > 0:
                    m["grad_norm"] = float(accelerator.clip_grad_norm_(policy.model.parameters(), tr.max_grad_norm))
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
                logs.append({**m, "loss": loss.item()})
            # 6. log
            state.step += 1
            elapsed = time.time() - t0
            state.train_seconds += elapsed
            record = {"step": state.step, "reward_mean": rewards.mean().item(), "reward_std": rewards.std().item(),
                      "solve_rate": (rewards == 1).float().mean().item(), "rows_scored": len(rows),
                      "lr": lr_used, "nfe_sampling": rollout.nfe, "nfe_scoring": estimator.nfe,
                      "seconds_rollout": t1 - t0, "seconds_scoring_old": t2 - t1, "seconds_update": time.time() - t2,
                      "seconds_step": elapsed}
            for key in ("loss", "ratio_mean", "ratio_min", "ratio_max", "clip_frac_low", "clip_frac_high", "kl",
                        "grad_norm"):
                vals = [lg[key] for lg in logs if key in lg]
                record[key] = sum(vals) / len(vals) if vals else None
            if cfg.eval.eval_steps and state.step % cfg.eval.eval_steps == 0:
                record["eval_cell_accuracy"] = evaluate_config(cfg, policy, task)["cell_accuracy"]
            if accelerator.is_main_process and state.step % tr.logging_steps == 0:
                metrics_writer.write(record)
                if tr.report_to != "none":
                    accelerator.log(record, step=state.step)
            bar.update(1)
            bar.set_postfix(reward=f"{record['reward_mean']:.3f}", rows=len(rows))
            # 7. checkpoint
            if state.step % tr.save_steps == 0 or state.step == tr.max_steps or stop["now"]:
                save_checkpoint()
    finally:
        bar.close()
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
    if stop["now"]:  # the loop saved a checkpoint after the step it finished
        accelerator.print(f"interrupted at step {state.step}; continue with --resume")
        raise KeyboardInterrupt

    eval_after = evaluate_config(cfg, policy, task) if cfg.eval.after else None
    summary = {"eval_before": state.eval_before, "eval_after": eval_after, "steps": state.step,
               "train_seconds": round(state.train_seconds, 1)}
    if eval_after and state.eval_before:
        summary["cell_accuracy_gain"] = eval_after["cell_accuracy"] - state.eval_before["cell_accuracy"]
        accelerator.print(f"held-out cell accuracy: before {state.eval_before['cell_accuracy']:.4f} "
                          f"after {eval_after['cell_accuracy']:.4f}")
    if accelerator.is_main_process:
        rows_logged = (out / "metrics.jsonl").read_text().splitlines()
        if rows_logged:
            summary["final_metrics"] = json.loads(rows_logged[-1])
        write_json_atomic(out / "summary.json", summary)
        plot_curves(out / "metrics.jsonl", out / "reward_curve.png", summary)
        with atomic_dir(out / "final_model") as tmp:
            accelerator.unwrap_model(policy.model).save_pretrained(tmp, safe_serialization=True)
            policy.tokenizer.save_pretrained(tmp)
    accelerator.end_training()
    return summary
