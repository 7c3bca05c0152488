"""Next-token SFT of the tiny AR default: the loss, the targets, the config entry point, the checkpoint."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from dlmrl.config import ConfigError
from dlmrl.data.sudoku import SudokuExample
from dlmrl.data.tasks import SudokuTask
from dlmrl.models.ar import (
    AutoregressivePolicy,
    build_tiny_causal_model,
    load_ar_policy,
    resolve_ar_model_path,
)
from dlmrl.models.tokenizer import build_char_tokenizer
from dlmrl.pretraining.ar import (
    ARPretrainConfig,
    ar_sft_loss,
    load_ar_pretrain_config,
    main,
    pretrain_ar,
    sft_targets,
)
from tests.tolerances import forward_tol

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "pretrain_tiny_sudoku_ar.yaml"
TINY = ["hidden_size=16", "num_layers=1", "num_heads=2", "intermediate_size=32", "steps=3", "batch_size=4",
        "warmup_steps=1", "eval_puzzles=4"]


def test_targets_are_the_solution_cells_then_eos():
    tok = build_char_tokenizer()
    task = SudokuTask(tok, tok.mask_token_id, answer_mode="full")
    ex = SudokuExample("0234341221434321", "1234341221434321")
    targets = sft_targets(task, [ex], tok.eos_token_id)
    assert targets.shape == (1, 17) and targets[0, -1] == tok.eos_token_id
    assert tok.decode(targets[0, :16]) == ex.solution


def test_sft_loss_is_the_mean_negative_log_likelihood_of_the_targets_by_hand():
    tok = build_char_tokenizer()
    model = build_tiny_causal_model(len(tok), 16, 1, 2, 32, seed=3).double()  # (equal to rounding: in float64)
    policy = AutoregressivePolicy(model, tok, eos_token_id=2, pad_token_id=0)
    prompt, target = [1, 6, 7, 15], [8, 9, 2]
    loss = ar_sft_loss(policy, torch.tensor([prompt]), torch.ones(1, 4, dtype=torch.bool), torch.tensor([target]),
                       torch.ones(1, 3, dtype=torch.bool))
    logits = model(input_ids=torch.tensor([prompt + target])).logits[0]
    nll = [-logits[len(prompt) - 1 + t].log_softmax(-1)[y].item() for t, y in enumerate(target)]
    assert loss.dtype == torch.float64
    # NLL ≤ ~log 19 (a near-uniform fresh model); 1 layer × (16 hidden + 7 keys + 32 MLP) + 19 vocabulary terms
    assert loss.item() == pytest.approx(sum(nll) / 3, abs=forward_tol(scale=math.log(19), terms=16 + 7 + 32 + 19))


def test_the_shipped_config_loads_and_the_shipped_model_was_built_from_it():
    cfg = load_ar_pretrain_config(str(CONFIG))
    assert isinstance(cfg, ARPretrainConfig) and cfg.kind == "ar"
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.intermediate_size) == (64, 4, 4, 192)
    assert (cfg.min_blanks, cfg.max_blanks) == (2, 5)  # the diffusion default's SFT blanks
    shipped = yaml.safe_load((Path(resolve_ar_model_path("tiny-sudoku-ar")) / "pretrain_config.yaml").read_text())
    ours = yaml.safe_load(CONFIG.read_text())
    assert {k: shipped[k] for k in ours} == ours


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="kind"):
        load_ar_pretrain_config(str(CONFIG), ["kind=diffusion"])
    with pytest.raises(ConfigError, match="unknown config key"):
        load_ar_pretrain_config(None, ["no_such_key=1"])
    with pytest.raises(ConfigError, match="num_heads"):
        load_ar_pretrain_config(None, ["hidden_size=10", "num_heads=4"])


def test_pretrain_writes_a_loadable_checkpoint_through_the_module_entry_point(tmp_path, capsys):
    out = tmp_path / "m"
    assert main(["--config", str(CONFIG), "--output-dir", str(out), "--no-progress", *TINY]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["kind"] == "ar" and summary["steps"] == 3
    assert 0.0 <= summary["eval_greedy"]["cell_accuracy"] <= 1.0 and summary["eval_greedy"]["num_puzzles"] == 4
    assert {"model.safetensors", "config.json", "tokenizer.json", "pretrain_summary.json",
            "pretrain_config.yaml"} <= {p.name for p in out.iterdir()}
    policy = load_ar_policy(str(out))
    assert policy.kind == "ar" and policy.model.config.hidden_size == 16
    assert yaml.safe_load((out / "pretrain_config.yaml").read_text())["kind"] == "ar"
    # a rebuild into the same folder replaces the earlier pretrain checkpoint and is reproducible
    again = pretrain_ar(load_ar_pretrain_config(str(CONFIG), TINY, str(out)), progress=False)
    assert again["final_loss"] == summary["final_loss"]


def test_pretrain_never_replaces_a_foreign_folder(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("keep me")
    assert main(["--output-dir", str(tmp_path), "--no-progress", *TINY]) == 2
    assert "not a dlmrl pretrain checkpoint" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "keep me"


def test_dlmrl_pretrain_dispatches_on_kind(tmp_path, capsys, monkeypatch):
    from dlmrl import cli
    from dlmrl.pretraining import loop as diffusion_pretrain

    monkeypatch.setattr(diffusion_pretrain, "pretrain", lambda cfg: pytest.fail("kind=ar ran the diffusion SFT"))
    out = tmp_path / "ar"
    assert cli.main(["pretrain", "--config", str(CONFIG), "--output-dir", str(out), *TINY]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["kind"] == "ar"
    assert load_ar_policy(str(out)).eos_token_id is not None

    calls = []
    monkeypatch.setattr(diffusion_pretrain, "pretrain", lambda cfg: calls.append(cfg.kind) or {"kind": "diffusion"})
    assert cli.main(["pretrain", "--output-dir", str(tmp_path / "d"), *TINY]) == 0  # default kind: diffusion
    assert calls == ["diffusion"]

    assert cli.main(["pretrain", "--output-dir", str(tmp_path / "x"), "kind=autoregressive"]) == 2
    assert "'kind'" in capsys.readouterr().err
