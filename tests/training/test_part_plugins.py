"""Parts by name from a config: every objective hyperparameter is a ``train.*`` key, and a clip rule a user
registers in a module loaded like ``--import`` is named in ``train.clip_rule`` and trains."""

from __future__ import annotations

import dataclasses
import json
import re
import sys

import pytest
import torch
from safetensors.torch import load_file

from dlmrl.config import Config, ConfigError, TrainConfig, apply_overrides, build_preset, load_yaml, validate
from dlmrl.objectives.objective import GroupObjective
from dlmrl.plugins import import_modules
from dlmrl.training.distributed import check_process_split
from dlmrl.training.trainer import train
from tests.helpers import save_tiny_checkpoint

PLUGIN = '''
from dataclasses import dataclass

import torch

from dlmrl.objectives.clip_rules import CLIP_RULES, ClipRule

CALLS = []


@CLIP_RULES.register("plug_entropy_widened")
@dataclass(frozen=True)
class EntropyWidened(ClipRule):
    """Both ranges epsilon * (1 + H / (1 + H)): wider where the policy is unsure (a test rule)."""

    required_inputs = frozenset({"entropy"})
    zero_rows_skippable = False

    epsilon: float = 0.2  # (GroupObjective.epsilon, train.epsilon)
    widen: float = 1.0  # (its own setting: train.part_options.clip_rule.widen)

    def ranges(self, mask, *, entropy=None, segment_ids=None, entropy_groups=None, dtype=torch.float32):
        CALLS.append((self.epsilon, tuple(entropy.shape)))
        eps = (self.epsilon * (1 + self.widen * entropy / (1 + entropy))).to(dtype)
        return eps, eps


@CLIP_RULES.register("plug_batch_ranked")
@dataclass(frozen=True)
class BatchRanked(ClipRule):
    """Ranges from a statistic of the whole batch (a test rule)."""

    needs_whole_batch = True

    def ranges(self, mask, **inputs):
        return 0.2, 0.2
'''


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plugin")
    (folder / "plug_parts.py").write_text(PLUGIN)
    sys.path.insert(0, str(folder))
    try:
        import_modules(["plug_parts"])  # (as `dlmrl train --import plug_parts` does)
        yield sys.modules["plug_parts"]
    finally:
        sys.path.remove(str(folder))


def config(*overrides: str) -> Config:
    cfg = Config()
    apply_overrides(cfg, list(overrides))
    return cfg


def test_every_objective_field_is_a_train_key():
    keys = {f.name for f in dataclasses.fields(TrainConfig)}
    assert set(GroupObjective.field_names()) - {"ratio_level"} <= keys  # (part_options: train.part_options)  # (ratio_level: importance_sampling_level)


def test_train_keys_set_the_parts_and_their_hyperparameters():
    o = build_preset(config("algorithm=grpo", "clip_rule=hapo", "hapo_clip_alpha=0.5", "hapo_entropy_pivot=0.6",
                            "loss_type=dr_grpo", "max_completion_length=64", "weighting=egsw_step",
                            "egsw_alpha=0.25", "egsw_temperature=2", "dual_clip=3", "delta=4", "kl_kind=k1",
                            "kl_reference=old", "anchor_weight=0.5", "hapo_advantage_beta=0.5")).objective
    assert (o.clip_rule, o.loss_type, o.weighting) == ("hapo", "dr_grpo", "egsw_step")
    assert (o.parts.clip_rule.hapo_clip_alpha, o.parts.clip_rule.hapo_entropy_pivot) == (0.5, 0.6)
    assert o.parts.loss_type.max_completion_length == 64
    assert (o.parts.weighting.egsw_alpha, o.parts.weighting.egsw_temperature) == (0.25, 2.0)
    assert (o.dual_clip, o.delta, o.kl_kind, o.kl_reference, o.anchor_weight) == (3.0, 4.0, "k1", "old", 0.5)
    espo = build_preset(config("algorithm=espo", "espo_alpha=0.05", "vocab_size=40", "entropy_num_groups=3",
                               "entropy_top_fraction=0.3")).objective
    assert espo.parts.clip_rule.espo_alpha == 0.05 and espo.parts.clip_rule.vocab_size == 40
    assert (espo.entropy_num_groups, espo.entropy_top_fraction) == (3, 0.3)
    # null = the preset's; 0 turns a cap off (hapo's preset has dual clip 10)
    assert build_preset(config("algorithm=hapo", "model.kind=ar")).objective.dual_clip == 10.0
    assert build_preset(config("algorithm=hapo", "model.kind=ar", "dual_clip=0")).objective.dual_clip is None


