"""``estimator.micro_batch``: training in chunks of canvases takes the same steps as training on all at once."""

import json

import pytest
import torch
from safetensors.torch import load_file

from dlmrl.config import Config, ConfigError, apply_overrides, save_yaml, validate
from dlmrl.estimators import scoring
from dlmrl.training.run_folder import check_same_config
from dlmrl.training.trainer import train
from tests.helpers import save_tiny_checkpoint
from tests.tolerances import adamw_run_tol
from tests.training.test_trainer import params, small_config

LR, UPDATES = 1e-3, 4  # small_config: learning_rate 1e-3, max_steps 2 × num_iterations 2
#: Chunking reorders the gradient's sums, so the runs agree to rounding: compared in float64 (in float32 they differed
#: by 2.6e-7, a machine's rounding). Each weight's gradient sums 18 canvases × 34 positions (612 products), each off by
#: the ≤ 2 × (32 + 64 + 34)-term accumulations of the 2-layer backward pass (hidden 32, MLP 64, 34 keys): ≤ 1000
#: terms; the bound is ≈ 8.9e-8 (measured ~1e-15), 1e3 below the parameters' movement (≥ 0.1·lr, checked).
TOLERANCE = adamw_run_tol(LR, UPDATES, terms=1000)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("base"))


def test_micro_batch_run_matches_the_unchunked_run(base, tmp_path, monkeypatch):
    runs, canvases_per_call = {}, {}
    score_chunk = scoring._score_chunk

    def counting_score_chunk(policy, prompt_ids, prompt_mask, completion, plan, flat, *args, **kwargs):
        canvases_per_call[micro_batch].append(len(flat))
        return score_chunk(policy, prompt_ids, prompt_mask, completion, plan, flat, *args, **kwargs)

    monkeypatch.setattr(scoring, "_score_chunk", counting_score_chunk)
    for micro_batch in (0, 4):
        canvases_per_call[micro_batch] = []
        out = tmp_path / f"mb{micro_batch}"
        # β > 0 also scores the reference model in chunks; μ = 2 uses the old scores too
        cfg = small_config(base, out, **{"estimator.micro_batch": micro_batch, "beta": 0.05, "eval.before": False,
                                         "eval.after": False, "model.dtype": "float64"})
        train(cfg, progress=False)
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        runs[micro_batch] = (params(out), rows)
    (full, full_rows), (chunked, chunked_rows) = runs[0], runs[4]
    assert max(canvases_per_call[0]) > 4 and max(canvases_per_call[4]) == 4  # the chunked run really chunks
    assert all(p.dtype == torch.float64 for p in full.values())
    for k in full:
        torch.testing.assert_close(chunked[k], full[k], rtol=0, atol=TOLERANCE)
    initial = load_file(str(base / "model.safetensors"))
    assert max((full[k] - initial[k].double()).abs().max().item() for k in full) > 0.1 * LR > 1e3 * TOLERANCE
    for a, b in zip(full_rows, chunked_rows, strict=True):
        # a metric is a function of parameters that differ by ≤ TOLERANCE, a fraction TOLERANCE/lr of their movement
        # per update (a metric that is 0 in one run, a clip fraction, may be a rounding above it in the other)
        for key in ("reward_mean", "rows_scored", "loss", "ratio_mean", "kl", "grad_norm", "clip_frac_low"):
            assert b[key] == pytest.approx(a[key], rel=TOLERANCE / LR, abs=TOLERANCE), key


@pytest.mark.parametrize("value", [-1, -100])
def test_negative_micro_batch_is_a_config_error(value):
    cfg = Config()
    apply_overrides(cfg, [f"estimator.micro_batch={value}"])
    with pytest.raises(ConfigError, match="estimator.micro_batch"):
        validate(cfg)


@pytest.mark.parametrize("value", ["2.5", "true", "many"])
def test_non_integer_micro_batch_is_a_config_error(value):
    with pytest.raises(ConfigError, match="estimator.micro_batch"):
        apply_overrides(Config(), [f"estimator.micro_batch={value}"])


def test_micro_batch_set_in_code_is_validated():
    cfg = Config()
    cfg.estimator.micro_batch = 1.5
    with pytest.raises(ConfigError, match="estimator.micro_batch"):
        validate(cfg)


def test_a_run_may_resume_with_another_micro_batch(tmp_path):
    cfg = Config()
    save_yaml(cfg, tmp_path / "config.yaml")
    apply_overrides(cfg, ["estimator.micro_batch=8"])
    check_same_config(cfg, tmp_path / "config.yaml")  # memory/speed only: allowed
    apply_overrides(cfg, ["estimator.num_nodes=2"])
    with pytest.raises(ConfigError, match="estimator.num_nodes"):
        check_same_config(cfg, tmp_path / "config.yaml")
