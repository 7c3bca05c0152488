"""Every trainable estimator drives the GDPO trainer; one_step's prompt masks are shared by old and new."""

import pytest
import torch
from safetensors.torch import load_file

from dlmrl.config import Config, ConfigError, apply_overrides, validate
from dlmrl.estimators import ESTIMATORS, SDMC, Coupled, CoupledSDMC, DoubleMC, OneStep
from dlmrl.training import run_folder, run_setup, trainer
from tests.training.test_trainer import params, small_config


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from tests.helpers import save_tiny_checkpoint

    return save_tiny_checkpoint(tmp_path_factory.mktemp("base"))


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"estimator.name": "sdmc"}, SDMC(3, 1, "exact_count")),
        ({"estimator.name": "coupled_sdmc", "num_nodes": 4, "samples_per_node": 2}, CoupledSDMC(4, 2, "exact_count")),
        ({"estimator.name": "double_mc", "stratified": True}, DoubleMC(3, "exact_count", stratified=True)),
        ({"estimator.name": "coupled", "masking": "bernoulli", "samples_per_node": 2}, Coupled(2, "bernoulli")),
        ({"estimator.name": "one_step", "p_mask_prompt": 0.3}, OneStep(0.3, 1)),
    ],
)
def test_config_builds_the_estimator(overrides, expected):
    cfg = Config()
    apply_overrides(cfg, [f"{k}={v}" for k, v in overrides.items()])
    validate(cfg)
    assert run_setup.build_estimator(cfg) == expected


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["estimator.name=coupled", "estimator.masking=reference"], "estimator.masking"),
        (["estimator.name=coupled", "estimator.t_min=0.9"], "estimator.t_min"),
        (["estimator.name=one_step", "p_mask_prompt=1.5"], "estimator.p_mask_prompt"),
        (["estimator.name=coupled_sdmc", "estimator.samples_per_node=0"], "estimator.samples_per_node"),
        (["estimator.name=double_mc", "estimator.masking=reference"], "estimator.masking"),
    ],
)
def test_bad_estimator_settings_name_the_field(overrides, key):
    cfg = Config()
    apply_overrides(cfg, overrides)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(cfg)


def test_every_trainable_estimator_is_registered_and_exact_is_not_trainable():
    trainable = [n for n in ESTIMATORS.names() if ESTIMATORS.get(n).trainable]
    assert set(trainable) == {"sdmc", "double_mc", "coupled_sdmc", "coupled", "one_step", "trajectory", "spg",
                              "stratified_coupled"}
    for name in trainable:
        assert ESTIMATORS.get(name).from_config({}).name == name
    cfg = Config()
    apply_overrides(cfg, ["estimator.name=exact"])
    with pytest.raises(ConfigError, match="estimator.name"):
        validate(cfg)


@pytest.mark.parametrize("name", ["coupled_sdmc", "coupled", "one_step"])
def test_two_steps_with_each_new_estimator_change_parameters(base, tmp_path, name, monkeypatch):
    plans = []
    original = run_setup.build_estimator

    def spy(*args, **kwargs):
        est = original(*args, **kwargs)
        make_plan = est.make_plan

        def recording(completion_mask, generator=None, prompt_mask=None):
            plan = make_plan(completion_mask, generator, prompt_mask)
            plans.append(plan)
            return plan

        object.__setattr__(est, "make_plan", recording)
        return est

    monkeypatch.setattr(run_setup, "build_estimator", spy)
    cfg = small_config(base, tmp_path, **{"estimator.name": name, "eval.before": False,
                                          "estimator.p_mask_prompt": 0.5})
    trainer.train(cfg, progress=False)
    before = load_file(str(base / "model.safetensors"))
    after = params(tmp_path)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert plans, "the trainer drew no MaskPlan"
    if name == "one_step":  # the prompt was masked (the trainer passed the prompt mask)
        assert all(p.prompt_masks is not None and p.prompt_masks.any() for p in plans)


@pytest.mark.parametrize(("algorithm", "name", "expected"), [
    ("gdpo", None, SDMC(3, 1, "exact_count")),  # the preset's recipe estimator
    ("diffu_grpo", None, OneStep(0.15, 1)),
    ("grpo", None, SDMC(3, 1, "exact_count")),  # no recipe estimator: sdmc
    ("diffu_grpo", "sdmc", SDMC(3, 1, "exact_count")),  # an explicit choice wins
    ("gdpo", "one_step", OneStep(0.15, 1)),
])
def test_a_null_estimator_name_is_the_presets_recipe_estimator(algorithm, name, expected):
    from dlmrl.config import estimator_name

    cfg = Config()
    apply_overrides(cfg, [f"algorithm={algorithm}"] + ([f"estimator.name={name}"] if name else []))
    assert cfg.estimator.name == name
    validate(cfg)
    assert run_setup.build_estimator(cfg) == expected and estimator_name(cfg) == expected.name


def test_the_presets_estimator_is_validated_and_resume_compares_the_setting_not_its_resolution(tmp_path):
    from dlmrl.config import save_yaml

    cfg = Config()
    apply_overrides(cfg, ["algorithm=diffu_grpo", "estimator.samples_per_node=0"])
    with pytest.raises(ConfigError, match=r"estimator\.samples_per_node.*one_step"):
        validate(cfg)
    cfg = Config()
    apply_overrides(cfg, ["algorithm=diffu_grpo"])
    save_yaml(cfg, tmp_path / "config.yaml")
    assert "name: null" in (tmp_path / "config.yaml").read_text()
    run_folder.check_same_config(cfg, tmp_path / "config.yaml")  # null stays null: the same run
    apply_overrides(cfg, ["estimator.name=one_step"])  # the same estimator, but a different setting
    with pytest.raises(ConfigError, match="estimator.name: None -> 'one_step'"):
        run_folder.check_same_config(cfg, tmp_path / "config.yaml")