def test_a_bad_part_name_or_value_names_its_train_key():
    with pytest.raises(ConfigError, match=r"train\.clip_rule.*Did you mean 'sspo'"):
        build_preset(config("clip_rule=spo"))
    with pytest.raises(ConfigError, match=r"train\.weighting.*Did you mean 'egsw'"):
        build_preset(config("weighting=egws"))
    with pytest.raises(ConfigError, match=r"train\.egsw_temperature"):
        build_preset(config("weighting=egsw", "egsw_temperature=-1"))


def test_a_parts_own_settings_come_from_part_options(plugin, tmp_path):
    # a field no train.* key has: train.part_options.<kind>.<field>, over the flat key of the same name
    o = build_preset(config("clip_rule=plug_entropy_widened", "train.part_options.clip_rule.widen=0.5",
                            "train.epsilon=0.3")).objective
    assert (o.parts.clip_rule.widen, o.parts.clip_rule.epsilon) == (0.5, 0.3)
    o = build_preset(config("clip_rule=plug_entropy_widened", "train.epsilon=0.3",
                            "train.part_options.clip_rule.epsilon=0.1")).objective
    assert o.parts.clip_rule.epsilon == 0.1 and o.epsilon == 0.3
    o = build_preset(config("loss_type=dr_grpo", "train.part_options.loss_type.max_completion_length=7")).objective
    assert o.parts.loss_type.max_completion_length == 7
    with pytest.raises(ConfigError, match=r"'train\.part_options\.clip_rule\.widn'.*has no setting 'widn'"):
        build_preset(config("clip_rule=plug_entropy_widened", "train.part_options.clip_rule.widn=0.5"))
    with pytest.raises(ConfigError, match=r"'train\.part_options'.*may only name clip_rule, loss_type, weighting"):
        build_preset(config("train.part_options.clip.widen=0.5"))
    run = tmp_path / "run.yaml"
    run.write_text("train:\n  clip_rule: plug_entropy_widened\n  part_options:\n    clip_rule:\n      widen: 2.0\n")
    cfg = Config()
    load_yaml(cfg, run)
    assert build_preset(cfg).objective.parts.clip_rule.widen == 2.0


def test_bad_part_options_stop_before_loading_naming_the_override(plugin, capsys):
    from dlmrl import cli

    base = ["train", "--import", "plug_parts", "algorithm=grpo", "train.clip_rule=plug_entropy_widened", "--dry-run"]
    for override, words in [
        ("train.part_options.clip_rule.widen=abc", r"'train\.part_options\.clip_rule\.widen' expects float"),
        ("train.part_options.clip_rule=0.5", r"'train\.part_options\.clip_rule': expects a mapping"),
        ("train.part_options.clip.widen=1", r"'train\.part_options\.clip': part_options may only name"),
    ]:
        assert cli.main([*base, override]) == 2
        err = capsys.readouterr().err
        assert re.search(rf"command-line override '{re.escape(override)}'.*{words}", err), err


def test_a_user_rule_that_needs_the_whole_batch_is_refused_with_two_processes(plugin):
    check_process_split(config("clip_rule=plug_entropy_widened"), 2)  # (row-local: the batch may split)
    with pytest.raises(ConfigError, match=r"clip_rule 'plug_batch_ranked'.*one process"):
        check_process_split(config("clip_rule=plug_batch_ranked"), 2)


def test_a_user_clip_rule_named_in_the_config_trains(plugin, tmp_path):
    base = save_tiny_checkpoint(tmp_path / "base")
    out = tmp_path / "run"
    cfg = config(f"model.name_or_path={base}", f"output_dir={out}", "max_steps=2", "prompts_per_step=2",
                 "num_generations=3", "num_iterations=1", "sampling.steps=4", "eval.before=false",
                 "eval.after=false", "save_steps=2", "learning_rate=1e-3", "warmup_steps=0",
                 "train.clip_rule=plug_entropy_widened", "train.epsilon=0.3")
    validate(cfg)
    objective = build_preset(cfg).objective
    assert objective.parts.clip_rule.epsilon == 0.3 and "entropy" in objective.required_inputs
    plugin.CALLS.clear()
    train(cfg, progress=False)
    # the rule gave every update its ranges, with the configured ε, on the entropies the trainer computed
    assert len(plugin.CALLS) == 2 and all(eps == 0.3 and shape[0] == 6 for eps, shape in plugin.CALLS)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    before, after = load_file(str(base / "model.safetensors")), load_file(str(out / "final_model" / "model.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in before), "training must change parameters"
