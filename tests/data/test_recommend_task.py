"""The recommend task: the residual-sensitive graded reward and its format gate in both modes, the exact-match
flags SRPO's advantage reads, the held-out metrics from ranked candidates, options that name their key."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dlmrl.config import Config, ConfigError, apply_overrides, validate
from dlmrl.data import TASKS
from dlmrl.data.recommend_task import RecommendOptions, RecommendTask, recommend_tokenizer
from dlmrl.data.semantic_ids import format_sid
from dlmrl.errors import OptionError
from dlmrl.kinds import kind_of
from dlmrl.models.tokenizer import build_char_tokenizer
from dlmrl.objectives.advantage_registry import ADVANTAGES, AdvantageInputs

SMALL = {"n_train": 64, "n_test": 8}


@pytest.fixture(scope="module")
def task():
    return RecommendTask(recommend_tokenizer(), None, **SMALL)


def _changed(sid, level):  # the ID with the code at ``level`` changed (still well-formed)
    return tuple((c + 1) % 32 if j == level else c for j, c in enumerate(sid))


def test_registered():
    assert TASKS.get("recommend") is RecommendTask


def test_graded_reward_by_levels_and_format_gate(task):
    e = task.test_examples[0]
    gold = task.sids[e.target]
    assert task.levels == 4
    texts = [format_sid(gold), format_sid(_changed(gold, 3)), format_sid(_changed(gold, 2)),
             format_sid(_changed(gold, 1)), format_sid(_changed(gold, 0)),
             format_sid(gold)[:-5], format_sid(gold) + " x", "Prefers books; last " + format_sid(gold), ""]
    # GREAM's table: exact 1; 3, 2, 1, 0 leading levels right -> 0.866, 0.707, 0.5, 0; any format failure 0
    assert task.rewards([e] * len(texts), texts) == [1.0, 0.866, 0.707, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert task.exact_matches([e] * len(texts), texts) == [True] + [False] * 8
    assert [v.format_ok for v in task.verdicts([e] * len(texts), texts)] == [True] * 5 + [False] * 4


def test_reasoning_mode(task):
    r = task.in_mode("reasoning")
    e = r.test_examples[1]
    ref = r.completion_text(e)
    name = r.names[e.category]
    assert ref.startswith(f"Prefers {name}; last <") and ref.endswith(format_sid(r.sids[e.target]))
    last = [i for i in e.history if int(r.world.catalogue.category[i]) == e.category][-1]
    assert f"last {format_sid(r.sids[last])}." in ref
    other = next(n for n in r.names if n != name)
    wrong_id = ref.replace("Recommend: " + format_sid(r.sids[e.target]),
                           "Recommend: " + format_sid(_changed(r.sids[e.target], 1)))
    texts = [ref, ref.replace(name, other, 1), ref.replace(name, "cars", 1), wrong_id,
             ref.replace(" Recommend:", ""), format_sid(r.sids[e.target])]
    vs = r.verdicts([e] * len(texts), texts)
    assert [v.reward for v in vs] == [1.0, 1.0, 0.0, 0.5, 0.0, 0.0]  # the chain is gated, not rewarded
    assert [v.category_ok for v in vs] == [True, False, False, True, False, False]
    assert r.ranking_context(e, ref) == r.prompt_text(e) + ref[: ref.index("Recommend: ") + len("Recommend: ")]
    assert r.ranking_context(e, "Prefers") is None
    assert task.ranking_context(e, "anything") == task.prompt_text(e)  # direct: the prompt


def test_reference_lengths_and_round_trip(task):
    tok = task.tokenizer
    for t in (task, task.in_mode("reasoning")):
        lengths = [len(tok(t.completion_text(e), add_special_tokens=False)["input_ids"]) for e in t.train_examples]
        assert max(lengths) <= t.gen_length
        batch = t.encode(t.test_examples[:3])
        assert batch.canvas.shape == (3, t.gen_length) and batch.completion_mask.all()
        assert batch.prompt_mask[:, -1].all()  # left-padded
        refs = [t.completion_text(e) for e in t.test_examples[:3]]
        ids = [tok(s, add_special_tokens=False)["input_ids"] + [tok.eos_token_id, 7] for s in refs]
        width = max(map(len, ids))
        canvas = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in ids])
        assert t.decode(canvas) == refs  # stops at EOS
    assert task.gen_length == 4


def test_exact_flags_feed_srpo_as_the_default_does(task):
    # SRPO's bonus counts exact matches: the task's flags equal reward >= 1, so the advantage is the same with
    # the flags passed (the trainer passes them) and with the estimator's default
    examples = [e for e in task.test_examples[:4] for _ in range(4)]  # 4 groups of G = 4
    texts = []
    for i, e in enumerate(examples):
        gold = task.sids[e.target]
        texts.append(format_sid(gold) if i % 3 == 0 else format_sid(_changed(gold, i % 4)))
    rewards = torch.tensor(task.rewards(examples, texts))
    flags = torch.tensor(task.exact_matches(examples, texts))
    assert torch.equal(flags, rewards >= 1) and 0 < int(flags.sum()) < len(flags)
    srpo = ADVANTAGES.get("srpo_passk")
    with_flags = srpo(AdvantageInputs(rewards, 4, exact=flags), k=2)
    assert torch.equal(with_flags, srpo(AdvantageInputs(rewards, 4), k=2))
    assert not torch.equal(with_flags, ADVANTAGES.get("group")(AdvantageInputs(rewards, 4)))  # the bonus is there


def test_metrics_from_ranked_candidates(task):
    examples = task.test_examples[:4]
    golds = [task.sids[e.target] for e in examples]
    others = [s for s in task.sids if s not in golds][:3]
    ranked = [[golds[0], *others], [others[0], others[1], golds[1]], others, [others[2], golds[3]]]  # ranks 1, 3, -, 2
    texts = [format_sid(golds[0]), format_sid(_changed(golds[1], 2)), "junk", format_sid(golds[3])]
    m = task.metrics(examples, texts, ranked)
    assert m["recall@1"] == 0.25 and m["recall@5"] == 0.75 and m["recall@10"] == 0.75
    # (1 + 1/log2(4) + 1/log2(3)) / 4 with 1/log2(3) = 0.6309297535714574
    assert m["ndcg@5"] == pytest.approx((1 + 0.5 + 0.6309297535714574) / 4, rel=1e-15)
    assert m["exact"] == 0.5 and m["format_ok"] == 0.75 and m["levels_matched"] == (4 + 2 + 0 + 4) / 4
    assert m["mean_reward"] == pytest.approx((1 + 0.707 + 0 + 1) / 4, rel=1e-15)
    assert "recall@1" not in task.metrics(examples, texts)
    assert task.primary_metric == "ndcg@10"
    assert RecommendTask(task.tokenizer, None, eval_mode="greedy", **SMALL).primary_metric == "exact"


@pytest.mark.parametrize("settings,key", [
    ({"mode": "chat"}, "mode"), ({"codebook_sizes": [1, 4]}, "codebook_sizes"),
    ({"codebook_sizes": [8, 8, 8, 8, 8]}, "codebook_sizes"), ({"codebook_sizes": [300]}, "codebook_sizes"),
    ({"k_values": [0, 5]}, "k_values"), ({"k_values": [5, 5]}, "k_values"), ({"beam_size": 5}, "beam_size"),
    ({"eval_mode": "sampled"}, "eval_mode"), ({"noise": 1.0}, "noise"), ({"jump": -0.1}, "jump"),
    ({"n_test": 0}, "n_test"), ({"num_categories": 20}, "num_categories"),
])
def test_bad_options_name_their_key(settings, key):
    with pytest.raises(OptionError) as err:
        RecommendTask(recommend_tokenizer(), None, **settings)
    assert err.value.field == key and str(err.value).startswith(key)


def test_config_names_the_key_and_refuses_beam_evaluation_for_diffusion():
    cfg = Config()
    apply_overrides(cfg, ["task.name=recommend", "model.kind=ar", "model.name_or_path=tiny-sudoku-ar", "train.algorithm=srpo",
                          "task.options.beam_size=3"])
    with pytest.raises(ConfigError, match=r"task\.options\.beam_size"):
        validate(cfg)
    with pytest.raises(OptionError, match="eval_mode"):
        RecommendTask.check_policy(RecommendOptions(), kind_of("diffusion"), evaluates=True)
    RecommendTask.check_policy(RecommendOptions(eval_mode="greedy"), kind_of("diffusion"), evaluates=True)
    RecommendTask.check_policy(RecommendOptions(), kind_of("ar"), evaluates=True)


def test_tokenizer_without_code_tokens_is_refused():
    with pytest.raises(ValueError, match="recommend_tokenizer"):
        RecommendTask(build_char_tokenizer(), None, **SMALL)


def test_train_batches_are_a_function_of_seed_and_step(task):
    a = task.train_batch(48, seed=1, step=3)
    assert a == task.train_batch(48, seed=1, step=3) and a != task.train_batch(48, seed=2, step=3)
    epoch = task.train_batch(64, seed=1, step=0)
    assert sorted(u.user for u in epoch) == list(range(64))  # one epoch: every user once
    with pytest.raises(ValueError, match="held-out users"):
        task.test_batch(9)


def test_describe_for_the_dry_run():
    d = RecommendTask.describe(dataclasses.replace(RecommendOptions(), **SMALL))
    assert d["primary_metric"] == "ndcg@10" and d["users"].startswith("64 train, 8 held-out")
    assert d["catalogue"] == "256 items in 8 categories" and d["semantic_ids"].startswith("4 levels")


def test_a_canvas_too_short_for_the_mode_names_sampling_gen_length():
    tok = recommend_tokenizer()
    with pytest.raises(ValueError, match=r"sampling\.gen_length: 8 .* set sampling\.gen_length >= 19"):
        RecommendTask(tok, None, gen_length=8, mode="reasoning", **SMALL)
    assert RecommendTask(tok, None, gen_length=16, **SMALL).gen_length == 16  # (longer: EOS ends the answer)


def test_a_canvas_too_short_for_the_mode_is_refused_by_the_config_check():
    from dlmrl.config import Config, ConfigError, apply_overrides, load_yaml, validate

    cfg = Config()
    load_yaml(cfg, "configs/srpo_recommend_tiny_ar.yaml")
    apply_overrides(cfg, ["task.options.mode=reasoning"])
    with pytest.raises(ConfigError, match=r"sampling.gen_length.*cannot hold the reasoning mode's completion \(19"):
        validate(cfg)


@pytest.mark.parametrize("seed", ["catalogue_seed", "user_seed"])
def test_a_negative_seed_is_refused_naming_it(seed):
    from dlmrl.config import Config, ConfigError, apply_overrides, load_yaml, validate

    cfg = Config()
    load_yaml(cfg, "configs/srpo_recommend_tiny_ar.yaml")
    apply_overrides(cfg, [f"task.options.{seed}=-1"])
    with pytest.raises(ConfigError, match=f"task.options.{seed}.*integer >= 0"):
        validate(cfg)


def test_the_shipped_base_on_another_world_is_warned_about():
    import warnings

    from dlmrl.config import Config, apply_overrides, load_yaml, validate

    def check(*overrides):
        cfg = Config()
        load_yaml(cfg, "configs/srpo_recommend_tiny_ar.yaml")
        apply_overrides(cfg, list(overrides))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            validate(cfg)
        return [str(w.message) for w in caught if "tiny-recommend-ar was trained" in str(w.message)]

    assert check() == [] and check("task.options.user_seed=3") == []  # (new users of the same world: fine)
    assert "num_categories" in check("task.options.num_categories=6")[0]
