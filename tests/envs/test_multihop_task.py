"""The multihop task: options and their errors, the single-sequence reward (re-simulated observations, each
component in the reward table), the scripted traces at full reward, data as a function of (seed, step), the
tokenizer, and episode rollouts whose rows carry the final reward and its parts."""

from __future__ import annotations

import pytest
import torch

from dlmrl.config import Config, apply_overrides, validate
from dlmrl.data import TASKS
from dlmrl.data.multihop_task import MultiHopTask, multihop_tokenizer
from dlmrl.envs import default_env, make_env
from dlmrl.envs.tools import ScriptedAgent
from dlmrl.envs.tools.trace_reward import COMPONENTS
from dlmrl.errors import OptionError
from dlmrl.models.tokenizer import ALPHABET, build_char_tokenizer
from dlmrl.rewards.functions import ScoresEachReward
from dlmrl.training.episodes import rollout_episodes, trajectory_reward_parts

TOK = multihop_tokenizer()
TASK = MultiHopTask(TOK, None)


def test_text_tokenizer_keeps_the_sudoku_ids_and_covers_every_trace():
    sudoku = build_char_tokenizer().get_vocab()
    assert all(TOK.get_vocab()[k] == v for k, v in sudoku.items())
    assert TOK("31=\n |", add_special_tokens=False)["input_ids"] == build_char_tokenizer()(
        "31=\n |", add_special_tokens=False)["input_ids"]
    agent = ScriptedAgent(TASK.simulator)
    for q in TASK.train_examples[:50] + TASK.test_examples[:50]:
        text = agent.completion(q)
        ids = TOK(text, add_special_tokens=False)["input_ids"]
        assert TOK.unk_token_id not in ids and TOK.decode(ids) == text
    assert set(ALPHABET) < set(TOK.get_vocab())


def test_registered_with_options_and_a_default_environment():
    assert TASKS.get("multihop") is MultiHopTask and default_env("multihop") == "multihop"
    assert isinstance(TASK, ScoresEachReward)
    assert TASK.reward_functions.names == COMPONENTS
    assert not set(q.chain) & {e for t in TASK.test_examples for e in t.chain} if (q := TASK.train_examples[0]) else 0


@pytest.mark.parametrize(("settings", "key"), [({"context": "chat"}, "context"), ({"metric": "bleu"}, "metric"),
                                              ({"hops": [4]}, "hops"), ({"w_ans": 0.0, "w_cons": 0.0}, "w_ans"),
                                              ({"n_train": -1}, "n_train"), ({"eval_mode": "x"}, "eval_mode")])
def test_bad_options_name_their_key(settings, key):
    with pytest.raises(OptionError, match=f"^{key}: ") as raised:  # (the config names task.options.<key> from it)
        MultiHopTask(TOK, None, **settings)
    assert raised.value.field == key


def test_config_validation_reads_task_options():
    cfg = Config()
    apply_overrides(cfg, ["model.kind=ar", "model.name_or_path=tiny-sudoku-ar", "task.name=multihop", "train.algorithm=grpo",
                          "task.options.context=memory", "sampling.gen_length=64", "eval.num_puzzles=0"])
    validate(cfg)
    apply_overrides(cfg, ["task.options.contxt=memory"])
    with pytest.raises(Exception, match="task.options.contxt"):
        validate(cfg)


def test_scripted_traces_score_full_reward_and_every_component():
    qs = TASK.test_batch(20)
    refs = [TASK.reference_solution(q) for q in qs]
    assert TASK.rewards(qs, refs) == pytest.approx([1.2] * 20)
    table = TASK.reward_table(qs, refs)
    assert table.shape == (20, 5) and torch.all(table == 1)
    assert torch.allclose(TASK.reward_functions.combine(table), torch.full((20,), 1.2))
    m = TASK.metrics(qs, refs)
    assert m["em"] == m["f1"] == m["tool_call_validity"] == m["grounded"] == 1.0
    logged = TASK.reward_functions.metrics(table)
    assert logged["rewards/answer/mean"] == 1.0 and logged["rewards/consistency/mean"] == 1.0


