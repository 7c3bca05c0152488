"""``dlmrl train`` then ``dlmrl eval`` on a tiny checkpoint of a family's published code, as a user runs them: the
shared part of the families' two-step training tests (test_fast_dllm_v2, test_llada_moe)."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

#: A reward that differs between completions (the sum of their digits, scaled), written out as a user's module.
REWARD = '''def digit_sum(prompts, completions, **columns):
    """A reward that differs between completions: the sum of their digits, scaled."""
    return [sum(int(c) for c in text if c.isdigit()) / 50 for text in completions]
'''
PROMPTS = ["12+3=", "7*8=", "1+1=", "9-4="]


def train_then_eval(tmp_path: Path, monkeypatch, capsys, model: dict, sampling: dict, estimator: dict, train: dict,
                    eval_steps: int) -> tuple[list[dict], Path]:
    """2 steps of ``dlmrl train`` (``train`` merged over a 2 prompts x G 2 batch, learning rate 1e-2, the digit-sum
    reward on :data:`PROMPTS`), asserting finite losses at steps 1 and 2, then ``dlmrl eval --model final_model``,
    asserting it scored its 2 examples. Returns the logged rows and the ``final_model`` folder."""
    import yaml

    from dlmrl.cli import main

    (tmp_path / "family_rewards.py").write_text(REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    run = tmp_path / "run"
    config = {"model": model, "task": {"name": "dataset", "train_file": str(data), "test_file": str(data)},
              "sampling": sampling, "estimator": estimator,
              "train": {"max_steps": 2, "prompts_per_step": 2, "num_generations": 2, "learning_rate": 1e-2,
                        "warmup_steps": 0, "save_steps": 100, "reward_funcs": ["family_rewards:digit_sum"], **train},
              "eval": {"num_puzzles": 2, "steps": eval_steps, "batch_size": 2, "before": False, "after": False},
              "output_dir": str(run)}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["train", "--config", str(tmp_path / "run.yaml"), "--no-progress"]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(math.isfinite(r["loss"]) for r in rows)
    final = run / "final_model"
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["eval", "--model", str(final)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["num_examples"] == 2 and result["mean_reward"] is not None
    return rows, final
