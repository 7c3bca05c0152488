"""Tools executed inside the rollout (dlmrl/training/tool_loop.py): the stop rule, the splice of observations into
one sequence per trajectory, observation tokens masked from everything the trainer scores, and every AR group
preset training with it."""

from __future__ import annotations

import pytest
import torch

from dlmrl.config import ConfigError, validate
from dlmrl.data.multihop_task import MultiHopTask
from dlmrl.envs import make_env
from dlmrl.envs.tools.agent import ScriptedAgent
from dlmrl.envs.tools.env import turn_end
from dlmrl.kinds import kind_of
from dlmrl.models.ar import AutoregressivePolicy, load_ar_policy
from dlmrl.objectives.presets import ALGORITHMS
from dlmrl.training.tool_loop import cut_turn_tokens, rollout_tool_loop
from dlmrl.training.trainer import train
from tests.training.test_multihop_train import config, rows

TOOL_LOOP = {"sampling.gen_length": 64, "train.env": "multihop_react", "train.max_turns": 3,
             "task.options.context": "react"}


@pytest.mark.parametrize(("text", "end"), [
    ("Thought: I need X.\nAction: lookup[{\"a\": 1}]", None),          # the call's line is not finished
    ("Thought: I need X.\nAction: lookup[{\"a\": 1}]\n", 44),   # 19 + 24 characters and the newline
    ("Thought: I need X.\nAction: lookup[{\"a\": 1}]\nThought: more", 44),
    ("Thought: done.\nFinal Answer: Kukaki", None),
    ("Thought: done.\nFinal Answer: Kukaki\nextra", 36),
    ("Thought: hm\nObservation: made up\n", 12),                         # a policy's own observation is cut
    ("Thought: only thinking\n", None),
])
def test_turn_end_is_the_end_of_the_first_action_or_final_answer_line(text, end):
    assert turn_end(text) == end
    if end is not None:
        assert text[:end].endswith("\n") or text[end:].startswith("Observation")


