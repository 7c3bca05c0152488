"""benchmarks/peers/sdar_rollouts.py without an SDAR clone: the argument checks, the clear errors naming what a clone
lacks, the greedy stand-in for SDAR's sampling helper (by hand) and its swap in and out of generate.py's module, the
prompts, and the aggregation of repeats (by hand). Nothing here builds a checkpoint or runs a sampler."""

from __future__ import annotations

import math
import sys
from argparse import Namespace
from pathlib import Path

import pytest
import torch

from tests.helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[1]

#: a stand-in generate.py: records which sampling helper its block_diffusion_generate found at call time
FAKE_GENERATE = '''
import torch


def sample_with_temperature_topk_topp(logits, temperature=1.0, top_k=0, top_p=1.0):
    raise AssertionError("not called")


CALLS = []


@torch.no_grad()
def block_diffusion_generate(model, prompt, mask_id, gen_length=128, block_length=8, denoising_steps=8,
                             temperature=1.0, top_k=0, top_p=1.0, remasking_strategy="low_confidence_dynamic",
                             confidence_threshold=0.85, eb_threshold=None, stopping_criteria_idx=None):
    ids = prompt["input_ids"]
    assert ids.shape[0] == 1  # (the published sampler's canvas is (1, T))
    CALLS.append((sample_with_temperature_topk_topp.__name__, remasking_strategy, confidence_threshold))
    return torch.cat([ids, torch.full((1, gen_length), int(ids[0, 0]))], 1)
'''


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("benchmarks/peers/sdar_rollouts.py")


@pytest.mark.parametrize("argv", [["--repeats", "0"], ["--batch", "0"], ["--gen-length", "6"], ["--gen-length", "0"],
                                  ["--threshold", "0"], ["--threshold", "1.5"], ["--threads", "0"],
                                  ["--rules", "sequential,entropy_bounded"], ["--rules", ","], []])
def test_bad_arguments_refused(bench, argv):
    with pytest.raises(SystemExit) as e:
        bench.parse_args(["clone"] * (argv != []) + argv)  # ([]: the clone is required)
    assert e.value.code == 2


def test_defaults(bench):
    args = bench.parse_args(["SDAR"])
    assert (args.repeats, args.batch, args.gen_length, args.threshold) == (3, 8, 64, 0.85)
    assert args.rules == ["sequential", "low_confidence", "dynamic"] and not args.no_uncached


def test_clone_without_generate_or_model_code(bench, tmp_path):
    out = tmp_path / "r.json"
    with pytest.raises(SystemExit) as e:
        bench.main([str(tmp_path / "absent"), "--output", str(out)])
    assert "is not a folder" in str(e.value)
    clone = tmp_path / "SDAR"
    (clone / "training").mkdir(parents=True)
    (clone / "generate.py").write_text("def other():\n    pass\n")
    with pytest.raises(SystemExit) as e:
        bench.main([str(clone), "--output", str(out)])
    assert "generate.py defining block_diffusion_generate" in str(e.value)
    (clone / "generate.py").write_text(FAKE_GENERATE)
    (clone / "training" / "configuration_sdar.py").write_text("")  # (no modeling_sdar.py beside it)
    with pytest.raises(SystemExit) as e:
        bench.main([str(clone), "--output", str(out)])
    assert "configuration_sdar.py + modeling_sdar.py" in str(e.value) and "git clone" in str(e.value)
    assert not out.exists()
    (clone / "training" / "modeling_sdar.py").write_text("")
    path, source = bench.find_sdar(clone)
    assert path == clone / "generate.py" and source.folder == clone / "training" and source.family == "sdar"


def test_greedy_sampling_by_hand(bench):
    logits = torch.tensor([[[0.0, math.log(3.0), -1e4], [2.0, 0.0, 2.0 + math.log(0.25)]]])  # (1, 2, 3)
    token, prob = bench.greedy_sampling(logits, temperature=1.0, top_k=1, top_p=1.0)
    assert token.tolist() == [[1, 0]] and token.dtype == torch.long
    e = math.exp(-2.0)  # (row 2: weights 1, e^-2, 1/4 relative to the first)
    expected = torch.tensor([[0.75, 1 / (1 + e + 0.25)]])
    assert torch.allclose(prob, expected, rtol=4 * torch.finfo(torch.float32).eps, atol=0)