def test_made_up_observations_earn_nothing_in_the_single_sequence_form():
    q = TASK.test_examples[0]
    real = TASK.reference_solution(q)
    first = real.split("Observation: ")[1].split("\n")[0]
    forged = real.replace(f"Observation: {first}\n", "Observation: Nobody Atall\n", 1)
    s = TASK.scores([q], [forged])[0]
    assert s.observed < 1.0 and s.answer == 1.0  # (the later hops still name the real entity)
    # an answer that was never observed (guessed) is right but not grounded
    guess = f"Thought: I know it.\nFinal Answer: {q.answer}\n"
    g = TASK.scores([q], [guess])[0]
    assert (g.answer, g.grounded, g.consistency) == (1.0, 0.0, 0.0) and g.reward == pytest.approx(1.0)


def test_answer_only_weights_and_f1():
    task = MultiHopTask(TOK, None, w_cons=0.0, metric="f1")
    q = task.test_examples[0]
    assert task.rewards([q], ["Final Answer: nothing"]) == [0.0]
    assert task.rewards([q], [task.reference_solution(q)]) == [1.0] and task.CORRECT == 1.0


def test_train_batches_are_a_function_of_seed_and_step_and_splits_are_disjoint():
    a, b = TASK.train_batch(8, 3, 5), MultiHopTask(TOK, None).train_batch(8, 3, 5)
    assert a == b and a != TASK.train_batch(8, 3, 6)
    epoch = TASK.train_batch(len(TASK.train_examples), 0, 0)
    assert sorted(q.question for q in epoch) == sorted(q.question for q in TASK.train_examples)
    train_words = TASK.kb.words(e for q in TASK.train_examples for e in q.chain)
    assert not train_words & TASK.kb.words(e for q in TASK.test_examples for e in q.chain)


def test_encode_decode_round_trip():
    batch = TASK.encode(TASK.test_batch(3))
    assert batch.canvas.shape == (3, TASK.gen_length) and batch.prompt_mask.any(-1).all()
    assert TOK.decode(batch.prompt_ids[0][batch.prompt_mask[0]]).startswith("[BOS]Question: ")
    ids = TOK("Final Answer: X", add_special_tokens=False)["input_ids"] + [TOK.eos_token_id, 40, 41]
    assert TASK.decode(torch.tensor([ids])) == ["Final Answer: X"]


class AgentPolicy:
    """Plays the scripted agent's turns (then EOS), whatever the prompt: episode e's turn k is its question's."""

    device = torch.device("cpu")
    tokenizer = TOK

    def __init__(self, turns):
        self.turns, self.calls = turns, 0

    def generate(self, prompt_ids, prompt_mask, max_new_tokens, temperature=1.0, generator=None, temperature_fn=None):
        texts = [t[min(self.calls, len(t) - 1)] for t in self.turns][: len(prompt_ids)]
        self.calls += 1
        rows = [TOK(t, add_special_tokens=False)["input_ids"][: max_new_tokens - 1] + [TOK.eos_token_id]
                for t in texts]
        comp = torch.tensor([r + [TOK.pad_token_id] * (max_new_tokens - len(r)) for r in rows])
        mask = torch.arange(max_new_tokens)[None, :] < torch.tensor([len(r) for r in rows])[:, None]
        return comp, mask