class _CharTokenizer:
    """A tokenizer with one token per character, and one token ``"]\\n"`` that spans a turn's end."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join("]\n" if i == 0 else chr(i) for i in ids)


def test_cut_turn_tokens_keeps_the_token_that_completes_the_turn_and_drops_the_rest():
    tok = _CharTokenizer()
    ids = [ord(c) for c in "Action: f[1"] + [0] + [ord(c) for c in "Thought: x"]
    n, text, complete = cut_turn_tokens(tok, ids, turn_end)
    assert n == len("Action: f[1") + 1 and text == "Action: f[1]\n" and complete
    assert cut_turn_tokens(tok, [ord(c) for c in "no turn"], turn_end) == (7, "no turn", False)


class _ScriptedPolicy:
    """An AR policy stand-in that writes the scripted agent's turns (plus junk after each, which the stop rule
    must cut), recording the contexts it was asked to continue."""

    def __init__(self, real: AutoregressivePolicy, turns: dict[str, list[str]]):
        self.tokenizer, self.device = real.tokenizer, torch.device("cpu")
        self.pad_token_id, self.stop_token_ids = real.pad_token_id, real.stop_token_ids
        self.turns, self.contexts = turns, []

    def generate(self, ids, mask, max_new_tokens, **kwargs):
        out = torch.full((len(ids), max_new_tokens), self.pad_token_id)
        for k in range(len(ids)):
            context = self.tokenizer.decode(ids[k][mask[k]], skip_special_tokens=True)
            self.contexts.append(context)
            question = context.split("\n", 1)[0]
            turn = self.turns[question][context.count("Observation:")]
            new = self.tokenizer(turn + "Thought: junk after the turn", add_special_tokens=False)["input_ids"]
            new = new[:max_new_tokens]
            out[k, : len(new)] = torch.tensor(new)
        return out, torch.ones_like(out, dtype=torch.bool)


@pytest.fixture(scope="module")
def world():
    policy = load_ar_policy("tiny-multihop-ar")
    task = MultiHopTask(policy.tokenizer, None)
    return policy, task


def test_observations_are_spliced_in_as_context_tokens_and_the_trajectory_scores_like_the_episode(world):
    policy, task = world
    examples = task.train_batch(3, 0, 0)
    agent = ScriptedAgent(task.simulator)
    turns = {f"Question: {q.question}": agent.turns(q) for q in examples}
    fake = _ScriptedPolicy(policy, turns)
    ro = rollout_tool_loop(fake, lambda: make_env("multihop_react", task, 5), examples, 2,
                           torch.Generator().manual_seed(0), 400)
    tok = policy.tokenizer
    assert len(ro) == 6 and ro.group_ids.tolist() == [0, 0, 1, 1, 2, 2]
    assert not (ro.completion_mask & ro.observation_mask).any()
    for e, q in enumerate(ro.examples):
        # the sequence: turn 1, its observation, turn 2, ... exactly the scripted trace (the junk after each turn
        # is cut); the observation tokens are the tokenizer's tokens of "Observation: <simulator's answer>\n"
        trace = agent.trace(q)
        expected_ids, expected_obs = [], []
        for text, step in zip(agent.turns(q), trace.steps):
            ids = tok(text, add_special_tokens=False)["input_ids"]
            expected_ids += ids
            expected_obs += [False] * len(ids)
            if step.observation is not None:
                obs = tok(f"Observation: {step.observation}\n", add_special_tokens=False)["input_ids"]
                expected_ids += obs
                expected_obs += [True] * len(obs)
        n = len(expected_ids)
        assert ro.completion[e, :n].tolist() == expected_ids
        assert ro.observation_mask[e, :n].tolist() == expected_obs
        assert not (ro.completion_mask[e, n:] | ro.observation_mask[e, n:]).any()
        assert ro.completion_mask[e, :n].tolist() == [not o for o in expected_obs]
        assert ro.turns[e] == q.hops + 1 and ro.tool_errors[e] == 0
    # the correct trace's MTR reward: EM 1 + 0.2 × consistency 1
    assert ro.rewards.tolist() == pytest.approx([1.2] * 6)
    assert ro.reward_parts is not None and ro.reward_parts.shape[0] == 6


def test_a_tool_answer_no_tokenizer_can_encode_is_an_error_naming_the_tool(world):
    """A user's simulator returning a lone surrogate (bytes decoded with surrogateescape) stopped the loop with the
    tokenizer's bare TypeError; it is now an error naming the tool and the character."""
    from dlmrl.envs.tools.simulator import ToolAnswerError

    policy, _ = world
    broken = {"on": False}  # (the task's construction runs the simulator on a reference trace: answered well)
    task = MultiHopTask(policy.tokenizer, None,
                        answer_fn=lambda name, arguments: "bad \udcff" if broken["on"] else "Kavoni")
    broken["on"] = True
    examples = task.train_batch(1, 0, 0)
    agent = ScriptedAgent(MultiHopTask(policy.tokenizer, None).simulator)
    fake = _ScriptedPolicy(policy, {f"Question: {q.question}": agent.turns(q) for q in examples})
    first_tool = agent.trace(examples[0]).steps[0].action.name
    with pytest.raises(ToolAnswerError, match=rf"tool '{first_tool}': answer_fn returned text that is not valid "
                                              r"Unicode \(surrogates not allowed: '\\udcff' at character 4 of"):
        rollout_tool_loop(fake, lambda: make_env("multihop_react", task, 5), examples, 1,
                          torch.Generator().manual_seed(0), 400)


def test_a_budget_too_small_for_the_next_observation_ends_the_row_and_scores_it(world):
    policy, task = world
    examples = task.train_batch(1, 0, 0)
    agent = ScriptedAgent(task.simulator)
    fake = _ScriptedPolicy(policy, {f"Question: {q.question}": agent.turns(q) for q in examples})
    first = policy.tokenizer(agent.turns(examples[0])[0], add_special_tokens=False)["input_ids"]
    ro = rollout_tool_loop(fake, lambda: make_env("multihop_react", task, 5), examples, 1,
                           torch.Generator().manual_seed(0), len(first) + 3)
    assert ro.turns.tolist() == [1] and not ro.observation_mask.any()
    assert ro.completion_mask[0].sum() == len(first)
    assert ro.rewards[0] < 1.0  # (no final answer)


def test_a_memory_context_is_refused_with_the_key_named(tmp_path):
    with pytest.raises(ConfigError, match="train.env.*multihop_react"):
        config("configs/mtr_multihop_tiny_ar.yaml", "tiny-multihop-ar", tmp_path,
               **{**TOOL_LOOP, "train.env": "multihop_memory"})
    with pytest.raises(ConfigError, match="train.env.*context 'memory'"):
        config("configs/mtr_multihop_tiny_ar.yaml", "tiny-multihop-ar", tmp_path,
               **{**TOOL_LOOP, "task.options.context": "memory", "train.env": "multihop"})