@pytest.mark.parametrize("rule,helper", [("sequential", "sample_with_temperature_topk_topp"),
                                         ("low_confidence", "greedy_sampling"), ("dynamic", "greedy_sampling")])
def test_sdar_side_swaps_the_helper_only_for_low_confidence(bench, tmp_path, rule, helper):
    """SDAR's helper is replaced while (and only while) a low-confidence rule runs, the function is called once per
    prompt, and its completions are cut after the prompt."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from remote_code_check import load_function

    (tmp_path / "generate.py").write_text(FAKE_GENERATE)
    fn = load_function(tmp_path / "generate.py", "block_diffusion_generate")
    calls = fn.__wrapped__.__globals__["CALLS"]
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    args = Namespace(gen_length=8, threshold=0.5)
    _, tokens = bench.run_sdar(fn, None, ids, 99, args, rule)
    assert tokens.tolist() == [[5] * 8, [9] * 8]
    assert calls == [(helper, bench.RULES[rule][0], 0.5)] * 2
    assert fn.__wrapped__.__globals__["sample_with_temperature_topk_topp"].__name__ == "sample_with_temperature_topk_topp"


def test_prompts_are_one_block_aligned_length(bench):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from remote_code_checkpoints import _char_vocab
    from sdar_parity import PROMPT_TEXTS

    texts = bench.prompts(8)
    assert texts[:4] == PROMPT_TEXTS and len(set(texts)) == 8
    vocab = set(_char_vocab())
    assert all(len(t) == 8 and set(t) <= vocab for t in texts)  # (8 tokens each: two blocks of 4, no padding)
    assert bench.prompts(10)[8:] == texts[:2]


def test_compare_by_hand(bench):
    a = torch.tensor([[1, 2, 3], [4, 5, 6]])
    b = torch.tensor([[1, 2, 3], [4, 0, 0]])
    assert bench.compare(a, b) == {"equal": False, "rows_equal": 1, "rows": 2, "first_difference": [None, 1]}
    assert bench.compare(a, a.clone())["equal"] is True


def _rep(d, s, u=None, equal=True):
    rec = {"seconds": {"dlmrl": d, "sdar": s}, "equal": {"dlmrl_vs_sdar": {"equal": equal}}}
    if u is not None:
        rec["seconds"]["dlmrl_uncached"] = u
        rec["equal"]["dlmrl_uncached_vs_cached"] = {"equal": True}
    return rec


def test_summary_by_hand(bench):
    s = bench.summarize([_rep(1.0, 2.0, 4.0), _rep(2.0, 2.0, 8.0), _rep(4.0, 2.0, 2.0)], tokens=100)
    assert s["median_tokens_per_second"] == {"dlmrl": 50.0, "sdar": 50.0, "dlmrl_uncached": 25.0}
    assert s["ratio_dlmrl_over_sdar"]["dlmrl"] == {"min": 0.5, "median": 1.0, "max": 2.0}  # (SDAR s / dlmrl s)
    assert s["ratio_dlmrl_over_sdar"]["dlmrl_uncached"] == {"min": 0.25, "median": 0.5, "max": 1.0}
    assert s["tokens_equal"] is True and s["uncached_equal"] is True
    one = bench.summarize([_rep(1.0, 3.0, equal=False)], tokens=6)
    assert one["ratio_dlmrl_over_sdar"] == {"dlmrl": {"min": 3.0, "median": 3.0, "max": 3.0}, "dlmrl_uncached": None}
    assert one["median_tokens_per_second"]["dlmrl_uncached"] is None and "uncached_equal" not in one
    assert one["tokens_equal"] is False
    text = bench.format_summary("sequential", s)
    assert "median 1.00x" in text and "uncached/SDAR" in text and "tokens equal to SDAR's: yes" in text
