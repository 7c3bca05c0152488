"""A policy kind from outside the package: the README's example kind (a masked-diffusion kind whose rollouts reveal
the canvas left to right), registered by a module of the user's, trained 2 steps through the public Python API and
planned by ``--dry-run``; the trainer, the config check and the plan reach it through the kind object only."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch
import yaml

from dlmrl import Trainer, cli, plugins
from dlmrl.config import Config, ConfigError, apply_overrides, validate
from dlmrl.kinds import KINDS, MaskedDiffusionKind, kind_of
from tests.training.test_api import cells_right, small, state, sudoku_dataset

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_kind_module(tag: str) -> str:
    """The README's example kind (the first python block after "A policy kind of your own"), its name made unique
    per test (``left_to_right_<tag>``)."""
    text = README.read_text()
    section = text[text.index("### A policy kind of your own"):]
    block = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    for stmt in ('name = "left_to_right"', 'KINDS.register("left_to_right")'):
        assert stmt in block, stmt
        block = block.replace(stmt, stmt.replace('"left_to_right"', f'"left_to_right_{tag}"'))
    return block


@pytest.fixture
def user_kind(tmp_path, monkeypatch, request):
    """The README's kind module written into ``tmp_path`` (on sys.path) and imported; its registration undone
    after (so no other test sees a fourth kind in its messages)."""
    tag = re.sub(r"\W", "_", request.node.name)[-30:]
    mod = f"user_kind_{tag}"
    (tmp_path / f"{mod}.py").write_text(readme_kind_module(tag))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins, "_loaded", set())
    saved = dict(KINDS._items)
    yield tmp_path, mod, f"left_to_right_{tag}"
    KINDS._items.clear()
    KINDS._items.update(saved)
    sys.modules.pop(mod, None)


def test_the_readme_kind_trains_two_steps_through_the_python_api(user_kind, monkeypatch):
    """The trainer samples through the kind object (its ``sample`` runs every step, with remasking left_to_right,
    which reveals position by position), the run logs 2 steps and the weights move."""
    tmp, mod, name = user_kind
    __import__(mod)
    assert isinstance(kind_of(name), MaskedDiffusionKind)
    seen = []  # (what reaches the masked-diffusion sampler the kind reuses, through its super().sample)
    real = MaskedDiffusionKind.sample

    def sample(self, policy, task, cfg, *args, **kwargs):
        ro = real(self, policy, task, cfg, *args, **kwargs)
        seen.append((cfg.sampling.remasking, ro.completion.shape[0]))
        return ro

    monkeypatch.setattr(MaskedDiffusionKind, "sample", sample)
    trainer = Trainer("tiny-sudoku", reward_funcs=[cells_right], train_dataset=sudoku_dataset(0, 8),
                      config=small(tmp / "run", **{"model.kind": name, "eval.before": False, "eval.after": False}))
    before = state(trainer.policy.model)
    trainer.train(progress=False)
    rows = [json.loads(x) for x in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    # (2 prompts x G 2 per step; the kind's own remasking, though the recipe's config says low_confidence)
    assert seen == [("left_to_right", 4), ("left_to_right", 4)]
    assert trainer.config.sampling.remasking == "low_confidence"
    after = trainer.policy.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    saved = json.loads((tmp / "run" / "final_model" / "config.json").read_text())
    assert saved["dlmrl_kind"] == name  # (the saved model records the kind it was trained as)


def test_the_dry_run_and_the_list_show_the_kind(user_kind, capsys):
    tmp, mod, name = user_kind
    assert cli.main(["train", f"model.kind={name}", "--dry-run"]) == 2  # (without the import: unknown)
    assert f"unknown policy kind {name!r}; use diffusion, block, ar" in capsys.readouterr().err
    assert cli.main(["train", "--import", mod, f"model.kind={name}", f"output_dir={tmp / 'run'}", "--dry-run"]) == 0
    plan = yaml.safe_load(capsys.readouterr().out.split("\n", 1)[1])
    assert plan["model"]["kind"] == name and plan["model"]["family"] == "tiny (detected)"
    assert plan["sampler"]["remasking"] == "left_to_right (the kind's rollouts)"
    assert cli.main(["train", f"output_dir={tmp / 'run'}", "--dry-run"]) == 0
    diffusion = yaml.safe_load(capsys.readouterr().out.split("\n", 1)[1])
    assert plan["estimator"] == diffusion["estimator"]  # (the masked-diffusion kind's likelihood, inherited)
    assert cli.main(["list", "kinds", "--import", mod]) == 0
    listed = capsys.readouterr().out
    assert all(k in listed for k in ("diffusion", "block", "ar", name)) and "left to right" in listed


def test_a_kind_reaches_the_config_check_through_its_capabilities(user_kind):
    """A preset for causal LMs is refused on the new kind as on diffusion (its algorithm_policy), and a block size
    is refused as for any kind that is not block (the base class's check)."""
    _, mod, name = user_kind
    __import__(mod)
    cfg = Config()
    apply_overrides(cfg, [f"model.kind={name}", "train.algorithm=hapo"])
    with pytest.raises(ConfigError, match=f"runs on ar policies only, but model.kind is '{name}'"):
        validate(cfg)
    cfg = Config()
    apply_overrides(cfg, [f"model.kind={name}", "model.block_size=4"])
    with pytest.raises(ConfigError, match="config key 'model.block_size'"):
        validate(cfg)


def test_a_kinds_lora_adapter_loads_back_as_that_kind(user_kind):
    """A LoRA run under the README's kind saves an adapter whose note records that kind; the config check adopts
    it and the kind's loader (the masked-diffusion loader it inherits) puts the adapter back on its base."""
    from dlmrl.models.lora import is_peft_model
    from dlmrl.training.run_setup import load_configured_policy

    tmp, mod, name = user_kind
    __import__(mod)
    trainer = Trainer("tiny-sudoku", reward_funcs=[cells_right], train_dataset=sudoku_dataset(0, 4),
                      config=small(tmp / "run", **{"model.kind": name, "model.use_peft": True, "train.max_steps": 1,
                                                   "eval.before": False, "eval.after": False}))
    trainer.train(progress=False)
    final = tmp / "run" / "final_model"
    assert json.loads((final / "dlmrl_base_model.json").read_text())["kind"] == name
    cfg = Config()
    apply_overrides(cfg, [f"model.name_or_path={final}"])
    validate(cfg, for_training=False)
    assert cfg.model.kind == name  # (the recorded kind, adopted)
    assert is_peft_model(load_configured_policy(cfg).model)


def test_the_api_trains_a_policy_object_of_a_kind_of_your_own(user_kind):
    """A policy object whose class sets ``kind`` to a registered kind's name is a dlmrl policy to the Python API
    (``dlmrl.kinds.is_policy``) and trains as that kind."""
    from dlmrl.kinds import is_policy, policy_kind
    from dlmrl.models.loading import load_policy
    from dlmrl.models.policy import MaskedDiffusionPolicy

    tmp, mod, name = user_kind
    __import__(mod)

    class OwnPolicy(MaskedDiffusionPolicy):
        kind = name

    base = load_policy("tiny-sudoku")
    policy = OwnPolicy(**{f: getattr(base, f) for f in base.__dataclass_fields__ if f != "kind"})
    assert is_policy(policy) and policy_kind(policy).name == name
    assert policy_kind(base).name == "diffusion"  # (a plain masked-diffusion policy stays the built-in kind's)
    trainer = Trainer(policy, reward_funcs=[cells_right], train_dataset=sudoku_dataset(0, 4),
                      config=small(tmp / "run", **{"train.max_steps": 1, "eval.before": False, "eval.after": False}))
    assert trainer.config.model.kind == name
    trainer.train(progress=False)
