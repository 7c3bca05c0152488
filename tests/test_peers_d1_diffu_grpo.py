"""benchmarks/peers/d1_diffu_grpo_step.py without d1, TRL or LLaDA's code: the argument and clone checks, the
settings each side is given (dlmrl's resolved config against d1's ``DiffuGRPOConfig`` arguments), the prompt
placement for TRL's sampler, the checkpoint's head-row exchange, d1's per-step numbers grouped into rollout batches,
and the aggregation of repeats (checked by hand). Nothing here imports d1 or TRL or runs a training step."""

from __future__ import annotations

import argparse
import math
import statistics

import pytest
import torch

from tests.helpers import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("benchmarks/peers/d1_diffu_grpo_step.py")


def _args(**kw):
    return argparse.Namespace(**{"prompts": 2, "num_iterations": 12, "lr": 3e-6, **kw})


@pytest.mark.parametrize("argv", [["--steps", "1"], ["--repeats", "0"], ["--num-iterations", "1"], ["--prompts", "0"],
                                  ["--threads", "0"], ["--lr", "2"]])
def test_bad_arguments_refused(bench, argv, tmp_path):
    with pytest.raises(SystemExit) as e:
        bench.parse_args([str(tmp_path), "--llada-code", str(tmp_path), *argv])
    assert e.value.code == 2


