"""``estimator.micro_batch``: training in chunks of canvases takes the same steps as training on all at once."""

import json

import pytest
import torch

from dlmrl.config import Config, ConfigError, apply_overrides, save_yaml, validate
from dlmrl.estimators import scoring
from dlmrl.training.run_folder import check_same_config
from dlmrl.training.trainer import train
from tests.helpers import save_tiny_checkpoint
from tests.training.test_trainer import params, small_config


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
                                         "eval.after": False})
        train(cfg, progress=False)
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        runs[micro_batch] = (params(out), rows)
    (full, full_rows), (chunked, chunked_rows) = runs[0], runs[4]
    assert max(canvases_per_call[0]) > 4 and max(canvases_per_call[4]) == 4  # the chunked run really chunks
    for k in full:
        torch.testing.assert_close(chunked[k], full[k], rtol=0, atol=1e-5)
    for a, b in zip(full_rows, chunked_rows, strict=True):
        for key in ("reward_mean", "rows_scored", "loss", "ratio_mean", "kl", "grad_norm", "clip_frac_low"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key


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
