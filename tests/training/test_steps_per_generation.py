"""Several optimizer steps per rollout batch (``train.steps_per_generation``, TRL's name): the batch's groups are
shuffled and cut into mini-batches, each its own loss and optimizer step, all against the old scores the rollout
policy gave before the first step; the LR schedule moves once per optimizer step; the config check warns where a
configured clip or KL toward the old policy cannot act (every update at ratio 1); ``--dry-run`` shows the split.

The oracle is a hand-written loop: the initial model, the rollout the trainer drew, the mini-batches by the
documented rule (groups by first appearance, ``randperm`` from the step's generator, contiguous runs), the
rollout policy's scores taken once without grad, then per mini-batch: the preset's objective on its rows, backward,
gradient clipping, AdamW. The runs are in float64 and the loop runs the same operations in the same order, so the
parameters are compared bit for bit.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dlmrl import cli
from dlmrl.config import Config, ConfigError, apply_overrides, load_yaml, validate
from dlmrl.config.resolve import build_preset
from dlmrl.estimators import score
from dlmrl.objectives.advantage_registry import AdvantageInputs
from dlmrl.objectives.presets import AlgorithmPreset
from dlmrl.training import trainer
from dlmrl.training.run_setup import build_estimator
from dlmrl.training.trainer import train
from dlmrl.training.update import split_minibatches
from tests.helpers import crash_then_resume, save_tiny_checkpoint

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
LR = 1e-3
AR = {"model.kind": "ar", "model.name_or_path": "tiny-sudoku-ar", "task.answer_mode": "full",
      "algorithm": "grpo", "kl_reference": "old"}  # (grpo's k3 KL, beta 0.04, toward the rollout policy)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("base"))


def run_config(out: Path, **extra) -> Config:
    cfg = Config()
    overrides = {"output_dir": str(out), "max_steps": 1, "prompts_per_step": 4, "num_generations": 3,
                 "sampling.steps": 4, "eval.before": False, "eval.after": False, "save_steps": 1,
                 "learning_rate": LR, "warmup_steps": 0, "lr_scheduler_type": "constant", "model.dtype": "float64"}
    overrides.update(extra)
    apply_overrides(cfg, [f"{k}={v}" for k, v in overrides.items()])
    return cfg


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def capture_rollouts(monkeypatch) -> list:
    """Record each step's rollout batch and the state of its generator where the update begins."""
    seen = []
    original = trainer.prepare_update

    def spy(run, ro, gen):
        seen.append((ro, gen.get_state().clone()))
        return original(run, ro, gen)

    monkeypatch.setattr(trainer, "prepare_update", spy)
    return seen