def _ar_presets():
    import warnings

    with warnings.catch_warnings():  # (a preset's own construction warnings are not this test's subject)
        warnings.simplefilter("ignore")
        presets = {n: ALGORITHMS.get(n)() for n in ALGORITHMS.names()}
    return [n for n, p in presets.items() if "ar" in p.policies and not p.multi_turn and p.anchor_threshold is None]


def _tool_loop_config(algo: str, out):
    # (the shipped SFT'd model, which writes actions from the first step: the rollout then holds observations)
    return config("configs/mtr_multihop_tiny_ar.yaml", "tiny-multihop-ar", out, **TOOL_LOOP,
                  **{"train.algorithm": algo, "train.beta": 0.04, "eval.before": False, "eval.after": False})


@pytest.fixture(scope="module")
def tool_rollout(tmp_path_factory):
    """One tools-in-the-loop rollout of the shipped model (2 prompts × G 2), sampled by the trainer's step 1."""
    from dlmrl.training.run_setup import set_up_run
    from dlmrl.training.sample_step import sample_step, step_generator

    cfg = _tool_loop_config("grpo", tmp_path_factory.mktemp("rollout"))
    run = set_up_run(cfg, validate(cfg), resume=False)
    ro, _ = sample_step(run.policy, run.task, cfg, run.preset, 0, step_generator(0, 0), run.max_length,
                        None, run.env, run.pad_id, run.processes)
    assert ro.observation_mask.any(), "the rollout must hold observation tokens for the test to mean anything"
    return ro


@pytest.mark.parametrize("algo", _ar_presets())
def test_changing_the_observations_log_probs_changes_no_gradient(algo, tool_rollout, tmp_path, monkeypatch):
    """The trainer's own step 3-5 code (prepare_update, the scorer's backward) on a tools-in-the-loop rollout,
    with the AR log-probs (policy and reference) and entropies of the observation tokens replaced by the model's
    real, differentiable values times k: the loss and every parameter's gradient are the same for every k."""
    from dlmrl.training.run_setup import set_up_run
    from dlmrl.training.sample_step import step_generator
    from dlmrl.training.update import group_loss_fn, prepare_update

    cfg = _tool_loop_config(algo, tmp_path)
    run, ro = set_up_run(cfg, validate(cfg), resume=False), tool_rollout
    original = AutoregressivePolicy.token_logprobs

    def observations(cmask):  # (the tokens between actions that are not actions: the spliced observations)
        pos = torch.arange(cmask.shape[1])
        last = torch.where(cmask.any(-1), (cmask * pos).argmax(-1), -1)
        return ~cmask & (pos[None, :] < last[:, None])

    def run_step(k):
        def token_logprobs(self, p, pm, c, cm, temperature=1.0):
            obs = observations(cm.bool())
            logp, ent = original(self, p, pm, c, cm.bool() | obs, temperature)
            return torch.where(obs, k * logp, logp), torch.where(obs, k * ent + (k - 1), ent)

        monkeypatch.setattr(AutoregressivePolicy, "token_logprobs", token_logprobs)
        run.policy.model.zero_grad()
        batch = prepare_update(run, ro, step_generator(0, 1))
        loss_fn = group_loss_fn(run.objective, batch.old.old[0], batch.advantages, batch.mine.completion_mask,
                                batch.row_weight, logp_ref=batch.old.ref[0], **batch.inputs)
        loss, _ = run.scorer.backward(0, loss_fn, lambda t: t.backward())
        monkeypatch.setattr(AutoregressivePolicy, "token_logprobs", original)
        return loss.item(), [p.grad.clone() if p.grad is not None else None for p in run.policy.model.parameters()]

    loss1, grads1 = run_step(1.0)
    loss5, grads5 = run_step(5.0)
    assert loss1 == loss5
    assert any(g is not None and g.abs().sum() > 0 for g in grads1) or loss1 == 0
    for a, b in zip(grads1, grads5):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=0, atol=0)  # (the same ops on the same action values: bit for bit)


