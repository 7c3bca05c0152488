"""The rollout-backend seam of ``model.kind: uniform`` (dlmrl/models/uniform_backend.py): the policy is a backend,
the RL path reads only the declared fields of a sampler output, and a malformed output is refused naming the field."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from dlmrl.config import Config, apply_overrides
from dlmrl.models.uniform_backend import (
    CANVAS_FIELDS,
    OUTPUT_FIELDS,
    SETTINGS_FIELDS,
    UniformRolloutBackend,
    check_backend_output,
)
from dlmrl.models.uniform_policy import build_tiny_uniform_policy, save_tiny_uniform_checkpoint
from dlmrl.training.uniform_trajectory import rollout_uniform


def strip(out):
    """Only the fields the seam declares, in plain namespaces (no UniformSampleOutput, no CanvasRecord)."""
    settings = SimpleNamespace(**{k: getattr(out.settings, k) for k in SETTINGS_FIELDS})
    canvases = [SimpleNamespace(**{k: getattr(r, k) for k in CANVAS_FIELDS}) for r in out.canvases]
    fields = {k: getattr(out, k) for k in OUTPUT_FIELDS if k not in ("settings", "canvases")}
    return SimpleNamespace(settings=settings, canvases=canvases, **fields)


class StrippedBackend:
    """A stand-in for a remote backend: the policy's sampler, its output cut down to the declared fields."""

    def __init__(self, policy):
        self.policy = policy
        self.canvas_length, self.eos_token_id, self.pad_token_id = (policy.canvas_length, policy.eos_token_id,
                                                                    policy.pad_token_id)
        self.device = policy.device

    def sample(self, prompt_ids, prompt_mask, max_new_tokens, *, seed=None, draw_last_step=False, **settings):
        out = self.policy.sample(prompt_ids, prompt_mask, max_new_tokens, seed=seed, draw_last_step=draw_last_step,
                                 **settings)
        check_backend_output(out, prompt_ids.shape[0], prompt_ids.shape[1])
        return strip(out)


@pytest.mark.parametrize("draw_last", [False, True])
def test_a_backend_returning_only_the_declared_fields_gives_the_same_rollout(tmp_path, draw_last):
    from dlmrl.training.run_setup import build_task

    ckpt = save_tiny_uniform_checkpoint(tmp_path / "tiny_dg")
    cfg = Config()
    apply_overrides(cfg, [f"model.name_or_path={ckpt}", "model.kind=uniform", "task.answer_mode=full",
                          "train.num_generations=2", f"sampling.draw_last_step={str(draw_last).lower()}"])
    policy = build_tiny_uniform_policy()
    assert isinstance(policy, UniformRolloutBackend)
    task = build_task(cfg, policy)
    examples = task.train_batch(2, 0, 0)
    ro = rollout_uniform(policy, task, cfg, examples, torch.Generator().manual_seed(0), 17)
    backend = StrippedBackend(policy)
    assert isinstance(backend, UniformRolloutBackend)
    ro2 = rollout_uniform(backend, task, cfg, examples, torch.Generator().manual_seed(0), 17)
    for f in ("completion", "completion_mask", "token_logprobs", "row_nfe", "prompt_ids"):
        assert torch.equal(getattr(ro, f), getattr(ro2, f)), f
    assert ro.kind_record.keys() == ro2.kind_record.keys()
    for k in ro.kind_record:
        assert torch.equal(ro.kind_record[k], ro2.kind_record[k]), k


def test_malformed_backend_outputs_are_refused_naming_the_field():
    policy = build_tiny_uniform_policy()
    prompt = torch.full((2, 3), 5)
    out = policy.sample(prompt, torch.ones_like(prompt, dtype=torch.bool), 8, seed=0)
    check_backend_output(out, 2, 3)
    bad = strip(out)
    del bad.decoder_forward_passes
    with pytest.raises(ValueError, match="no field 'decoder_forward_passes'"):
        check_backend_output(bad, 2, 3)
    rec = out.canvases[0]
    bad = dataclasses.replace(out, canvases=[dataclasses.replace(rec, logprobs=rec.logprobs[:, :1])])
    with pytest.raises(ValueError, match="canvas 0 logprobs must be SBL"):
        check_backend_output(bad, 2, 3)
    bad = dataclasses.replace(out, canvases=[dataclasses.replace(rec, accepted=rec.accepted.long())])
    with pytest.raises(ValueError, match="canvas 0 accepted must be SBL .* bool"):
        check_backend_output(bad, 2, 3)
    with pytest.raises(ValueError, match="prompt_length"):
        check_backend_output(out, 2, 4)
