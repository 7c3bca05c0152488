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

The pieces live beside it, one per stage: :mod:`~dlmrl.training.run_setup` (building the run),
:mod:`~dlmrl.training.sample_step` (step 1), :mod:`~dlmrl.training.update` (steps 3–5),
:mod:`~dlmrl.training.run_folder` (checkpoints and the run's files).

Reference: GDPO, arXiv 2510.08554 (Algorithm 1).
"""

from __future__ import annotations

import signal
import time

import torch
from tqdm.auto import tqdm

from dlmrl.config import Config, validate
from dlmrl.models.ar import HapoTemperature
from dlmrl.models.sampler import left_to_right_reveal_steps
from dlmrl.objectives.entropy import HapoEntropyStats
from dlmrl.training.anchors import add_anchors
from dlmrl.training.callbacks import Callbacks
from dlmrl.training.checkpoint import latest_checkpoint
from dlmrl.training.collapse import CollapseMonitor
from dlmrl.training.dynamic_sampling import SamplingStats
from dlmrl.training.finite import NonFiniteError, step_problem
from dlmrl.training.rollout import Rollout
from dlmrl.training.run_folder import save_checkpoint, write_final_files
from dlmrl.training.run_setup import Run, evaluate_config, set_up_run
from dlmrl.training.sample_step import sample_step, shaped_rewards, step_generator
from dlmrl.training.update import (
    UpdateBatch,
    UpdateResult,
    mismatch_metrics,
    prepare_update,
    run_updates,
    update_metrics,
)


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
        dlmrl.training.finite.NonFiniteError: a step's rewards (every one), loss, gradient norm or weights went
            non-finite; the run stops before that step's checkpoint (the saved ones stay finite).
    """
    spec = validate(cfg, data=task is None)
    hooks = Callbacks(callbacks)
    run = set_up_run(cfg, spec, resume, policy, task)  # accelerator, policy (+ KL reference), task, scorer, optimizer
    tr, state, accelerator, preset = cfg.train, run.state, run.accelerator, run.preset

    def held_out() -> dict:
        metrics = evaluate_config(cfg, run.policy, run.task, trained_steps=state.step)
        hooks.on_evaluate(metrics)
        return metrics

    def budget_spent() -> bool:
        return bool(tr.max_completions) and state.completions_total >= tr.max_completions

    if cfg.eval.before and state.eval_before is None:
        state.eval_before = held_out()
        accelerator.print(f"held-out {run.metric} before: {state.eval_before[run.metric]:.4f}")

    monitor = CollapseMonitor(tr.collapse_window, tr.collapse_ratio, tr.stop_on_collapse, tr.collapse_direction)
    monitor.load_state_dict(state.collapse)
    collapsed = False  # (train.stop_on_collapse: the monitor fired; the run ends after this step's checkpoint)
    # Ctrl-C / SIGTERM: finish the current step, save a checkpoint, exit resumable.
    stop = {"now": False}
    previous_handlers = {sig: signal.signal(sig, lambda *_: stop.update(now=True))
                         for sig in (signal.SIGINT, signal.SIGTERM)}
    bar = tqdm(total=tr.max_steps, initial=state.step, desc=tr.algorithm,
               disable=not progress or not accelerator.is_main_process)
    try:
        while state.step < tr.max_steps and not stop["now"] and not budget_spent() and not collapsed:
            t0 = time.time()
            gen = step_generator(tr.seed, state.step)
            # 1. rollout and rewards: G completions per prompt (flow_grpo: G episodes, one row per turn; DAPO:
            #    only groups whose rewards differ, with new prompts sampled until there are enough)
            run.policy.model.eval()
            ro, sampled = sample_step(run.policy, run.task, cfg, preset, state.step, gen, run.max_length,
                                      hapo_temperature(run), run.env, run.pad_id,
                                      run.processes)  # (several processes: every one holds the whole batch)
            t1 = time.time()
            # 2. DaGRPO: each group with no reward above the threshold gets its reference solution as an anchor
            anchors = 0
            if preset.anchor_threshold is not None and len(ro):
                ro, anchors = add_anchors(ro, run.task, preset.anchor_threshold, run.kind,
                                          getattr(run.policy, "eos_token_id", None), run.pad_id,
                                          lambda r, n: shaped_rewards(preset, r, n, run.max_length),
                                          lambda m: left_to_right_reveal_steps(m, cfg.sampling.block_length,
                                                                               cfg.sampling.steps))
            # 3.–4. advantages, the rows worth scoring (this process's share), old and reference scores
            batch = prepare_update(run, ro, gen)
            t2 = time.time()
            # 5. μ inner updates (diffusion: each on a fresh MaskPlan shared by old/new/ref)
            result = run_updates(run, batch)
            # a step whose rewards, loss or weights went non-finite stops the run before its checkpoint
            stop_if_non_finite(run, sampled, result)
            # train.sync_ref_model: the reference moves toward the policy every ref_model_sync_steps optimizer steps
            before, state.optimizer_steps = state.optimizer_steps, state.optimizer_steps + len(result.logs)
            ref_synced = run.synced_ref is not None and run.synced_ref.due(before, state.optimizer_steps)
            if ref_synced:
                run.synced_ref.sync()
            # 6. log
            state.step += 1
            state.completions_total += sampled.completions
            state.nfe_sampling_total += sampled.nfe
            elapsed = time.time() - t0
            state.train_seconds += elapsed
            record = step_record(run, ro, sampled, batch, result, anchors, (t0, t1, t2), elapsed)
            if run.synced_ref is not None:
                record["ref_synced"] = ref_synced
            # the collapse monitor: sample_nll and kl against their running baselines (a warning naming the step)
            fields, warning = monitor.observe(state.step, record)
            record.update(fields)
            state.collapse = monitor.state_dict()
            if warning is not None:
                accelerator.print(f"dlmrl: {warning}")
                collapsed = collapsed or monitor.stop
            if cfg.eval.eval_steps and state.step % cfg.eval.eval_steps == 0:
                record[f"eval_{run.metric}"] = held_out()[run.metric]
            stop["now"] = run.processes.any(stop["now"])  # (a signal that reached one process stops them all)
            if accelerator.is_main_process and state.step % tr.logging_steps == 0:
                run.metrics_writer.write(record)
                if tr.report_to != "none":
                    accelerator.log({k: v for k, v in record.items() if isinstance(v, (int, float))}, step=state.step)
                hooks.on_log(record)
            bar.update(1)
            bar.set_postfix(reward=f"{record['reward_mean']:.3f}", rows=len(batch.rows))
            # 7. checkpoint (also when the rollout budget train.max_completions is spent: the run ends here)
            if (state.step % tr.save_steps == 0 or state.step == tr.max_steps or stop["now"]
                    or budget_spent() or collapsed):
                save_checkpoint(accelerator, run.out, state.step)
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

    # the end: held-out evaluation, summary.json, the reward curve, final_model/
    metric = run.metric
    eval_after = held_out() if cfg.eval.after else None
    summary = {"eval_before": state.eval_before, "eval_after": eval_after, "steps": state.step,
               "stop_reason": "collapse" if collapsed else "max_completions" if budget_spent() else "max_steps",
               "completions_total": state.completions_total, "nfe_sampling_total": state.nfe_sampling_total,
               "train_seconds": round(state.train_seconds, 1)}
    if eval_after and state.eval_before:
        summary[f"{metric}_gain"] = eval_after[metric] - state.eval_before[metric]
        accelerator.print(f"held-out {metric}: before {state.eval_before[metric]:.4f} after {eval_after[metric]:.4f}")
    write_final_files(accelerator, run.out, summary, accelerator.unwrap_model(run.policy.model),
                      run.policy.tokenizer, cfg.model, getattr(run.policy, "mask_token_id", None))
    if run.processes.count > 1:
        # (gloo's worker threads may still be dropping the tensors of the last collectives, which takes the GIL;
        # end_training destroys the process group holding the GIL and would wait for them forever: let them
        # finish first. pytorch/pytorch#56297, #75097)
        time.sleep(0.2)
    accelerator.end_training()
    return summary


def stop_if_non_finite(run: Run, sampled: SamplingStats, result: UpdateResult) -> None:
    """Raise :class:`~dlmrl.training.finite.NonFiniteError` on every process when the step went non-finite on any
    (:func:`~dlmrl.training.finite.step_problem`), before its checkpoint is written."""
    problem = step_problem(sampled.rewards, sampled.reward_parts, result.logs, run.policy.model)
    problems = [p for p in run.processes.gather(problem) if p]  # (every process stops, or none)
    if problems:
        newest = latest_checkpoint(run.out)
        resume = (f"checkpoints up to {newest.name} hold finite values; --resume redoes this step with the same "
                  "settings and seeds, so it helps only when the cause was outside the run; otherwise start a new run "
                  "(another output_dir) with other settings" if newest is not None else "no checkpoint was saved yet")
        raise NonFiniteError(f"step {run.state.step + 1} went non-finite: {problems[0]}; the run stopped before "
                             f"saving this step ({resume})")


def hapo_temperature(run: Run) -> HapoTemperature | None:
    """HAPO's sampling temperature ``T·(1 + τ·ĥ_t)`` for an AR preset with ``adaptive_temperature_tau``, ĥ normalised
    by the previous step's entropy statistics (``None`` otherwise: the plain temperature)."""
    if not run.kind.autoregressive or run.preset.adaptive_temperature_tau is None:
        return None
    stats = HapoEntropyStats(**run.state.hapo_stats) if run.state.hapo_stats else None
    return HapoTemperature(stats, run.preset.adaptive_temperature_tau)


def step_record(run: Run, ro: Rollout, sampled: SamplingStats, batch: UpdateBatch, result: UpdateResult,
                anchors: int, times: tuple[float, float, float], elapsed: float) -> dict:
    """Step 6: the step's line of ``metrics.jsonl`` (README, "Run files"): rewards of the policy's own samples
    (every round; episodes: per trajectory), rollout counts and NFE, the objective's metrics averaged over the μ
    updates (several processes: the whole batch's), timings in seconds, and the parts' own metrics."""
    state, tr, (t0, t1, t2) = run.state, run.cfg.train, times
    rewards = sampled.rewards
    solved = run.solved
    record = {"step": state.step, "reward_mean": rewards.mean().item(), "reward_std": rewards.std().item(),
              "solve_rate": (rewards == solved).float().mean().item() if solved is not None else None,
              "rows_scored": len(batch.rows),
              "groups_dropped": sampled.groups_dropped, "rollout_rounds": sampled.rounds,
              "completions_sampled": sampled.completions, "completions_total": state.completions_total,
              "lr": result.lr, "nfe_sampling": sampled.nfe, "nfe_sampling_total": state.nfe_sampling_total,
              "sampling_passes": sampled.passes,
              "nfe_scoring": run.scorer.nfe,
              "seconds_rollout": t1 - t0, "seconds_scoring_old": t2 - t1, "seconds_update": time.time() - t2,
              "seconds_scoring": result.seconds_scoring, "seconds_optimizer": result.seconds_optimizer,
              "seconds_step": elapsed}
    if sampled.reward_parts is not None:  # each reward function's rewards/<name>/mean and /std (TRL's)
        record.update(run.task.reward_functions.metrics(sampled.reward_parts))
    if run.gap_measured and ro.token_logprobs is not None:
        record.update(mismatch_metrics(batch.mismatch if batch.own_rows else None, run.processes,
                                       tr.rollout_is_cap))
    if run.preset.anchor_threshold is not None:
        record["anchors"] = anchors
    if ro.turns is not None:  # tools inside the rollout: turns and tool errors per trajectory
        record["turns_mean"] = ro.turns.float().mean().item() if len(ro) else None
        record["tool_errors_mean"] = ro.tool_errors.float().mean().item() if len(ro) else None
        record["observation_tokens_mean"] = ro.observation_mask.sum(-1).float().mean().item() if len(ro) else None
    elif run.env is not None:
        record["turns_mean"] = len(ro) / max(len(sampled.rewards), 1)
    record.update(update_metrics(run.processes, batch, result))  # (averaged over the optimizer steps)
    if ro.token_logprobs is not None and len(ro):
        # (the collapse monitor's series from the sampler's own record where there is one: the log-prob of each token
        # under the distribution it was drawn from, not an estimator's per-token terms; every process holds the batch)
        tokens = ro.completion_mask.to(torch.float32)
        record["sample_nll"] = float(-(ro.token_logprobs.float() * tokens).sum() / tokens.sum().clamp_min(1))
    return record