@pytest.mark.parametrize("algo", ["grpo", *(pytest.param(a, marks=pytest.mark.slow) for a in ("dapo", "gspo", "srpo"))])
def test_group_presets_train_two_steps_with_tools_in_the_loop(algo, tmp_path):
    train(_tool_loop_config(algo, tmp_path), progress=False)
    logged = rows(tmp_path)
    assert [r["step"] for r in logged] == [1, 2]
    for r in logged:
        assert 1 <= r["turns_mean"] <= 3 and r["tool_errors_mean"] >= 0 and r["observation_tokens_mean"] >= 0


# -- block diffusion: the turns stop at block boundaries, the trajectory likelihood replays the canvas exactly -------

class _CountingEnv:
    """A test environment with a position rule: a turn ends once its text has ``turn_chars`` characters; the
    observation is a fixed line; the episode ends after ``max_turns`` turns with reward = turns / 10."""

    appends_observations, tool_errors = True, 0

    def __init__(self, max_turns=3, turn_chars=5):
        self.max_turns, self.turn_chars = max_turns, turn_chars
        self.texts: list[str] = []

    def reset(self, example):
        self.turn, self.done = 0, False
        return f"Question: {example}\n"

    def turn_end(self, text):
        return len(text) if len(text) >= self.turn_chars else None

    def step(self, text):
        self.turn += 1
        self.texts.append(text)
        self.done = self.turn >= self.max_turns
        return "", self.done, self.turn / 10 if self.done else 0.0

    def observation_text(self, text):
        return "" if self.done else "Observation: Kavoni\n"

    def close(self, drop_last_observation=False):
        self.done = True
        return self.turn / 10


def _block_multihop_policy(block_size: int):
    from dlmrl.data.multihop_task import multihop_tokenizer
    from dlmrl.models.block_policy import block_policy_from
    from dlmrl.models.families import FAMILIES
    from dlmrl.models.policy import MaskedDiffusionPolicy
    from dlmrl.models.tiny import build_tiny_model

    tok = multihop_tokenizer()
    model = build_tiny_model(len(tok), hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32, seed=0).eval()
    base = MaskedDiffusionPolicy(model, tok, tok.mask_token_id, "tiny", FAMILIES.get("tiny").logits, tok.eos_token_id,
                                 tok.pad_token_id)
    return block_policy_from(base, block_size)


@pytest.mark.parametrize(("temperature", "threshold"), [(1.0, None), (0.0, None), (1.0, 0.3)])
def test_block_turns_stop_at_block_boundaries_and_the_trajectory_likelihood_is_exact(temperature, threshold):
    from dlmrl.config import Config
    from dlmrl.estimators import score
    from dlmrl.estimators.block_plans import block_trajectory_plan
    from dlmrl.models.sampler import NOT_SAMPLED
    from dlmrl.training.tool_loop import rollout_tool_loop_blocks
    from tests.models.block_helpers import ATOL

    B, L = 4, 48
    policy = _block_multihop_policy(B)
    sampling = Config().sampling
    sampling.steps, sampling.block_length, sampling.temperature = L // 2, L, temperature
    sampling.threshold = threshold
    envs = []

    def make():
        envs.append(_CountingEnv())
        return envs[-1]

    ro = rollout_tool_loop_blocks(policy, make, ["Kavoni", "Tesu Rabelo"], 2, torch.Generator().manual_seed(0),
                                  sampling, L)
    obs_ids = policy.tokenizer("Observation: Kavoni\n", add_special_tokens=False)["input_ids"]
    for e in range(4):
        obs = ro.observation_mask[e]
        assert ro.turns[e] == 3 and obs.sum() == 2 * len(obs_ids)
        starts = [i for i in range(L) if obs[i] and (i == 0 or not obs[i - 1])]
        assert len(starts) == 2 and all(i % B == 0 for i in starts)  # (each turn stopped at a block boundary)
        for i in starts:
            assert ro.completion[e, i:i + len(obs_ids)].tolist() == obs_ids
        assert torch.equal(ro.completion_mask[e], ~obs)  # (every other position the policy decoded)
        assert (ro.reveal_step[e][obs] == NOT_SAMPLED).all() and (ro.token_logprobs[e][obs] == 0).all()
        assert (ro.reveal_step[e][~obs] != NOT_SAMPLED).all()
        assert (ro.completion[e] != policy.mask_token_id).all()
    assert ro.rewards.tolist() == pytest.approx([0.3] * 4)
    # the block trajectory likelihood (one composite pass per step index) replays the sampler's draws exactly; no
    # plan canvas ever masks an observation token
    t = temperature if temperature > 0 else 1.0
    plan = block_trajectory_plan(ro.completion_mask, ro.reveal_step, B, 1, temperature=t)
    assert not any((m & ro.observation_mask).any() for m in plan.masks)
    est = score(policy, ro.prompt_ids, ro.prompt_mask, ro.completion, ro.completion_mask, plan)
    torch.testing.assert_close(est.per_token, ro.token_logprobs, atol=ATOL, rtol=0)


