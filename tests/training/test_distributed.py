"""Data-parallel pieces without launching processes: the split of a batch by whole groups, the mismatch
errors, the loss weights that make the processes' average the whole-batch loss, every random draw of a row
independent of the split (sampler, AR sampling, MaskPlans), and sharded sampling (processes simulated by
threads) giving the 1-process batch, DAPO rounds and Flow-GRPO episodes included."""

from __future__ import annotations

import threading

import pytest
import torch

from dlmrl.config import Config, ConfigError, apply_overrides, build_preset
from dlmrl.data.tasks import SudokuTask
from dlmrl.estimators import ESTIMATORS
from dlmrl.models.sampler import generate
from dlmrl.objectives.objective import GroupObjective
from dlmrl.training.distributed import (
    Processes,
    check_process_split,
    group_share,
    loss_share,
    split_range,
)
from dlmrl.training.sample_step import sample_step, step_generator
from tests.tolerances import SHIPPED_TERMS, forward_tol, rounding_tol


def config(*overrides: str) -> Config:
    cfg = Config()
    apply_overrides(cfg, ["prompts_per_step=4", "num_generations=3", *overrides])
    return cfg


# -- the split ----------------------------------------------------------------------------------


def test_split_range_covers_every_item_once_in_order():
    for n in (0, 1, 4, 7):
        for count in (1, 2, 3):
            parts = [split_range(n, i, count) for i in range(count)]
            assert [x for lo, hi in parts for x in range(lo, hi)] == list(range(n))
            assert max(hi - lo for lo, hi in parts) - min(hi - lo for lo, hi in parts) <= 1


def test_group_share_keeps_groups_whole_anchors_included():
    # 3 groups of 2 consecutive rows, then DaGRPO anchors of groups 0 and 2 appended at the end
    group_ids = torch.tensor([0, 0, 1, 1, 2, 2, 0, 2])
    shares = [group_share(group_ids, i, 2).tolist() for i in range(2)]
    assert shares == [[0, 1, 6], [2, 3, 4, 5, 7]]  # groups {0} and {1, 2}: each anchor stays with its group
    assert group_share(group_ids, 0, 1).tolist() == list(range(8))
    # episodes: a trajectory's turns share its group, groups of different sizes
    assert group_share(torch.tensor([5, 5, 5, 9, 9]), 1, 2).tolist() == [3, 4]


@pytest.mark.parametrize(("overrides", "processes", "match"), [
    (["prompts_per_step=6"], 4, r"train.prompts_per_step.*6 prompts do not split over 4 processes.*multiple of 4"),
    (["prompts_per_step=3"], 2, "do not split over 2 processes"),
    (["num_generations=1"], 1, "train.num_generations"),
    (["num_generations=1"], 2, "train.num_generations"),
    (["algorithm=sspo"], 2, "train.algorithm.*'sspo'.*one process"),
    (["algorithm=hapo", "model.kind=ar", "model.name_or_path=tiny-sudoku-ar", "task.answer_mode=full"], 2,
     "'hapo'.*one process"),
])
def test_a_batch_that_does_not_split_is_refused_before_training(overrides, processes, match):
    with pytest.raises(ConfigError, match=match):
        check_process_split(config(*overrides), processes)


def test_a_batch_that_splits_is_accepted():
    check_process_split(config("prompts_per_step=6"), 1)
    check_process_split(config("prompts_per_step=6"), 3)
    check_process_split(config("algorithm=sspo"), 1)  # (one process holds the whole batch)
    check_process_split(config("algorithm=dapo", "prompts_per_step=8"), 4)


def test_the_cli_refuses_a_mismatch_before_loading_a_model(monkeypatch, capsys, tmp_path):
    from dlmrl import cli

    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setattr("dlmrl.training.run_setup.load_configured_policy",
                        lambda cfg: pytest.fail("no model may be loaded"))
    assert cli.main(["train", f"output_dir={tmp_path / 'run'}", "prompts_per_step=6"]) == 2
    assert "do not split over 4 processes" in capsys.readouterr().err


