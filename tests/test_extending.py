"""Extending dlmrl from outside the package: an estimator class and an algorithm preset registered by a module
that ``dlmrl train --import`` loads, chosen by name and configured through ``estimator.options``; estimators built
as ``cls(**options)`` from the config and describing themselves; bad options named by their key and YAML line."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from dlmrl import cli, plugins
from dlmrl.config import Config, ConfigError, apply_overrides, build_estimator, validate
from dlmrl.estimators import ESTIMATORS, SDMC, SPGEstimator, Trajectory
from dlmrl.objectives.presets import ALGORITHMS

#: a user's estimator and preset, as a module of their own ({tag} keeps registry names unique per test)
USER_MODULE = '''
from dataclasses import dataclass

import torch

from dlmrl.estimators import ESTIMATORS, MaskPlan, PlanEstimator
from dlmrl.estimators.validation import check_positive_int
from dlmrl.objectives.objective import GroupObjective
from dlmrl.objectives.presets import ALGORITHMS, AlgorithmPreset

BUILT, PLANS = [], []  # (the presets the run built, the plans it drew)


@ESTIMATORS.register("all_masked_{tag}")
@dataclass(frozen=True)
class AllMasked(PlanEstimator):
    """``copies`` canvases with the whole completion masked, weight 1/copies each (d1's one-step scores)."""

    copies: int = 1
    name = "all_masked_{tag}"
    nfe_formula = "copies"

    def __post_init__(self):
        check_positive_int(self.copies, "copies")

    @property
    def nfe(self):
        return self.copies

    def make_plan(self, completion_mask, generator=None, prompt_mask=None):
        PLANS.append(self.copies)
        k, allowed = self.copies, completion_mask.bool()
        weights = allowed.any(-1).float()[None].expand(k, -1) / k
        return MaskPlan(masks=allowed[None].expand(k, -1, -1).clone(), weights=weights.clone(),
                        t=torch.ones(k, dtype=torch.float64))


@ALGORITHMS.register("my_gdpo_{tag}")
def my_gdpo():
    """GDPO's sequence ratio at epsilon 0.3, scored by all_masked with 2 copies."""
    BUILT.append(1)
    return AlgorithmPreset("my_gdpo_{tag}", GroupObjective("sequence", epsilon=0.3), "none",
                           policies=("diffusion",), estimator="all_masked_{tag}", estimator_options={{"copies": 2}})
'''

SMALL = ["max_steps=2", "prompts_per_step=2", "num_generations=2", "save_steps=10", "eval.before=false",
         "eval.after=false", "--no-progress"]


@pytest.fixture
def user_module(tmp_path, monkeypatch, request):
    """The user's module written into ``tmp_path`` (on sys.path); its registrations and import undone after."""
    tag = re.sub(r"\W", "_", request.node.name)[-40:]
    mod = f"user_ext_{tag}"
    (tmp_path / f"{mod}.py").write_text(USER_MODULE.format(tag=tag))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins, "_loaded", set())
    saved = dict(ESTIMATORS._items), dict(ALGORITHMS._items)
    yield tmp_path, mod, tag
    for registry, items in zip((ESTIMATORS, ALGORITHMS), saved):
        registry._items.clear()
        registry._items.update(items)
    sys.modules.pop(mod, None)


def write_yaml(path, estimator: str, algorithm: str = "gdpo") -> str:
    (path / "run.yaml").write_text(f"train:\n  algorithm: {algorithm}\nestimator:\n{estimator}")
    return str(path / "run.yaml")


def test_a_users_estimator_and_preset_train_two_steps_through_import(user_module, capsys):
    """The preset names the estimator (name null) with copies 2; the user's estimator.options.copies 5 wins: the
    run draws the user's plans, logs a scoring NFE of 5, and built the user's preset."""
    tmp, mod, tag = user_module
    config = write_yaml(tmp, "  options:\n    copies: 5\n", algorithm=f"my_gdpo_{tag}")
    out = tmp / "run"
    assert cli.main(["train", "--config", config, "--import", mod, "--output-dir", str(out), *SMALL]) == 0, \
        capsys.readouterr().err
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["nfe_scoring"] == 5 for r in rows)
    user = sys.modules[mod]
    assert user.BUILT and user.PLANS and set(user.PLANS) == {5}  # (the user's preset and estimator ran)
    saved = (out / "config.yaml").read_text()
    assert f"algorithm: my_gdpo_{tag}" in saved and "copies: 5" in saved
    assert (out / "final_model" / "model.safetensors").is_file()


def test_the_dry_run_shows_the_users_estimator_as_it_describes_itself(user_module, capsys):
    import yaml

    tmp, mod, tag = user_module
    config = write_yaml(tmp, "  options: {}\n", algorithm=f"my_gdpo_{tag}")
    assert cli.main(["train", "--config", config, "--dry-run"]) == 2  # (without the import: an unknown name)
    assert f"unknown algorithm 'my_gdpo_{tag}'" in capsys.readouterr().err
    assert cli.main(["train", "--config", config, "--import", mod, "--dry-run"]) == 0, capsys.readouterr().err
    plan = yaml.safe_load(capsys.readouterr().out.split("\n", 1)[1])
    assert plan["algorithm"]["name"] == f"my_gdpo_{tag}" and plan["algorithm"]["epsilon"] == 0.3
    e = plan["estimator"]
    assert (e["name"], e["copies"], e["nfe"], e["nfe_formula"], e["chosen_by"]) == (
        f"all_masked_{tag}", 2, 2, "copies", "the preset's recipe")


def test_a_bad_option_of_a_users_estimator_names_its_key_and_line(user_module, capsys):
    tmp, mod, tag = user_module
    config = write_yaml(tmp, f"  name: all_masked_{tag}\n  options:\n    copies: 0\n")
    assert cli.main(["train", "--config", config, "--import", mod, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert ("run.yaml line 6: config key 'estimator.options.copies': copies must be an integer >= 1, got 0 "
            f"(estimator 'all_masked_{tag}')") in err, err


@pytest.mark.parametrize(("options", "message"), [
    ("num_nodez: 2", ("config key 'estimator.options.num_nodez': SDMC has no setting 'num_nodez'. Did you mean "
                      "num_nodes?")),
    ("num_nodes: 0", ("config key 'estimator.options.num_nodes': num_nodes must be an integer >= 1, got 0 "
                      "(estimator 'sdmc')")),
    ("num_nodes: two", "config key 'estimator.options.num_nodes' expects int"),
])
def test_a_bad_estimator_option_names_the_key_and_the_yaml_line(tmp_path, capsys, options, message):
    config = write_yaml(tmp_path, f"  name: sdmc\n  options:\n    {options}\n")
    assert cli.main(["train", "--config", config, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "run.yaml line 6: " in err and message in err, err


def config(*overrides: str) -> Config:
    cfg = Config()
    apply_overrides(cfg, list(overrides))
    return cfg


def test_options_win_over_the_flat_keys_and_reach_fields_the_flat_keys_do_not():
    assert build_estimator(config("estimator.name=sdmc", "num_nodes=4", "estimator.options.num_nodes=2").estimator) \
        == SDMC(2, 1, "exact_count")
    cfg = config("estimator.name=exact", "estimator.options.max_length=8")
    assert build_estimator(cfg.estimator).max_length == 8  # (no flat key sets it)
    # spg: a flat key by its config name, its field by its own
    cfg = config("estimator.name=spg", "eubo_beta=2", "estimator.options.mix=1")
    est = build_estimator(cfg.estimator, sampling=cfg.sampling)
    assert (est.beta, est.mix, est.block_length) == (2.0, 1.0, cfg.sampling.block_length)


@pytest.mark.parametrize(("overrides", "key"), [
    (["estimator.name=spg", "eubo_beta=0.5"], "estimator.eubo_beta"),  # (SPG's field is beta)
    (["estimator.name=spg", "estimator.options.beta=0.5"], "estimator.options.beta"),
    (["estimator.name=double_mc", "samples_per_node=0"], "estimator.samples_per_node"),  # (num_samples = N·K)
    (["estimator.name=coupled", "estimator.options.t_max=0.1"], "estimator.t_min"),  # (t_min >= t_max)
    (["estimator.name=trajectory", "estimator.options.order=backwards"], "estimator.options.order"),
    (["estimator.name=nope"], "estimator.name"),
])
def test_a_rejected_setting_names_the_key_that_set_it(overrides, key):
    with pytest.raises(ConfigError, match=rf"config key '{re.escape(key)}'"):
        validate(config(*overrides), data=False)


def test_validate_resolves_the_config_once_into_the_run_spec():
    spec = validate(config("algorithm=just_grpo", "estimator.name=null"), data=False)
    assert spec.preset.name == "just_grpo" and spec.chosen_by == "the preset's recipe"
    assert spec.estimator == Trajectory(merge=1, order="left_to_right", temperature=1.0, steps=4)
    assert spec.estimator_section.order == "left_to_right"


def test_estimators_describe_themselves():
    d = SPGEstimator().describe()
    assert (d.name, d.nfe, d.nfe_formula, d.trainable) == ("spg", 2, "m (num_samples)", True)
    assert d.settings == {"num_samples": 2, "block_length": 32, "p_mask_prompt": 0.15, "beta": 1.5, "mix": 0.5}
    exact = ESTIMATORS.get("exact")()
    assert not exact.trainable and exact.describe().nfe is None and exact.describe(4).nfe == 15
    assert exact.describe(4).nfe_is_bound
    # the flat keys each class reads (the "ignored" warning's list)
    flat = {"num_nodes", "samples_per_node", "masking", "merge", "order", "eubo_beta"}
    assert Trajectory.reads(flat) == {"merge", "order"} and SDMC.reads(flat) == {"num_nodes", "samples_per_node",
                                                                                 "masking"}


def test_a_flat_key_the_estimator_does_not_read_is_named_in_a_warning():
    with pytest.warns(UserWarning, match=r"estimator\.eubo_beta do not apply to the 'sdmc' estimator"):
        validate(config("estimator.name=sdmc", "eubo_beta=2"), data=False)


@pytest.fixture
def readme_extension(tmp_path, monkeypatch):
    """The README's my_extension.py in the current folder; its registrations and import undone after."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = re.search(r"```python\n(.*?)```", text[text.index("## Extending dlmrl"):], re.DOTALL).group(1)
    (tmp_path / "my_extension.py").write_text(block)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # (the command puts the current folder on it)
    saved = dict(ESTIMATORS._items), dict(ALGORITHMS._items)
    sys.modules.pop("my_extension", None)
    yield tmp_path
    for registry, items in zip((ESTIMATORS, ALGORITHMS), saved):
        registry._items.clear()
        registry._items.update(items)
    sys.modules.pop("my_extension", None)


def test_the_readme_extension_runs_as_written(readme_extension, capsys):
    import yaml

    def plan(*overrides):
        assert cli.main(["train", "--import", "my_extension", "algorithm=my_gdpo", *overrides, "--dry-run"]) == 0, \
            capsys.readouterr().err
        return yaml.safe_load(capsys.readouterr().out.split("\n", 1)[1])

    p = plan()
    assert (p["algorithm"]["name"], p["estimator"]["name"], p["estimator"]["nfe"]) == ("my_gdpo", "all_masked", 2)
    p = plan("estimator.name=all_masked", "estimator.options.copies=4")
    assert (p["estimator"]["copies"], p["estimator"]["nfe"], p["estimator"]["chosen_by"]) == (4, 4, "estimator.name")
