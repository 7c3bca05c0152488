"""``estimator.logits_chunk``: training with token log-probs taken from the output head in chunks of positions takes
the same steps as training on full logits (diffusion and AR, with ``estimator.micro_batch`` too), the key is
checked, an AR run reads it (and ``micro_batch``), a run may resume with another value, and ``--dry-run`` says how
the log-probs are taken."""

from __future__ import annotations

import json

import pytest
import torch

from dlmrl.config import Config, ConfigError, apply_overrides, save_yaml, validate
from dlmrl.models import token_scores
from dlmrl.training.plan import build_plan
from dlmrl.training.run_folder import check_same_config
from dlmrl.training.trainer import train
from tests.helpers import save_tiny_checkpoint
from tests.tolerances import adamw_run_tol
from tests.training.test_trainer import params, small_config

LR = 1e-3
#: As tests/training/test_micro_batch.py: the chunked run sums its gradients in another order (the head's product
#: over the scored rows only, logsumexp per chunk), so the runs agree to rounding, compared in float64: 4 updates
#: (2 steps × μ 2), each weight's gradient ≤ 1000 rounded terms.
TOLERANCE = adamw_run_tol(LR, 4, terms=1000)
AR = ["model.kind=ar", "model.name_or_path=tiny-sudoku-ar", "task.answer_mode=full", "algorithm=grpo"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("base"))


def _rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _same_runs(full_out, chunked_out, initial=None) -> None:
    full, chunked = params(full_out), params(chunked_out)
    assert all(p.dtype == torch.float64 for p in full.values())
    for k in full:
        torch.testing.assert_close(chunked[k], full[k], rtol=0, atol=TOLERANCE)
    for a, b in zip(_rows(full_out), _rows(chunked_out), strict=True):
        for key in ("reward_mean", "rows_scored", "loss", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=TOLERANCE / LR, abs=TOLERANCE), key


def _count_head_chunks(monkeypatch) -> list[int]:
    sizes = []
    original = token_scores.chunked_token_logprobs

    def counting(hidden, head, target, chunk, *args, **kwargs):
        sizes.append(chunk)
        return original(hidden, head, target, chunk, *args, **kwargs)

    monkeypatch.setattr(token_scores, "chunked_token_logprobs", counting)
    return sizes


def test_diffusion_run_from_the_head_in_chunks_matches_the_full_logits_run(base, tmp_path, monkeypatch):
    sizes = _count_head_chunks(monkeypatch)
    outs = {}
    for chunk in (0, 5):
        outs[chunk] = tmp_path / f"chunk{chunk}"
        # (β > 0: the reference is scored too; μ = 2: old scores; micro_batch: the two-pass surrogate)
        cfg = small_config(base, outs[chunk], **{"estimator.logits_chunk": chunk, "estimator.micro_batch": 4,
                                                 "beta": 0.05, "eval.before": False, "eval.after": False,
                                                 "model.dtype": "float64"})
        train(cfg, progress=False)
        if chunk == 0:
            assert sizes == []  # (the full-logits run never taps the head)
    assert sizes and set(sizes) == {5}
    _same_runs(outs[0], outs[5])


def test_ar_run_in_row_micro_batches_from_the_head_matches_the_plain_run(tmp_path, monkeypatch):
    sizes = _count_head_chunks(monkeypatch)
    common = [*AR, "max_steps=2", "prompts_per_step=2", "num_generations=3", "num_iterations=2", "warmup_steps=0",
              f"learning_rate={LR}", "save_steps=2", "eval.before=false", "eval.after=false", "model.dtype=float64",
              "beta=0.05"]
    outs = {}
    for key, extra in (("plain", []), ("chunked", ["estimator.micro_batch=2", "estimator.logits_chunk=7"])):
        outs[key] = tmp_path / key
        cfg = Config()
        apply_overrides(cfg, [f"output_dir={outs[key]}", *common, *extra])
        train(cfg, progress=False)
    assert sizes and set(sizes) == {7}
    _same_runs(outs["plain"], outs["chunked"])


@pytest.mark.parametrize("value", [-1, 1.5, True])
def test_a_logits_chunk_that_is_not_a_natural_number_is_refused(value):
    cfg = Config()
    cfg.estimator.logits_chunk = value
    with pytest.raises(ConfigError, match="estimator.logits_chunk"):
        validate(cfg)


def test_an_ar_run_reads_the_scoring_keys_and_refuses_the_others():
    cfg = Config()
    apply_overrides(cfg, [*AR, "estimator.micro_batch=4", "estimator.logits_chunk=256"])
    validate(cfg)
    apply_overrides(cfg, ["estimator.num_nodes=2"])
    with pytest.raises(ConfigError, match="estimator.num_nodes"):
        validate(cfg)
    cfg = Config()
    apply_overrides(cfg, [*AR])
    cfg.estimator.micro_batch = -2
    with pytest.raises(ConfigError, match="estimator.micro_batch"):
        validate(cfg)


def test_a_run_may_resume_with_another_logits_chunk(tmp_path):
    cfg = Config()
    save_yaml(cfg, tmp_path / "config.yaml")
    apply_overrides(cfg, ["estimator.logits_chunk=512"])
    check_same_config(cfg, tmp_path / "config.yaml")  # (memory and speed only)


def test_dry_run_says_how_token_logprobs_are_taken(base, tmp_path):
    def line(*overrides):
        cfg = Config()
        apply_overrides(cfg, [f"output_dir={tmp_path / 'out'}", *overrides])
        return build_plan(cfg, spec=validate(cfg))["model"]["token_logprobs"]

    assert line(f"model.name_or_path={base}").startswith("from full logits")
    chunked = line(f"model.name_or_path={base}", "estimator.logits_chunk=64")
    assert "'tiny'" in chunked and "output head" in chunked and "64 per head call" in chunked
    assert "output head" in line(*AR, "estimator.logits_chunk=32")