# -- the loss weights ---------------------------------------------------------------------------


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo"])
def test_process_losses_average_to_the_whole_batch_loss_and_gradient(loss_type):
    g = torch.Generator().manual_seed(0)
    B, L, P = 12, 5, 3
    mask = torch.rand(B, L, generator=g) < 0.7
    mask[4] = False  # a row without tokens (grpo leaves it out of its mean)
    logp = torch.randn(B, L, generator=g, dtype=torch.float64) * 0.3 - 1
    old = logp + 0.05 * torch.randn(B, L, generator=g, dtype=torch.float64)
    ref = logp + 0.1 * torch.randn(B, L, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    groups = torch.arange(B) // 3
    obj = GroupObjective(loss_type=loss_type, beta=0.04, epsilon=0.2)
    num_tokens = mask.sum().double()

    whole = logp.clone().requires_grad_(True)
    obj(whole, old, adv, mask, logp_ref=ref, num_tokens=num_tokens)[0].backward()
    procs = logp.clone().requires_grad_(True)
    total = 0.0
    for p in range(P):
        rows = group_share(groups, p, P)
        weight = P * loss_share(loss_type, mask[rows], mask)
        loss = obj(procs[rows], old[rows], adv[rows], mask[rows], logp_ref=ref[rows], num_tokens=num_tokens)[0]
        total = total + weight * loss / P  # DDP averages the processes' gradients
    total.backward()
    loss_whole = obj(logp, old, adv, mask, logp_ref=ref, num_tokens=num_tokens)[0]
    # float64 sums of the ≤ B·L = 60 token terms (|term| ≤ ~10: |A| ≤ 3, ratios ≈ 1, KL ≤ 1) in another grouping,
    # plus the weights' few roundings; a gradient entry is one token's term, scaled: n·eps·scale (tests/tolerances.py)
    tol = rounding_tol(scale=10.0, n=B * L + 8, dtype=torch.float64)  # ≈ 1.5e-13
    assert float(total.detach()) == pytest.approx(float(loss_whole.detach()), rel=0, abs=tol)
    torch.testing.assert_close(procs.grad, whole.grad, rtol=0, atol=tol)


# -- random draws independent of the split --------------------------------------------------------


@pytest.mark.parametrize("remasking", ["low_confidence", "random"])
@pytest.mark.parametrize(("steps", "block_length"), [(8, 8), (8, 4)])
def test_sampler_rows_get_their_whole_batch_draws(toy_policy, remasking, steps, block_length):
    # float64: a share runs its rows in a smaller batch, whose logits may round otherwise (a BLAS kernel per shape);
    # in float32 a draw within a rounding of a tie could flip on another machine, in float64 (≤ 1e-13) it does not
    toy_policy.model.double()
    B, L, P = 5, 8, 4
    g = torch.Generator().manual_seed(1)
    prompt_ids = torch.randint(0, 6, (B, P), generator=g)
    prompt_mask = torch.ones(B, P, dtype=torch.bool)
    prompt_mask[1, :2] = False  # left padding
    canvas = torch.randint(0, 6, (B, L), generator=g)
    for row, blanks in enumerate([[0, 1], [2], list(range(8)), [5, 6, 7], [3]]):  # fewer masks than steps
        canvas[row, blanks] = toy_policy.mask_token_id
    kw = {"gen_length": L, "block_length": block_length, "steps": steps, "temperature": 1.0,
          "remasking": remasking, "canvas": canvas}
    gen = torch.Generator().manual_seed(7)
    whole = generate(toy_policy, prompt_ids, prompt_mask, generator=gen, **kw)
    after = torch.rand(4, generator=gen)
    for start, stop in [(0, 1), (1, 3), (3, 5), (2, 3)]:
        gen = torch.Generator().manual_seed(7)
        part = generate(toy_policy, prompt_ids, prompt_mask, generator=gen, rows=(start, stop), **kw)
        assert torch.equal(part.canvas, whole.canvas[start:stop])
        assert part.nfe == whole.nfe  # the steps of the whole batch, even those where these rows reveal nothing
        assert torch.equal(torch.rand(4, generator=gen), after)  # the generator advanced by the whole batch
    with pytest.raises(ValueError, match="rows"):
        generate(toy_policy, prompt_ids, prompt_mask, generator=gen, rows=(2, 2), **kw)


@pytest.mark.parametrize("chunk", [None, 7])
def test_noise_of_a_row_slice_is_the_whole_batch_noise(monkeypatch, chunk):
    from dlmrl.models import gumbel

    if chunk:
        monkeypatch.setattr(gumbel, "_SKIP_CHUNK", chunk)  # several chunks, none aligned with a row
    ref = torch.Generator().manual_seed(3)
    whole = torch.rand((6, 4, 5), generator=ref, dtype=torch.float64)
    gen = torch.Generator().manual_seed(3)
    assert torch.equal(gumbel._uniform((2, 4, 5), gen, torch.device("cpu"), rows=(3, 6)), whole[3:5])
    assert torch.equal(gen.get_state(), ref.get_state())  # advanced by the whole batch


@pytest.fixture(scope="module")
def ar_policy():
    """In float64, as ``diffusion_policy``: shares sample their rows in smaller batches (see above)."""
    from dlmrl.models.ar import load_ar_policy

    return load_ar_policy("tiny-sudoku-ar", dtype="float64")


@pytest.mark.parametrize(("temperature", "top_p", "hapo"), [(1.0, 1.0, False), (0.7, 0.9, False), (1.0, 1.0, True)])
def test_ar_rows_get_their_whole_batch_draws(ar_policy, temperature, top_p, hapo):
    task = SudokuTask(ar_policy.tokenizer, ar_policy.tokenizer.mask_token_id or 0, answer_mode="full")
    b = task.encode(task.test_batch(5)).repeat(2)  # (10, P)
    factor = (lambda ids, scores: torch.full((scores.shape[0],), 1.3)) if hapo else None

    def run(lo, hi, rows=True):
        extra = {"noise_rows": (lo, len(b.examples))} if rows else {}
        return ar_policy.generate(b.prompt_ids[lo:hi], b.prompt_mask[lo:hi], 17, temperature=temperature,
                                  top_p=top_p, generator=torch.Generator().manual_seed(0), temperature_fn=factor,
                                  **extra)

    plain = run(0, 10, rows=False)  # transformers' own multinomial draw
    assert torch.equal(run(0, 10).completion, plain.completion)  # the same numbers, drawn by the processor
    parts = [run(0, 4), run(4, 5), run(5, 10)]
    assert torch.equal(torch.cat([p.completion for p in parts]), plain.completion)
    assert torch.equal(torch.cat([p.completion_mask for p in parts]), plain.completion_mask)


def test_a_plan_cut_to_rows_keeps_each_rows_masks():
    mask = torch.rand(6, 7, generator=torch.Generator().manual_seed(0)) < 0.8
    for name in ("sdmc", "double_mc", "coupled", "one_step"):
        est = ESTIMATORS.get(name)()
        plan = est.make_plan(mask, torch.Generator().manual_seed(1), torch.ones(6, 3, dtype=torch.bool))
        rows = torch.tensor([4, 1])
        cut = plan.rows(rows)
        assert torch.equal(cut.masks, plan.masks[:, rows]) and torch.equal(cut.weights, plan.weights[:, rows])
        assert torch.equal(cut.t, plan.t if plan.t.dim() == 1 else plan.t[:, rows])
        if plan.prompt_masks is not None:
            assert torch.equal(cut.prompt_masks, plan.prompt_masks[:, rows])


# -- sharded sampling: processes simulated by threads ---------------------------------------------


class ThreadProcesses(Processes):
    """A process of a group of threads: ``gather`` exchanges objects through a barrier."""

    def __init__(self, index: int, count: int, hub: dict):
        super().__init__(index, count)
        self.hub = hub

    def gather(self, obj):
        slots, barrier = self.hub["slots"], self.hub["barrier"]
        slots[self.index] = obj
        barrier.wait()
        out = list(slots)
        barrier.wait()
        return out


def run_processes(count: int, fn):
    """``fn(processes)`` in ``count`` threads; their results in process order."""
    hub = {"slots": [None] * count, "barrier": threading.Barrier(count, timeout=120)}
    results, errors = [None] * count, []

    def body(i):
        try:
            results[i] = fn(ThreadProcesses(i, count, hub))
        except BaseException as e:  # noqa: BLE001 (raised in the test's thread below)
            errors.append(e)
            hub["barrier"].abort()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


@pytest.fixture(scope="module")
def diffusion_policy():
    """The shipped model in float64: a process samples its share in a smaller batch, whose logits may round
    otherwise; float64 keeps every draw and threshold decision away from a rounding-level tie (≤ 1e-13)."""
    from dlmrl.models.loading import load_policy

    return load_policy(dtype="float64")


@pytest.mark.parametrize(("kind", "overrides"), [
    ("diffusion", []),
    ("diffusion", ["algorithm=dapo", "sampling.remasking=random"]),
    ("diffusion", ["sampling.threshold=0.6"]),  # (threshold decoding: every share takes its own steps)
    ("diffusion", ["algorithm=dapo", "sampling.threshold_factor=1.0"]),
    ("ar", ["algorithm=dapo"]),
    ("ar", ["algorithm=flow_grpo"]),
])
def test_sharded_sampling_gives_every_process_the_one_process_batch(kind, overrides, diffusion_policy, ar_policy):
    from dlmrl.envs import default_env
    from dlmrl.training.run_setup import build_task

    ar = ["model.kind=ar", "model.name_or_path=tiny-sudoku-ar", "task.answer_mode=full"] if kind == "ar" else []
    cfg = config(*ar, *overrides)
    policy = ar_policy if kind == "ar" else diffusion_policy
    preset, task = build_preset(cfg), build_task(cfg, policy)
    env = default_env("sudoku") if preset.multi_turn else None
    max_length = task.gen_length + 1 if kind == "ar" else task.gen_length
    if preset.overlong_cache_fraction is not None and kind == "ar":
        max_length = 20

    def sample(processes):
        gen = step_generator(0, 1)
        ro, stats = sample_step(policy, task, cfg, preset, 1, gen, max_length, None, env, 0, processes)
        return ro, stats, torch.rand(3, generator=gen)

    one, *_ = run_processes(1, sample)
    two = run_processes(2, sample)
    three = run_processes(3, sample) if kind == "diffusion" and not overrides else []  # (shares of 1 and 2 prompts)
    for ro, stats, after in [*two, *three]:
        assert torch.equal(ro.completion, one[0].completion)
        assert torch.equal(ro.completion_mask, one[0].completion_mask)
        assert torch.equal(ro.prompt_ids[ro.prompt_mask], one[0].prompt_ids[one[0].prompt_mask])
        assert torch.equal(ro.group_ids, one[0].group_ids) and torch.equal(ro.trajectories(), one[0].trajectories())
        assert torch.equal(ro.train_rewards, one[0].train_rewards)
        assert [repr(e) for e in ro.examples] == [repr(e) for e in one[0].examples]
        assert (stats.rounds, stats.completions, stats.groups_dropped, stats.nfe) == (
            one[1].rounds, one[1].completions, one[1].groups_dropped, one[1].nfe)
        assert torch.equal(stats.rewards, one[1].rewards)
        assert torch.equal(after, one[2])  # the step generator is where it is after a 1-process rollout
        if kind == "diffusion":
            assert stats.passes == one[1].passes
            assert torch.equal(ro.reveal_step, one[0].reveal_step) and torch.equal(ro.row_nfe, one[0].row_nfe)
            # stored in float32: float64 values ≤ forward_tol apart round to ≤ one float32 ulp apart (|log p| ≤ 16)
            assert one[0].token_logprobs.abs().max() <= 16
            tol = rounding_tol(scale=16, n=1) + forward_tol(scale=16, terms=SHIPPED_TERMS)
            torch.testing.assert_close(ro.token_logprobs, one[0].token_logprobs, atol=tol, rtol=0)


@pytest.mark.parametrize("var", ["ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED"])
def test_fsdp_and_deepspeed_are_refused_without_an_accelerator(var, monkeypatch):
    """accelerate enables FSDP only on accelerator devices and turns DeepSpeed off on CPU: the run would train as
    plain data parallelism without a word, so it is refused (also when accelerate launch --cpu drops the config's
    backend)."""
    from types import SimpleNamespace

    from dlmrl.training import distributed

    monkeypatch.setattr(distributed, "_accelerator_device_available", lambda: False)
    monkeypatch.setenv(var, "true")
    with pytest.raises(ConfigError, match="no GPU"):
        distributed.check_sharding_backend()
    monkeypatch.delenv(var)
    distributed.check_sharding_backend()  # nothing asked: fine
    config = SimpleNamespace(distributed_type="DistributedType.FSDP")
    monkeypatch.setattr(distributed, "_cpu_launch", lambda: (SimpleNamespace(use_fsdp=False, use_deepspeed=False),
                                                             config))
    with pytest.raises(ConfigError, match="FSDP was asked for"):
        distributed.check_sharding_backend()
    monkeypatch.setattr(distributed, "_accelerator_device_available", lambda: True)
    distributed.check_sharding_backend()  # (on GPUs accelerate runs them)


@pytest.mark.parametrize(("env", "said"), [
    ({}, False),                                                              # (no launcher)
    ({"ACCELERATE_MIXED_PRECISION": "no"}, True),                             # (its one process)
    ({"ACCELERATE_MIXED_PRECISION": "no", "RANK": "0"}, True),                # (rank 0 of those it started)
    ({"ACCELERATE_MIXED_PRECISION": "no", "RANK": "1"}, False),
    ({"ACCELERATE_MIXED_PRECISION": "no", "RANK": "0", "DLMRL_CPU_RELAUNCH": "1"}, False),  # (dlmrl's own)
])
def test_a_failure_under_accelerate_launch_is_said_once_with_the_launchers_note(env, said, monkeypatch, capsys):
    """accelerate launch turns every failed exit into a traceback of its own and exit code 1 (only --quiet leaves
    the traceback out): the process it watches says so once, under the error's own line."""
    from dlmrl import cli
    from dlmrl.training import distributed

    for key in ("ACCELERATE_MIXED_PRECISION", "RANK", distributed.RELAUNCHED):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert (distributed.launcher_note() is not None) == said
    cli._report_failure("dlmrl train: the error")
    err = capsys.readouterr().err
    assert err.startswith("dlmrl train: the error\n")
    assert ("accelerate launch --quiet leaves the traceback out" in err) == said


def test_the_cpu_relaunch_waits_for_its_processes_on_ctrl_c_instead_of_killing_them(monkeypatch, capsys):
    """Ctrl-C reaches dlmrl's process and the CPU processes together: it waits while they save their checkpoint
    and exits 130 (subprocess.call killed them and raised a traceback)."""
    import subprocess

    from dlmrl import cli
    from dlmrl.training import distributed

    events = []

    class Child:
        def __init__(self, cmd, env):
            events.append(("start", env.get(distributed.RELAUNCHED)))
            self.waits = 0

        def wait(self):
            self.waits += 1
            if self.waits == 1:
                raise KeyboardInterrupt
            events.append("waited")
            return -2

        def kill(self):
            events.append("killed")

    monkeypatch.setattr(distributed, "requested_cpu_processes", lambda: 2)
    monkeypatch.setattr(subprocess, "Popen", Child)
    assert cli.main(["train", "prompts_per_step=2", "output_dir=unused_run_dir"]) == 130
    assert events == [("start", "1"), "waited"]