def test_the_full_diffusion_kind_runs_in_segment_rounds_and_refuses_the_trajectory_estimator(tmp_path):
    from dlmrl.config import Config
    from dlmrl.estimators import SDMC
    from dlmrl.models.policy import MaskedDiffusionPolicy
    from dlmrl.training.tool_loop import rollout_tool_loop_blocks

    with pytest.raises(ConfigError, match="train.env.*trajectory estimator"):
        config("configs/mtr_multihop_tiny_ar.yaml", "tiny-multihop-ar", tmp_path,
               **TOOL_LOOP, **{"model.kind": "diffusion", "train.algorithm": "tracerl"})
    block = _block_multihop_policy(4)
    bidirectional = MaskedDiffusionPolicy(block.model, block.tokenizer, block.mask_token_id, "tiny", block.logits_fn,
                                          block.eos_token_id, block.pad_token_id)
    sampling = Config().sampling
    sampling.steps, sampling.block_length, sampling.temperature = 24, 8, 1.0
    ro = rollout_tool_loop_blocks(bidirectional, _CountingEnv, ["Kavoni", "Tesu"], 2, torch.Generator().manual_seed(0),
                                  sampling, 48)
    obs_ids = bidirectional.tokenizer("Observation: Kavoni\n", add_special_tokens=False)["input_ids"]
    for e in range(4):
        obs = ro.observation_mask[e]
        starts = [i for i in range(48) if obs[i] and (i == 0 or not obs[i - 1])]
        assert len(starts) == 2 and all(i % 8 == 0 for i in starts)  # (each turn stopped at a segment's end)
        assert torch.equal(ro.completion_mask[e], ~obs) and obs.sum() == 2 * len(obs_ids)
    # an ELBO plan masks only the policy's tokens: the observations stay clean context
    plan = SDMC().rollout_plan(ro.completion_mask, torch.Generator().manual_seed(1), ro.prompt_mask)
    assert not any((m & ro.observation_mask).any() for m in plan.masks)


@pytest.mark.parametrize(("kind", "algo"), [("block", "gdpo"), ("block", "tracerl"), ("diffusion", "gdpo")])
def test_a_diffusion_policy_trains_two_steps_with_tools_in_the_loop(kind, algo, tmp_path):
    """The trainer end to end on a block-diffusion or full-diffusion (segment rounds) checkpoint saved here (random
    weights, the multihop tokenizer)."""
    policy = _block_multihop_policy(4)
    policy.model.save_pretrained(tmp_path / "base")
    policy.tokenizer.save_pretrained(tmp_path / "base")
    kind_keys = ({"model.block_size": 4, "sampling.block_length": 4} if kind == "block"
                 else {"sampling.block_length": 8})
    cfg = config("configs/mtr_multihop_tiny_ar.yaml", str(tmp_path / "base"), tmp_path / "run",
                 **{**TOOL_LOOP, "model.kind": kind, **kind_keys, "train.algorithm": algo,
                    "sampling.gen_length": 32, "sampling.steps": 16,
                    "task.options.eval_mode": "sequence", "eval.before": False, "eval.after": False})
    train(cfg, progress=False)
    logged = rows(tmp_path / "run")
    assert [r["step"] for r in logged] == [1, 2] and all(r["turns_mean"] >= 1 for r in logged)
    if algo == "tracerl":  # (the trajectory at merge 1: the old-policy scores are the sampler's log-probs)
        assert logged[0]["rollout_logp_gap_max"] < 1e-4


def test_a_data_parallel_launch_is_refused_naming_the_key(tmp_path):
    from dlmrl.training.distributed import check_process_split

    cfg = _tool_loop_config("grpo", tmp_path)
    check_process_split(cfg, 1)
    with pytest.raises(ConfigError, match="train.env.*one process"):
        check_process_split(cfg, 2)


def _one_question(world):
    policy, task = world
    q = task.train_batch(1, 0, 0)[0]
    return policy, task, q, ScriptedAgent(task.simulator).turns(q)