@pytest.mark.parametrize("context", ["react", "memory"])
def test_episode_rows_carry_the_final_reward_and_its_parts(context):
    task = TASK.in_context(context)
    q2 = next(q for q in task.train_examples if q.hops == 2)
    q3 = next(q for q in task.train_examples if q.hops == 3)
    agent = ScriptedAgent(task.simulator)
    # episode 0 answers correctly (3 turns); episode 1 plays q3's turns with a wrong final answer (4 turns)
    wrong = agent.turns(q3)
    wrong[-1] = wrong[-1].replace(q3.answer, "Nobody")
    policy = AgentPolicy([agent.turns(q2), wrong])
    envs = []

    def fresh():
        envs.append(make_env("multihop", task, 5))
        return envs[-1]

    ro = rollout_episodes(policy, task, fresh, [q2, q3], 1, torch.Generator().manual_seed(0), 160)
    assert all(env.mode == context for env in envs)
    assert ro.trajectory_ids.tolist() == [0] * 3 + [1] * 4
    assert ro.rewards.tolist() == pytest.approx([1.2] * 3 + [envs[1].score.reward] * 4)
    assert envs[1].score.answer == 0.0 and envs[1].score.valid == 1.0
    parts = trajectory_reward_parts(ro)
    assert parts.shape == (2, 5) and parts[0].tolist() == [1.0] * 5
    assert parts[1].tolist() == pytest.approx(list(envs[1].score.parts()))
    assert ro.reward_parts.shape == (7, 5)
    m = task.episode_metrics([q2, q3], envs)
    assert m["em"] == 0.5 and m["tool_call_validity"] == 1.0 and m["mean_actions"] == 2.5


def test_user_simulator_hook():
    calls = []

    def answer_fn(name, arguments):
        calls.append((name, arguments))
        return "Somewhere"

    task = MultiHopTask(TOK, None, answer_fn=answer_fn)
    q = task.test_examples[0]
    s = task.scores([q], [TASK.reference_solution(q)])[0]
    assert calls and s.observed == 0.0  # (the hook answers differently from the knowledge base)


def test_piece_tokenizer_round_trips_any_text_and_shortens_traces(tmp_path):
    import random
    import string

    from transformers import AutoTokenizer

    rng = random.Random(0)
    texts = ["".join(rng.choice(string.printable) for _ in range(rng.randint(0, 80))) for _ in range(200)]
    for t in texts:
        ids = TOK(t, add_special_tokens=False)["input_ids"]
        if all(c in TOK.get_vocab() for c in t):  # (every printable ASCII character has its token)
            assert TOK.decode(ids) == t
    q = TASK.train_examples[0]
    trace = TASK.reference_solution(q)
    assert len(TOK(trace, add_special_tokens=False)["input_ids"]) < len(trace) / 3
    TOK.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again(trace)["input_ids"] == TOK(trace)["input_ids"]
    # a name is cut the same way in the question, the action and the observation (so copying it is exact)
    name = q.topic
    pieces = TOK.tokenize(name)
    assert all(TOK.tokenize(s)[: len(pieces)] == pieces for s in (name + " was", name + '", "'))


def test_episode_evaluation_with_a_diffusion_policy_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    """``eval_mode: episodes`` needs an AR policy's ``generate``: refused by the config check (the dry-run shows it),
    not at the first evaluation after the model has loaded."""
    from pathlib import Path

    from dlmrl.cli import main
    from dlmrl.config import Config, ConfigError, apply_overrides, load_yaml
    from dlmrl.models import loading
    from dlmrl.training.trainer import train

    config = str(Path(__file__).parents[2] / "configs" / "mtr_multihop_tiny_ar.yaml")
    diffusion = ["model.kind=diffusion", "model.name_or_path=tiny-sudoku", f"output_dir={tmp_path / 'run'}"]
    assert main(["train", "--config", config, *diffusion, "--dry-run"]) == 2
    assert "config key 'task.options.eval_mode': eval_mode: 'episodes'" in capsys.readouterr().err
    monkeypatch.setattr(loading, "load_policy", lambda *a, **k: pytest.fail("the model was loaded"))
    cfg = Config()
    load_yaml(cfg, config)
    apply_overrides(cfg, diffusion)
    with pytest.raises(ConfigError, match="task.options.eval_mode"):
        train(cfg, progress=False)
    for fix in (["task.options.eval_mode=sequence"], ["eval.before=false", "eval.after=false"]):
        assert main(["train", "--config", config, *diffusion, *fix, "--dry-run"]) == 0, capsys.readouterr().err