def oracle(cfg: Config, policy, ro, gen_state: torch.Tensor) -> list[dict]:
    """The hand-written loop of one rollout step with ``cfg.train.steps_per_generation`` mini-batches; trains
    ``policy`` in place and returns each optimizer step's objective metrics."""
    tr = cfg.train
    count = tr.steps_per_generation
    preset = build_preset(cfg)
    assert preset.objective.beta > 0  # (so no zero-advantage row is skipped: every row is in the loss)
    adv = preset.advantages(AdvantageInputs(ro.train_rewards, tr.num_generations, mask=ro.completion_mask,
                                            group_ids=ro.group_ids, trajectory_ids=ro.trajectories()))
    gen = torch.Generator()
    gen.set_state(gen_state)
    ids = ro.group_ids.tolist()
    groups = list(dict.fromkeys(ids))  # (by first appearance)
    perm = torch.randperm(len(groups), generator=gen).tolist() if count > 1 else list(range(len(groups)))
    minibatches = []
    for k in range(count):
        chosen = {groups[i] for i in perm[len(groups) * k // count: len(groups) * (k + 1) // count]}
        minibatches.append(torch.tensor([r for r, g in enumerate(ids) if g in chosen]))
    def args(rows):
        return ro.prompt_ids[rows], ro.prompt_mask[rows], ro.completion[rows], ro.completion_mask[rows]

    plan = None
    if cfg.model.kind != "ar":  # (the plan is drawn after the permutation, from the same generator, for every row)
        plan = build_estimator(cfg).rollout_plan(ro.completion_mask, gen, ro.prompt_mask,
                                                 reveal_step=ro.reveal_step, advantages=adv)

    def scores(rows):
        if plan is None:
            return policy.token_logprobs(*args(rows))[0]
        return score(policy, *args(rows), plan.rows(rows)).per_token
    everything = torch.arange(len(ro))
    policy.model.eval()
    with torch.no_grad():
        old = scores(everything)  # the rollout policy's, once, before any step
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=LR, betas=(tr.adam_beta1, tr.adam_beta2),
                                  weight_decay=tr.weight_decay)
    logs = []
    policy.model.train()
    for k, rows in enumerate(minibatches):
        new = scores(rows)
        # (the first step: the policy has not moved, its old scores are its own)
        logp_old = new.detach() if k == 0 else old[rows]
        mask = ro.completion_mask[rows]
        loss, m = preset.objective(new, logp_old, adv[rows], mask, group_ids=ro.group_ids[rows],
                                   num_tokens=mask.sum().clamp(min=1).float())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.model.parameters(), tr.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
        logs.append(m)
    return logs


def assert_same_parameters(out: Path, policy) -> None:
    trained = load_file(str(out / "final_model" / "model.safetensors"))
    mine = policy.model.state_dict()
    assert trained and all(t.dtype == torch.float64 for t in trained.values())
    for key, value in trained.items():
        assert torch.equal(value, mine[key]), key


@pytest.mark.parametrize("count", [1, 2])
def test_ar_steps_equal_the_hand_written_mini_batch_loop(count, tmp_path, monkeypatch):
    """AR GRPO with its k3 KL toward the rollout policy: with one mini-batch the single update sees ratio 1 and a
    KL of exactly 0 (what TraceRL's recipes had); with two, the second step's ratio moves off 1 and its KL is
    positive, and the parameters are the oracle's, bit for bit."""
    from dlmrl.models.ar import load_ar_policy

    seen = capture_rollouts(monkeypatch)
    cfg = run_config(tmp_path, steps_per_generation=count, **AR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (count 1: kl_reference old at ratio 1 is warned about)
        train(cfg, progress=False)
    (ro, state), = seen
    policy = load_ar_policy("tiny-sudoku-ar", False, "float64")
    logs = oracle(cfg, policy, ro, state)
    assert_same_parameters(tmp_path, policy)
    record, = metrics(tmp_path)
    assert record["kl"] == sum(m["kl"] for m in logs) / count  # the metrics: the mean over the optimizer steps
    assert logs[0]["ratio_min"] == logs[0]["ratio_max"] == 1.0 and logs[0]["kl"] == 0.0
    if count == 2:
        assert logs[1]["ratio_min"] < 1 < logs[1]["ratio_max"] and logs[1]["kl"] > 0 and record["kl"] > 0


def test_diffusion_tracerl_steps_equal_the_hand_written_loop(base, tmp_path, monkeypatch):
    """TraceRL on the trajectory likelihood of a diffusion policy (its mini-batches score their rows of the
    plan): two optimizer steps, the second with ratio off 1 and a positive k3 KL toward the rollout policy."""
    from dlmrl.models.loading import load_policy

    seen = capture_rollouts(monkeypatch)
    cfg = run_config(tmp_path, **{"model.name_or_path": str(base), "algorithm": "tracerl",
                                  "steps_per_generation": 2})
    train(cfg, progress=False)
    (ro, state), = seen
    policy = load_policy(str(base), "auto", False, "float64")
    logs = oracle(cfg, policy, ro, state)
    assert_same_parameters(tmp_path, policy)
    assert logs[1]["ratio_min"] < 1 < logs[1]["ratio_max"] and logs[1]["kl"] > 0
    assert metrics(tmp_path)[0]["kl"] == (logs[0]["kl"] + logs[1]["kl"]) / 2 > 0


def test_mini_batches_are_whole_shuffled_groups():
    groups = torch.tensor([5, 5, 2, 2, 9, 9, 9, 4])  # (groups of any size, in any order)
    gen = torch.Generator().manual_seed(3)
    parts = split_minibatches(groups, 3, gen)
    assert sorted(torch.cat(parts).tolist()) == list(range(8))  # every row once
    for part in parts:
        assert part.tolist() == sorted(part.tolist())
        inside = set(groups[part].tolist())
        assert all((groups == g).sum() == (groups[part] == g).sum() for g in inside)  # whole groups
    assert sorted(len(set(groups[p].tolist())) for p in parts) == [1, 1, 2]  # 4 groups in runs of 1, 1, 2
    untouched = torch.Generator().manual_seed(3)
    assert [p.tolist() for p in split_minibatches(groups, 1, untouched)] == [list(range(8))]
    assert torch.equal(untouched.get_state(), torch.Generator().manual_seed(3).get_state())  # (nothing drawn)


def recorded_learning_rates(monkeypatch) -> list[float]:
    seen: list[float] = []
    original = torch.optim.AdamW.step

    def step(self, *args, **kwargs):
        seen.append(self.param_groups[0]["lr"])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    return seen


def test_the_schedule_moves_once_per_optimizer_step(tmp_path, monkeypatch):
    """Linear schedule, warm-up 1 rollout step, 2 rollout steps of 2 optimizer steps: 4 steps, 2 of warm-up."""
    seen = recorded_learning_rates(monkeypatch)
    cfg = run_config(tmp_path, **AR, steps_per_generation=2, max_steps=2, warmup_steps=1, lr_scheduler_type="linear")
    train(cfg, progress=False)
    assert seen == [0.0, 0.5 * LR, LR, 0.5 * LR]
    assert [r["lr"] for r in metrics(tmp_path)] == [0.0, LR]  # (the first optimizer step's, per rollout step)


@pytest.mark.parametrize("signal", ["one_group", "none"])
def test_a_mini_batch_without_signal_only_moves_the_schedule(signal, base, tmp_path, monkeypatch):
    """GDPO skips rows of advantage 0: a mini-batch holding only such rows (here the first group's) takes no
    optimizer step, and a batch with none at all takes none, but the schedule still moves once per mini-batch."""
    original = AlgorithmPreset.advantages

    def advantages(self, inputs):
        a = torch.zeros_like(original(self, inputs))
        if signal == "one_group":  # (the second group: +1, -1, +1)
            rows = torch.nonzero(inputs.group_ids != inputs.group_ids[0]).squeeze(-1)
            a[rows] = torch.tensor([1.0, -1.0, 1.0])[: len(rows)].to(a)
        return a

    monkeypatch.setattr(AlgorithmPreset, "advantages", advantages)
    seen = recorded_learning_rates(monkeypatch)
    cfg = run_config(tmp_path, **{"model.name_or_path": str(base), "prompts_per_step": 2,
                                  "steps_per_generation": 2, "max_steps": 2, "lr_scheduler_type": "linear"})
    train(cfg, progress=False)
    rows = metrics(tmp_path)
    assert [r["lr"] for r in rows] == [LR, 0.5 * LR]  # 2 of the 4 schedule steps gone after the first rollout step
    if signal == "none":
        assert seen == [] and all(r["loss"] is None for r in rows)
    else:  # one optimizer step per rollout step, at the schedule position of its mini-batch
        assert len(seen) == 2 and seen[0] in (LR, 0.75 * LR) and seen[1] in (0.5 * LR, 0.25 * LR)
        assert all(r["rows_scored"] == 3 for r in rows)


def test_a_resumed_run_takes_the_same_mini_batches(tmp_path, monkeypatch):
    """The mini-batch order is drawn from the step's generator and the schedule is saved with the checkpoint, so a
    run resumed after a crash reaches the uninterrupted run's parameters bit for bit (nothing new is stored)."""
    def run(out: Path, resume: bool = False) -> None:
        cfg = run_config(out, **AR, steps_per_generation=2, max_steps=4, save_steps=2, lr_scheduler_type="linear")
        train(cfg, resume=resume, progress=False)

    run(tmp_path / "full")
    crash_then_resume(monkeypatch, lambda resume: run(tmp_path / "crashed", resume), 3)
    a = load_file(str(tmp_path / "full" / "final_model" / "model.safetensors"))
    b = load_file(str(tmp_path / "crashed" / "final_model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["lr"] for r in metrics(tmp_path / "crashed")] == [r["lr"] for r in metrics(tmp_path / "full")]


def shipped_sdar(*overrides: str) -> Config:
    cfg = Config()
    load_yaml(cfg, CONFIGS / "sdar_tracerl_math.yaml")
    apply_overrides(cfg, list(overrides))
    return cfg


def test_the_warning_names_the_keys_that_cannot_act():
    # the SDAR recipe as it shipped before (one optimizer step per rollout batch): beta and epsilon do nothing
    with pytest.warns(UserWarning, match=r"config keys train\.beta, train\.epsilon have no effect: .*ratio is 1 .*"
                                         r"k3 KL toward the rollout policy .* and nothing is clipped"):
        validate(shipped_sdar("train.steps_per_generation=1"), data=False)
    with pytest.warns(UserWarning, match=r"config keys train\.kl_reference have no effect"):
        validate(run_config(Path("unused"), **AR), data=False)  # (grpo's own beta, toward the rollout policy)
    with pytest.warns(UserWarning, match=r"config keys train\.epsilon, train\.delta have no effect"):
        validate(run_config(Path("unused"), algorithm="grpo", epsilon=0.3, delta=2.0), data=False)


@pytest.mark.parametrize("overrides", [
    (),  # the recipe as shipped: 8 optimizer steps per rollout batch
    ("train.steps_per_generation=1", "train.num_iterations=2"),  # μ = 2: later updates see a moved policy
    ("train.steps_per_generation=1", "train.kl_kind=k1"),  # (k1's gradient is not 0 at ratio 1) ... and epsilon:
], ids=["shipped", "mu2", "k1"])
def test_no_warning_where_the_keys_act(overrides):
    cfg = shipped_sdar(*overrides)
    if "train.kl_kind=k1" in overrides:
        cfg.train.epsilon = None  # (the clip would still be warned about)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        validate(cfg, data=False)


@pytest.mark.parametrize("overrides", [
    {"algorithm": "tracerl"},  # the preset's own beta (not configured): the plan says it, no warning
    {"algorithm": "grpo", "beta": 0.1},  # a KL toward the frozen reference acts at ratio 1
    {"algorithm": "grpo", "dual_clip": 0},  # 0 = off
    {"algorithm": "wd1", "epsilon": 0.3},  # ratio-free: no clip to act
])
def test_no_warning_for_keys_that_act_or_are_not_configured(overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        validate(run_config(Path("unused"), **overrides), data=False)


@pytest.mark.parametrize(("value", "message"), [
    (0, "must be an integer >= 1"), (1.5, "must be an integer >= 1"), (True, "must be an integer >= 1"),
    (3, ("3 mini-batches of whole groups do not split a rollout batch of train.prompts_per_step 4 groups evenly; "
         "use a divisor of it (1, 2, 4)")),
])
def test_bad_steps_per_generation_is_refused_naming_the_key(value, message):
    cfg = run_config(Path("unused"))
    cfg.train.steps_per_generation = value  # (set in code: the command line and YAML refuse non-integers already)
    with pytest.raises(ConfigError, match=r"config key 'train\.steps_per_generation': " + re.escape(message)):
        validate(cfg, data=False)


def test_a_whole_batch_loss_is_refused_with_mini_batches(tmp_path, capsys):
    p = tmp_path / "sspo.yaml"
    p.write_text("train:\n  algorithm: sspo\n  prompts_per_step: 4\n  steps_per_generation: 2\n")
    assert cli.main(["train", "--config", str(p), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "train.steps_per_generation" in err and "whole batch" in err and "line 4" in err


@pytest.mark.parametrize("name", ["sdar_tracerl_math", "llada2_tracerl_math"])
def test_the_tracerl_recipes_dry_run_shows_the_split(name, tmp_path, capsys):
    from tests.test_recipes import dry_run

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no key of the recipe is inert)
        plan = dry_run(CONFIGS / f"{name}.yaml", tmp_path, capsys)
    sizes, algorithm = plan["sizes"], plan["algorithm"]
    assert (sizes["steps_per_generation"], sizes["updates_per_step"]) == (8, 8)
    assert sizes["minibatch"] == {"groups": 8, "completions": 128}
    assert "8 mini-batches of 8 whole groups (128 completions" in sizes["update_order"]
    assert "ratio differs from 1" in sizes["update_order"]
    assert sizes["lr_schedule"].startswith("640 optimizer steps (80 rollout steps x 8)")
    assert algorithm["steps_per_generation"] == 8 and "ratio" not in algorithm
    assert algorithm["kl"] == "k3 at token level, toward the rollout policy"  # (no "0 with gradient 0" note)
    with pytest.warns(UserWarning, match=r"config keys train\.beta, train\.epsilon have no effect"):
        before = dry_run(CONFIGS / f"{name}.yaml", tmp_path, capsys, "train.steps_per_generation=1")
    assert before["algorithm"]["ratio"].startswith("1 at every token")
    assert "0 with gradient 0 here" in before["algorithm"]["kl"]