def test_a_policy_written_observation_is_cut_from_the_row(world):
    policy, task, q, turns = _one_question(world)
    fake = _ScriptedPolicy(policy, {f"Question: {q.question}": ["Thought: I know.\nObservation: Kukaki\n", *turns]})
    ro = rollout_tool_loop(fake, lambda: make_env("multihop_react", task, 5), [q], 1, torch.Generator(), 400)
    tok = policy.tokenizer
    first_obs = int(ro.observation_mask[0].float().argmax())
    assert tok.decode(ro.completion[0, :first_obs]) == "Thought: I know.\n"  # (the policy's "Observation:" is cut)
    assert tok.decode(ro.completion[0, ro.observation_mask[0]]).startswith("Observation: Error: no action")


def test_the_reward_counts_only_the_observations_the_row_holds(world):
    from dlmrl.envs.tools.trace_reward import COMPONENTS

    policy, task, q, turns = _one_question(world)
    observed = COMPONENTS.index("observed")
    hops = q.hops
    tok = policy.tokenizer
    # the turn limit ends the episode right after the last action: its observation is still appended to the row
    fake = _ScriptedPolicy(policy, {f"Question: {q.question}": turns})
    ro = rollout_tool_loop(fake, lambda: make_env("multihop_react", task, hops), [q], 1, torch.Generator(), 400)
    text = tok.decode(ro.completion[0][ro.observation_mask[0]])
    assert text.count("Observation:") == hops and ro.reward_parts[0, observed] == 1.0
    # the budget ends the row before the last observation: the reward does not count it
    n = ro.completion_mask[0].nonzero().max().item() + 1  # (the row up to the end of the last action)
    ro = rollout_tool_loop(fake, lambda: make_env("multihop_react", task, hops), [q], 1, torch.Generator(), n + 1)
    assert tok.decode(ro.completion[0][ro.observation_mask[0]]).count("Observation:") == hops - 1
    assert ro.reward_parts[0, observed] == pytest.approx((hops - 1) / hops)


def test_a_final_answer_cut_by_the_budget_is_not_an_answer(world):
    policy, task, q, turns = _one_question(world)
    long_answer = turns[:-1] + [turns[-1].replace("Final Answer: ", "Final Answer: ").rstrip("\n") + " Extra\n"]
    fake = _ScriptedPolicy(policy, {f"Question: {q.question}": long_answer})
    full = rollout_tool_loop(fake, lambda: make_env("multihop_react", task, 5), [q], 1, torch.Generator(), 400)
    n = int((full.completion_mask[0] | full.observation_mask[0]).sum())
    cut = rollout_tool_loop(fake, lambda: make_env("multihop_react", task, 5), [q], 1, torch.Generator(), n - 2)
    text = policy.tokenizer.decode(cut.completion[0, : n - 2])
    assert "Final Answer: " + q.answer in text  # (the answer's name was written before the budget ran out)
    assert cut.reward_parts[0, 0] == 0.0  # (EM 0: the unfinished line was never a final answer)


def test_a_budget_that_cannot_hold_one_turn_is_refused_naming_it(tmp_path):
    with pytest.raises(ConfigError, match="sampling.gen_length.*cannot hold one turn"):
        config("configs/mtr_multihop_tiny_ar.yaml", "tiny-multihop-ar", tmp_path,
               **{**TOOL_LOOP, "sampling.gen_length": 5, "sampling.block_length": 5})
    # (an AR policy ignores sampling.block_length and sampling.steps: a gen_length they do not divide is fine)
    config("configs/mtr_multihop_tiny_ar.yaml", "tiny-multihop-ar", tmp_path,
           **{**TOOL_LOOP, "sampling.gen_length": 63, "sampling.block_length": 160, "sampling.steps": 7})


def test_the_budget_check_counts_dapos_overlong_cache_as_the_run_does(tmp_path):
    """The trajectory's budget is generation_budget's, the run's max_length: with DAPO (cache fraction 0.2)
    gen_length 13 gives ⌈14 / 0.8⌉ = 18 tokens, which holds a 16-token turn (it was refused counting 13 + 1)."""
    from dlmrl.objectives.presets import get_algorithm
    assert kind_of("ar").generation_budget(13, get_algorithm("dapo")) == 18
    config("configs/mtr_multihop_tiny_ar.yaml", "tiny-multihop-ar", tmp_path,
           **{**TOOL_LOOP, "sampling.gen_length": 13, "train.algorithm": "dapo"})
    with pytest.raises(ConfigError, match=r"config key 'sampling.gen_length': 14 tokens \(sampling.gen_length 13 and "
                                          r"EOS\) is the whole trajectory's budget .*turn_length 16 tokens"):
        config("configs/mtr_multihop_tiny_ar.yaml", "tiny-multihop-ar", tmp_path,
               **{**TOOL_LOOP, "sampling.gen_length": 13, "train.algorithm": "grpo"})


