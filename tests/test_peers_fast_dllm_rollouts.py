"""benchmarks/peers/fast_dllm_rollouts.py without a Fast-dLLM clone: the argument checks, the clear errors for a
folder that is not a Fast-dLLM clone, the token comparison and the aggregation of repeats (checked by hand).
Nothing here builds a checkpoint or runs a sampler."""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

import pytest
import torch

from tests.helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("benchmarks/peers/fast_dllm_rollouts.py")


def fake_clone(root: Path, generate_py: str | None = None, model_code: bool = True) -> Path:
    """A folder shaped like a Fast-dLLM clone: ``llada/generate.py`` (when given) and ``llada/model/`` files."""
    if generate_py is not None:
        (root / "llada").mkdir(parents=True, exist_ok=True)
        (root / "llada" / "generate.py").write_text(generate_py)
    if model_code:
        (root / "llada" / "model").mkdir(parents=True, exist_ok=True)
        for name in ("configuration_llada.py", "modeling_llada.py"):
            (root / "llada" / "model" / name).write_text("")
    return root


SAMPLERS = "".join(f"def {name}(model, prompt, steps=1):\n    pass\n"
                   for name in ("generate", "generate_with_prefix_cache", "generate_with_dual_cache"))


def errors_of(bench, capsys, argv) -> str:
    with pytest.raises(SystemExit) as e:
        bench.parse_args(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


def test_clone_without_generate_py_says_what_to_pass(bench, capsys, tmp_path):
    clone = fake_clone(tmp_path / "c", generate_py=None)
    err = errors_of(bench, capsys, [str(clone)])
    assert "no llada/generate.py" in err and "git clone https://github.com/NVlabs/Fast-dLLM" in err


def test_clone_missing_a_sampler_or_the_model_code(bench, capsys, tmp_path):
    clone = fake_clone(tmp_path / "a", generate_py=SAMPLERS.replace("generate_with_dual_cache", "other"))
    assert "defines no generate_with_dual_cache" in errors_of(bench, capsys, [str(clone)])
    clone = fake_clone(tmp_path / "b", generate_py=SAMPLERS, model_code=False)
    assert "modeling_llada.py" in errors_of(bench, capsys, [str(clone)])
    assert "is not a folder" in errors_of(bench, capsys, [str(tmp_path / "missing")])


@pytest.mark.parametrize("argv, message", [
    (["--gen-length", "64", "--block-length", "24"], "must be >= 1 and divide --gen-length"),
    (["--gen-length", "64", "--block-length", "32", "--steps", "3"], "multiple of the number of blocks (2)"),
    (["--threshold", "0"], "--threshold must be in (0, 1]"),
    (["--threshold", "1.5"], "--threshold must be in (0, 1]"),
    (["--batch-sizes", "1", "9"], "--batch-sizes must each be in 1..8"),
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--threads", "0"], "--threads must be >= 1"),
    (["--modes", "beam"], "invalid choice"),
])
def test_argument_errors(bench, capsys, tmp_path, argv, message):
    clone = fake_clone(tmp_path / "c", generate_py=SAMPLERS)
    assert message in errors_of(bench, capsys, [str(clone), *argv])


def test_defaults_are_the_issue_settings(bench, tmp_path):
    args = bench.parse_args([str(fake_clone(tmp_path / "c", generate_py=SAMPLERS))])
    assert (args.gen_length, args.block_length, args.threshold, args.batch_sizes) == (256, 32, 0.9, [1, 8])
    assert args.steps == 256 and args.modes == ["threshold", "schedule"]
    assert args.peers == ["generate", "prefix_cache", "dual_cache"]


def test_prompts_have_equal_token_length(bench):
    """Batches need no padding: every prompt is the same number of characters (the tiny checkpoints' tokenizer
    reads one token per character, ``remote_code_checkpoints._char_vocab``)."""
    assert len({len(p) for p in bench.PROMPTS}) == 1 and len(bench.PROMPTS) == 8


def test_compare_counts_equal_positions(bench):
    a = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    b = torch.tensor([[1, 2, 0, 4], [5, 6, 7, 8]])
    assert bench.compare(a, a) == {"identical": True, "identical_fraction": 1.0}
    assert bench.compare(a, b) == {"identical": False, "identical_fraction": 7 / 8}


def test_summary_ratios_and_verdicts(bench):
    """Ratio dlmrl / peer in tokens per second = peer seconds / dlmrl seconds (dlmrl with the peer's cache), per
    repeat; min / median / max over three repeats; PASS only with identical tokens in every repeat."""
    args = Namespace(batch_sizes=[2], modes=["threshold"], peers=["generate", "dual_cache"], gen_length=16)
    dl, gen, dual = [2.0, 4.0, 1.0], [3.0, 4.0, 4.0], [1.0, 2.0, 0.25]
    same, diff = {"identical": True, "identical_fraction": 1.0}, {"identical": False, "identical_fraction": 0.5}
    repeats = [{"runs": {"2/threshold": {"dlmrl/none": {"seconds": d, "nfe_per_row": 16.0},
                                         "dlmrl/dual": {"seconds": d / 2, "nfe_per_row": 15.0},
                                         "generate": {"seconds": g, "nfe_per_row": 16.0},
                                         "dual_cache": {"seconds": u, "nfe_per_row": 15.0}}},
                "equality": {"2/threshold/generate": same, "2/threshold/dual_cache": diff}}
               for d, g, u in zip(dl, gen, dual)]
    gen_row, dual_row = bench.summarize(repeats, args)
    assert gen_row["peer"] == "generate" and dual_row["peer"] == "generate_with_dual_cache"
    assert gen_row["ratio_dlmrl_over_peer"] == {"min": 1.0, "median": 1.5, "max": 4.0}  # 3/2, 4/4, 4/1
    assert dual_row["ratio_dlmrl_over_peer"] == {"min": 0.5, "median": 1.0, "max": 1.0}  # 1/1, 2/2, .25/.5
    assert (gen_row["dlmrl_cache"], dual_row["dlmrl_cache"]) == ("none", "dual")
    assert gen_row["dlmrl_median_seconds"] == 2.0 and gen_row["dlmrl_tokens_per_second"] == 32 / 2.0
    assert gen_row["peer_tokens_per_second"] == 32 / 4.0
    assert gen_row["nfe_per_row"] == {"dlmrl": 16.0, "peer": 16.0} and dual_row["nfe_per_row"]["peer"] == 15.0
    assert bench.verdict(gen_row) == "PASS" and bench.verdict(dual_row) == "FAIL"  # (its tokens differed)
    repeats[1]["equality"]["2/threshold/generate"] = diff  # (a repeat whose tokens changed)
    assert bench.verdict(bench.summarize(repeats, args)[0]) == "FAIL"