def test_missing_clones_named(bench, tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args([str(tmp_path), "--llada-code", str(tmp_path)])
    assert "git clone https://github.com/dllm-reasoning/d1" in capsys.readouterr().err
    (tmp_path / "diffu-grpo").mkdir()
    (tmp_path / "diffu-grpo" / "diffu_grpo_trainer.py").write_text("")
    assert "modeling_llada.py" in bench.clone_error(tmp_path, tmp_path, None)
    (tmp_path / "modeling_llada.py").write_text("")
    assert bench.clone_error(tmp_path, tmp_path, None) is None
    assert "not a TRL checkout" in bench.clone_error(tmp_path, tmp_path, tmp_path)


def test_dlmrl_resolves_the_settings_d1_is_given(bench):
    """dlmrl's config with the overrides resolves to d1's objective and estimator, and the numbers d1's
    ``DiffuGRPOConfig`` gets are the same ones."""
    from dlmrl.config import (
        Config,
        apply_overrides,
        build_estimator,
        build_preset,
        estimator_name,
        load_yaml,
        validate,
    )

    s = bench.settings(_args())
    cfg = Config()
    load_yaml(cfg, bench.CONFIG)
    apply_overrides(cfg, bench.dlmrl_overrides(s, 4, 7, "/nowhere/ckpt", "/nowhere/run"))
    validate(cfg, data=False)
    preset = build_preset(cfg)
    o = preset.objective
    assert preset.name == "diffu_grpo" and preset.advantage == "none"  # (d1: R - group mean, no std)
    assert (o.ratio_level, o.epsilon, o.epsilon_high, o.beta, o.kl_kind, o.kl_reference) == (
        "token", 0.5, None, 0.04, "k3", "reference")
    assert o.loss_type == "bnpo"  # (d1: (per_token_loss * mask).sum() / mask.sum() over the batch)
    est = build_estimator(cfg.estimator, estimator_name(cfg), cfg.sampling)
    assert (est.name, est.p_mask_prompt, est.num_samples) == ("one_step", 0.15, 1)

    k = bench.d1_config_kwargs(s, 4, 7, "/nowhere/out")
    tr, sa, m = cfg.train, cfg.sampling, cfg.model
    assert k["max_steps"] == tr.max_steps * tr.num_iterations == 48 and k["seed"] == tr.seed == 7
    assert k["per_device_train_batch_size"] == k["generation_batch_size"] == tr.prompts_per_step * tr.num_generations
    assert k["gradient_accumulation_steps"] == tr.steps_per_generation == 1
    assert (k["num_generations"], k["num_iterations"]) == (tr.num_generations, tr.num_iterations) == (6, 12)
    assert (k["max_completion_length"], k["block_length"], k["diffusion_steps"]) == (
        sa.gen_length, sa.block_length, sa.steps) == (16, 8, 8)
    assert (k["temperature"], k["remasking"], k["cfg_scale"]) == (sa.temperature, sa.remasking, sa.cfg_scale)
    assert k["p_mask_prompt"] == est.p_mask_prompt and k["random_masking"] is True
    assert (k["epsilon"], k["beta"]) == (o.epsilon, o.beta)
    assert (k["learning_rate"], k["adam_beta1"], k["adam_beta2"], k["weight_decay"], k["max_grad_norm"]) == (
        tr.learning_rate, tr.adam_beta1, tr.adam_beta2, tr.weight_decay, tr.max_grad_norm) == (3e-6, 0.9, 0.99, 0.1,
                                                                                               0.2)
    assert k["lr_scheduler_type"] == tr.lr_scheduler_type == "constant" and k["warmup_steps"] == tr.warmup_steps == 0
    assert k["mask_id"] == 126336 and not k["bf16"] and k["use_cpu"]
    assert m.use_peft and (m.lora_r, m.lora_alpha, m.lora_dropout) == (128, 64, 0.05)
    assert m.lora_target_modules.split(",") == list(bench.LORA_TARGETS) and cfg.task.answer_mode == "full"


def test_prompts_placed_for_trls_sampler(bench):
    """TRL 0.16's ``RepeatRandomSampler`` visits ``dataset[randperm(n, seeded generator)[i]]`` at position i: the
    placed list read in that order is the original one."""
    items = [f"p{i}" for i in range(10)]
    for seed in (0, 1, 42):
        placed = bench.place_for_sampler(items, seed)
        order = torch.randperm(10, generator=torch.Generator().manual_seed(seed)).tolist()
        assert [placed[j] for j in order] == items
        assert sorted(placed) == sorted(items)


def test_swap_digit_rows(bench):
    head = torch.nn.Linear(4, 10, bias=False)
    before = head.weight.detach().clone()
    pairs = bench.swap_digit_rows(head, [7, 2, 5, 9], [1, 2, 3, 4])
    assert pairs == [(7, 1), (5, 3), (9, 4)]  # (2 is its own digit: left)
    w = head.weight.detach()
    for a, b in pairs:
        assert torch.equal(w[a], before[b]) and torch.equal(w[b], before[a])
    for i in (0, 2, 6, 8):
        assert torch.equal(w[i], before[i])
    assert bench.swap_digit_rows(head, [3, 1], [1, 3]) == []  # (a top token that is another digit: left)
    with pytest.raises(ValueError):
        bench.swap_digit_rows(head, [1], [1, 2])
    with pytest.raises(ValueError):
        bench.swap_digit_rows(head, [10], [1])


def test_most_probable_tokens(bench):
    """The mean probability over the completion positions, by hand, on a stand-in whose logits are fixed."""
    vocab, cells = 6, bench.CELLS
    logits = torch.zeros(2, 3 + cells, vocab)
    logits[0, 3:, 4] = 3.0  # row 0: token 4 likely at every completion position
    logits[1, 3:, 1] = 2.0  # row 1: token 1
    logits[:, :3, 5] = 50.0  # (prompt positions: never counted)

    class Stub(torch.nn.Module):
        def forward(self, x):
            assert x.shape == (2, 3 + cells) and (x[:, 3:] == bench.MASK_ID).all()
            return argparse.Namespace(logits=logits)

    p = (logits[:, 3:] / 0.9).softmax(-1).mean((0, 1))
    got = bench.most_probable_tokens(Stub(), torch.zeros(2, 3, dtype=torch.long), 2, 0.9)
    assert got == p.topk(2).indices.tolist() == [4, 1]


def test_d1_steps_grouped_into_rollout_batches(bench):
    assert bench.rollout_seconds([5.0, 1.0, 1.0, 4.0, 1.0, 2.0], 3) == [7.0, 7.0]
    with pytest.raises(ValueError):
        bench.rollout_seconds([1.0] * 5, 2)
    assert bench.per_rollout_mean([0.0, 0.2, 0.4, 1.0], 2) == [pytest.approx(0.1), pytest.approx(0.7)]
    assert bench.per_rollout_mean([0.1, None, 0.3], 2) == [None, None]


def test_d1_reward_is_dlmrl_reward(bench):
    """d1's reward function on the text ``SudokuTask.decode`` gives (the d1 worker's ``batch_decode``) is dlmrl's
    task reward; by hand: the solution scores 1, one wrong cell (n - 1) / n."""
    from transformers import AutoTokenizer

    import dlmrl
    from dlmrl.data.tasks import SudokuTask

    tok = AutoTokenizer.from_pretrained(f"{dlmrl.__path__[0]}/assets/tiny_sudoku")  # (local, nothing downloaded)
    task = SudokuTask(tok, tok.mask_token_id, answer_mode="full")
    ex = task.train_batch(1, 0, 0)[0]
    vocab = tok.get_vocab()
    right = [vocab[c] for c in ex.solution]
    wrong = list(right)
    wrong[ex.blanks[0]] = vocab[str(int(ex.solution[ex.blanks[0]]) % 4 + 1)]
    texts = task.decode(torch.tensor([right, wrong]))
    got = bench.sudoku_cell_accuracy(None, texts, [ex.puzzle] * 2, [ex.solution] * 2)
    n = len(ex.blanks)
    assert got == task.rewards([ex, ex], texts) == [1.0, (n - 1) / n]


def _run(seconds, reward, kl, grad):
    return {"seconds_rollout": seconds, "reward": reward, "kl": kl, "grad_norm": grad}


def test_summary_by_hand(bench):
    repeats = []
    for d, t, rd, rt in ((2.0, 4.0, 0.5, 0.4), (3.0, 3.0, 0.6, 0.5), (1.0, 4.0, 0.7, 0.6)):
        pair = {"dlmrl": _run([9.0, d, d], [rd - 0.1, rd + 0.1], [0.0, 0.2], [1.0, 1.0]),
                "d1": _run([9.0, t, t], [rt, rt], [0.0, 0.2], [1.0, 3.0])}
        for tool in ("dlmrl", "d1"):
            pair[tool]["summary"] = bench.per_run_summary(pair[tool])
        pair["ratio"] = pair["dlmrl"]["summary"]["median_seconds_rollout"] / pair["d1"]["summary"][
            "median_seconds_rollout"]
        repeats.append(pair)
    assert repeats[0]["dlmrl"]["summary"]["median_seconds_rollout"] == 2.0  # (the 9 s warm-up batch left out)
    parts = [{"first_step": 8.0, "other_steps": 1.0}, {"first_step": 3.0, "other_steps": 2.0},
             {"first_step": 5.0, "other_steps": 1.0}, {"first_step": 4.0, "other_steps": 6.0}]
    assert bench.per_run_summary({**repeats[0]["d1"], "seconds_parts": parts})["median_seconds_parts"] == {
        "first_step": 4.0, "other_steps": 2.0}  # (the first batch left out)
    s = bench.summarize(repeats)
    assert s["median_seconds_rollout"] == {"dlmrl": 2.0, "d1": 4.0}
    assert s["ratio_dlmrl_over_d1"] == {"min": 0.25, "median": 0.5, "max": 1.0}
    r = s["mean_reward"]
    assert r["dlmrl_mean"] == pytest.approx(0.6) and r["d1_mean"] == pytest.approx(0.5)
    se = math.sqrt(statistics.stdev([0.5, 0.6, 0.7]) ** 2 / 3 * 2)  # (both sides' spread is 0.1)
    assert r["standard_error"] == pytest.approx(se) and r["within_noise"] is (0.1 <= 2 * se)
    assert s["mean_kl"]["difference"] == 0.0 and s["mean_kl"]["within_noise"] is True
    g = s["mean_grad_norm"]
    assert g["d1_mean"] == 2.0 and g["d1_sd"] == 0.0 and g["within_noise"] is False  # (1 vs 2, no spread)
    assert bench.summarize(repeats[:1])["mean_reward"]["within_noise"] is None
    text = bench.format_summary(s, 3, 12)
    assert "min 0.25x" in text and "median 0.50x" in text and "NOT within" in text
    assert bench.agreement([None], [0.1], "d1")["within_noise"] is None