def test_eval_num_puzzles_is_checked_only_when_the_run_evaluates(tmp_path):
    config("configs/mtr_multihop_tiny_ar.yaml", "tiny-multihop-ar", tmp_path,
           **{"eval.num_puzzles": 10_000, "eval.before": False, "eval.after": False})
    with pytest.raises(ConfigError, match="eval.num_puzzles.*the held-out split has"):
        config("configs/mtr_multihop_tiny_ar.yaml", "tiny-multihop-ar", tmp_path, **{"eval.num_puzzles": 10_000})


def test_a_turn_that_begins_with_the_policys_own_observation_keeps_no_token():
    tok = _CharTokenizer()
    n, text, complete = cut_turn_tokens(tok, [ord(c) for c in "Observation: x\n"], turn_end)
    assert (n, text, complete) == (0, "", True)


class _ScriptedCanvas:
    """Stands in for the diffusion sampler: fills each row's masked positions with a fixed script of token ids."""

    def __init__(self, script, mask_id):
        self.script, self.mask_id = script, mask_id

    def __call__(self, policy, prompt_ids, prompt_mask, *, gen_length, canvas, **kwargs):
        from types import SimpleNamespace

        from dlmrl.models.sampler import NOT_SAMPLED

        out = canvas.clone()
        reveal = torch.full_like(canvas, NOT_SAMPLED)
        for r in range(len(canvas)):
            masked = (canvas[r] == self.mask_id).nonzero().flatten().tolist()
            for j, pos in enumerate(masked):
                out[r, pos] = self.script[pos] if pos < len(self.script) else policy.eos_token_id
                reveal[r, pos] = pos
        return SimpleNamespace(canvas=out, reveal_step=reveal, token_logprobs=torch.zeros(canvas.shape),
                               row_nfe=torch.ones(len(canvas), dtype=torch.long))


def test_block_turns_read_the_text_up_to_eos_and_observations_start_a_line(world, monkeypatch):
    from dlmrl.config import Config
    from dlmrl.models import sampler
    from dlmrl.training.tool_loop import rollout_tool_loop_blocks

    _, task = world
    q = task.train_batch(1, 0, 0)[0]
    agent_turn = ScriptedAgent(task.simulator).turns(q)[0]  # ("Thought: ...\nAction: lookup[...]\n")
    tok = task.tokenizer
    policy = _block_multihop_policy(4)
    # text after the first EOS is not the policy's: a final answer written there must not count
    script = (tok("Thought: x\n", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
              + tok(f"Final Answer: {q.answer}\n", add_special_tokens=False)["input_ids"])
    monkeypatch.setattr(sampler, "generate", _ScriptedCanvas(script, policy.mask_token_id))
    sampling = Config().sampling
    ro = rollout_tool_loop_blocks(policy, lambda: make_env("multihop_react", task, 5), [q], 1, torch.Generator(),
                                  sampling, 96)
    assert ro.rewards[0] < 1.0 and ro.reward_parts[0, 0] == 0.0
    # the rest of the turn's block stays in the row: the observation after it starts on a line of its own
    action = tok(agent_turn, add_special_tokens=False)["input_ids"]
    script = action + tok("Thought: ju", add_special_tokens=False)["input_ids"]
    policy = _block_multihop_policy(len(action) + 2)  # (the action line ends inside the first block)
    monkeypatch.setattr(sampler, "generate", _ScriptedCanvas(script, policy.mask_token_id))
    ro = rollout_tool_loop_blocks(policy, lambda: make_env("multihop_react", task, 2), [q], 1, torch.Generator(),
                                  sampling, 4 * len(action))
    first_obs = int(ro.observation_mask[0].float().argmax())
    assert first_obs == len(action) + 2  # (the next block boundary)
    assert tok.decode(ro.completion[0, : first_obs + 3]).count("\nObservation:") == 1
