"""Tools executed inside the rollout: one growing sequence per trajectory, the environment's observations spliced in.

The agent loop of Search-R1 (arXiv 2503.09516), verl's multi-turn rollout and MTR with its simulator in the loop
(arXiv 2510.06825): the policy writes until a turn ends (a ReAct turn: the line of its first ``Action:`` or
``Final Answer:``, :meth:`ToolEnv.turn_end <dlmrl.envs.tools.env.ToolEnv.turn_end>`), the environment runs the call
and its observation (``Observation: ...``) is appended to the same sequence as tokens, and the policy goes on from
there, until the episode ends (a final answer, ``env.max_turns`` turns), the policy writes a stop token, or the
sequence's token budget (``sampling.gen_length``, actions and observations together) runs out. Rows finish
different turns at different times; every turn samples the batch's still-active rows together.

Block-diffusion policies (:func:`rollout_tool_loop_blocks`) do the same on their canvas, a turn stopping at the end
of the block where its text ends; full-diffusion policies in segment rounds (their semi-autoregressive segments as
the blocks), scored by ELBO estimators only (their bidirectional attention makes the turns before an observation
depend on masks where the observation now stands, so the trajectory likelihood is not the sampler's).

A row is one trajectory: ``completion`` holds its action and observation tokens in order, ``observation_mask`` the
observation tokens, and ``completion_mask`` **only the action tokens** (the tokens the policy wrote). Everything the
trainer scores reads ``completion_mask``: the AR log-probs (an observation token is attended, being in the
sequence, but its log-prob is never taken), the ELBO plans and trajectory of the diffusion kinds (an observation
position is clean context, like a given cell of an infill task), the KL and entropy terms and every length
normalisation. So observation tokens are context, never actions (verl's ``response_mask`` / Search-R1's
retrieved-token loss mask).

Unlike the episode form of Flow-GRPO (:mod:`dlmrl.training.episodes`, one training row per turn) this works with
every group preset: the trajectory is one completion with one reward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import StoppingCriteria

from dlmrl.data.encoding import left_pad
from dlmrl.training.rollout import Rollout, consecutive_groups

__all__ = ["cut_turn_tokens", "rollout_tool_loop", "rollout_tool_loop_blocks"]


def cut_turn_tokens(tokenizer, tokens: Sequence[int],
                    turn_end: Callable[[str], int | None]) -> tuple[int, str, bool]:
    """The number of tokens of a sampled turn the environment reads, and their text.

    The turn is ``tokens[:k]`` for the smallest ``k`` whose decoded text has a complete turn (``turn_end`` not
    ``None``), less the tokens that start at or after the turn's end (a policy's own ``Observation:``): the tokens
    after it are dropped, as a stop sequence would have stopped sampling there (for a left-to-right sampler the kept
    tokens' distribution does not depend on the dropped ones). A token that spans the end is kept whole. Without a
    complete turn every token is kept.

    Args:
        tokenizer: decodes ids (``decode``, special tokens skipped). tokens: the turn's sampled ids, stop token
            included when there is one. turn_end: the environment's stop rule on text.
    Returns:
        ``(k, text, complete)``: ``0 <= k <= len(tokens)`` (0: the turn is empty, e.g. it began with the policy's
        own ``Observation:``), ``decode(tokens[:k])``, and whether the turn is complete (else ``k = len(tokens)``).
    """
    tokens = list(tokens)
    for k in range(1, len(tokens) + 1):
        text = tokenizer.decode(tokens[:k], skip_special_tokens=True)
        end = turn_end(text)
        if end is not None:
            # the turn may end before this token's text does (a policy's own "Observation:" is cut before it): keep
            # the fewest tokens whose text reaches the end, so tokens that start after it go too
            while k > 0 and len(tokenizer.decode(tokens[:k - 1], skip_special_tokens=True)) >= end:
                k -= 1
            return k, tokenizer.decode(tokens[:k], skip_special_tokens=True), True
    return len(tokens), tokenizer.decode(tokens, skip_special_tokens=True), False


class _TurnStop(StoppingCriteria):
    """A transformers ``StoppingCriteria``: a row is done once its turn is complete, and stays done (a row already
    done is not decoded again) — sampling then stops as soon as every row's turn has ended."""

    def __init__(self, tokenizer, turn_end, start: int):
        super().__init__()
        self.tokenizer, self.turn_end, self.start = tokenizer, turn_end, start
        self.done: torch.Tensor | None = None  # (B,) bool, the rows whose turn has ended

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        if self.done is None:
            self.done = torch.zeros(len(input_ids), dtype=torch.bool, device=input_ids.device)
        for i in (~self.done).nonzero().flatten().tolist():
            text = self.tokenizer.decode(input_ids[i, self.start:].tolist(), skip_special_tokens=True)
            self.done[i] = self.turn_end(text) is not None
        return self.done.clone()


def rollout_tool_loop(policy, make_env: Callable[[], object], examples: Sequence, num_generations: int,
                      generator: torch.Generator, max_length: int, temperature: float = 1.0,
                      temperature_fn=None) -> Rollout:
    """G trajectories per example with the environment's tools run inside each sequence (module docstring).

    Trajectory ``e = prompt · G + g`` starts from ``env.reset(example)`` (the prompt text, encoded once with the
    tokenizer's BOS as the tasks' prompts are). Each turn the active rows continue their own sequence (prompt,
    earlier turns, observations) with ``policy.generate`` (``temperature``, the step's ``generator``) for at most
    the row's remaining budget; the turn is cut at the environment's stop rule (:func:`cut_turn_tokens`) and given
    to ``env.step``, and ``env.observation_text(turn)`` is tokenized (no special tokens) and appended, after the last
    turn too, so that the row holds every observation the reward counts. A row ends when its episode ends, when its
    turn ended with a stop token (EOS: the episode is then closed and scored, ``env.close()``), when the budget ran
    out inside a turn (that partial turn is not run: ``env.close()``), or when the budget cannot hold the
    observation (and one more token, unless the episode ended): the observation is then withdrawn from the
    environment's record before it scores (``env.close(drop_last_observation=True)``), since the policy never saw
    it.

    Args:
        policy: an AR policy (``generate``, ``tokenizer``, ``device``, ``stop_token_ids``, ``pad_token_id``).
        make_env: a fresh environment per trajectory, one that appends its observations
            (``appends_observations``; e.g. ``multihop_react``) and has ``turn_end``, ``observation_text``,
            ``close`` and ``tool_errors``.
        examples: the prompts' examples. num_generations: G. generator: the step's generator.
        max_length: ``L``, the token budget of a trajectory (actions and observations; the completion width).
        temperature, temperature_fn: as in ``policy.generate`` (HAPO's adaptive temperature).
    Returns:
        A :class:`Rollout` of ``len(examples) · G`` rows in groups of G consecutive rows: ``completion`` ``(B, L)``
        long (pad id after the trajectory), ``completion_mask`` ``(B, L)`` bool the action tokens,
        ``observation_mask`` ``(B, L)`` bool the observation tokens, ``rewards`` = ``train_rewards`` ``(B,)``
        float32 the trajectory's final reward, ``reward_parts`` ``(B, F)`` when every environment gives them,
        ``turns`` / ``tool_errors`` ``(B,)`` long, ``nfe`` the sum over turns of the longest turn sampled (forward
        passes of the sampler per sequence; observation tokens cost none) and ``passes`` the sum over turns of the
        active rows × that turn's longest.
    Raises:
        ValueError: an environment whose context is not a growing transcript (``appends_observations`` False),
            or ``max_length < 1``.
        RuntimeError: an episode still running after its environment's ``max_turns`` turns.
    """
    if max_length < 1:
        raise ValueError(f"the token budget max_length must be >= 1, got {max_length}")
    tok, device, G = policy.tokenizer, policy.device, num_generations
    stops = {int(i) for i in policy.stop_token_ids}
    envs, owners, prompt_ids, prompt_mask = _start(make_env, examples, G, tok, device)
    E = len(envs)
    prompt_rows = [prompt_ids[e][prompt_mask[e]].tolist() for e in range(E)]
    tokens: list[list[int]] = [[] for _ in range(E)]
    is_obs: list[list[bool]] = [[] for _ in range(E)]
    turns, final = [0] * E, [0.0] * E
    active, nfe, passes, turn = list(range(E)), 0, 0, 0
    max_turns = max((env.max_turns for env in envs), default=0)
    while active:
        _check_turns(turn, max_turns)
        budget = max(max_length - len(tokens[e]) for e in active)
        ids, mask = left_pad([prompt_rows[e] + tokens[e] for e in active], policy.pad_token_id, device)
        comp, cmask = policy.generate(ids, mask, budget, temperature=temperature, temperature_fn=temperature_fn,
                                      generator=generator,
                                      stopping_criteria=[_TurnStop(tok, envs[active[0]].turn_end, ids.shape[1])])
        longest = 0
        still = []
        for k, e in enumerate(active):
            env = envs[e]
            room = max_length - len(tokens[e])
            sampled = comp[k][cmask[k]].tolist()[:room]
            n, text, complete = cut_turn_tokens(tok, sampled, env.turn_end)
            turn_tokens = sampled[:n]
            longest = max(longest, len(sampled))
            tokens[e] += turn_tokens
            is_obs[e] += [False] * len(turn_tokens)
            turns[e] += 1
            ended_by_stop = bool(turn_tokens) and turn_tokens[-1] in stops
            if not complete and not ended_by_stop:  # the budget ran out mid-turn: no turn to run; score what was done
                final[e] = env.close()
                continue
            _, done, final[e] = env.step(text)
            obs = tok(env.observation_text(text), add_special_tokens=False)["input_ids"]
            fits = len(tokens[e]) + len(obs) + (0 if done else 1) <= max_length  # (+1: room for the next turn)
            if obs and fits:  # (also after the last turn: the row then holds what the reward saw)
                tokens[e] += obs
                is_obs[e] += [True] * len(obs)
            elif obs:  # no room: the policy never sees this observation, so the reward must not count it either
                final[e] = env.close(drop_last_observation=True)
                continue
            if not done and ended_by_stop:
                final[e] = env.close()  # (the policy stopped writing)
            elif not done:
                still.append(e)
        nfe += longest
        passes += len(active) * longest
        active, turn = still, turn + 1
    completion = torch.full((E, max_length), policy.pad_token_id, dtype=torch.long)
    action = torch.zeros((E, max_length), dtype=torch.bool)
    observation = torch.zeros((E, max_length), dtype=torch.bool)
    for e in range(E):
        n = len(tokens[e])
        completion[e, :n] = torch.tensor(tokens[e], dtype=torch.long)
        obs = torch.tensor(is_obs[e], dtype=torch.bool)
        observation[e, :n], action[e, :n] = obs, ~obs
    return _trajectories(examples, owners, envs, final, turns, G, prompt_ids, prompt_mask, completion.to(device),
                         action.to(device), observation.to(device), nfe, passes)


def _check_turns(turn: int, max_turns: int) -> None:
    if turn >= max_turns:
        raise RuntimeError(f"episodes still running after {turn} turns: an environment must end its episodes "
                           "within its max_turns")


def _start(make_env, examples, G, tokenizer, device):
    """A fresh environment per trajectory (checked to append its observations), its first prompt encoded."""
    from dlmrl.data.encoding import encode_prompts

    envs, owners, prompts = [], [], []
    for i, ex in enumerate(examples):
        for _ in range(G):
            env = make_env()
            if not getattr(env, "appends_observations", False):
                raise ValueError(f"{type(env).__name__} rewrites its context every turn; tools inside the rollout need "
                                 "an environment whose observations are appended to the sequence (e.g. "
                                 "multihop_react, or the multihop task with task.options.context: react)")
            envs.append(env)
            owners.append(i)
            prompts.append(env.reset(ex))
    if not envs:
        empty = torch.zeros((0, 1), dtype=torch.long, device=device)
        return envs, owners, empty, empty.bool()
    return (envs, owners, *encode_prompts(tokenizer, prompts, device))


def _trajectories(examples, owners, envs, final, turns, G, prompt_ids, prompt_mask, completion, action, observation,
                  nfe, passes, **sampler_record) -> Rollout:
    """The rollout of finished trajectories: one row each, the final rewards, reward parts, turns and tool errors."""
    E, device = len(envs), completion.device
    rewards = torch.tensor(final, dtype=torch.float32)  # (B,)
    parts = [getattr(env, "reward_parts", None) for env in envs]
    reward_parts = (torch.tensor([list(p) for p in parts], dtype=torch.float32)
                    if E and all(p is not None for p in parts) else None)
    return Rollout([examples[i] for i in owners], prompt_ids, prompt_mask, completion, action, nfe,
                   consecutive_groups(E, G, device), rewards=rewards, train_rewards=rewards.clone(), passes=passes,
                   reward_parts=reward_parts, observation_mask=observation, turns=torch.tensor(turns, dtype=torch.long),
                   tool_errors=torch.tensor([getattr(env, "tool_errors", 0) for env in envs], dtype=torch.long),
                   **sampler_record)


def rollout_tool_loop_blocks(policy, make_env: Callable[[], object], examples: Sequence, num_generations: int,
                             generator: torch.Generator, sampling, gen_length: int) -> Rollout:
    """G trajectories per example from a block-diffusion policy with the environment's tools run inside each canvas.

    The canvas of ``gen_length`` tokens after the prompt is decoded block by block as in an ordinary rollout
    (:func:`dlmrl.models.sampler.generate` with the ``sampling`` settings), but turn by turn: each call decodes the
    row's canvas from its current turn on (earlier turns and observations are clean tokens of the canvas, the rest
    masks); the turn is the text up to the environment's stop rule, **rounded up to the end of its block** (a block is
    denoised as a whole, so the block holding the turn's end is kept whole, its tokens after the end included; the
    turn stops at a block boundary), the environment steps on the turn's text, and its observation is written as clean
    tokens from the next block boundary; everything after is masked again for the next call (a row that ends before
    an observation is shown, after its last turn or for want of room, has that observation withdrawn from the
    environment's record, ``env.close(drop_last_observation=True)``, so the reward counts only what the row holds).
    The blocks decoded past the turn are dropped: under block-causal attention no kept token attended them, so every kept token's recorded
    log-prob and reveal step are those of one block-by-block decode of the final canvas, in which the observation
    tokens are given tokens (an infill canvas's) — and the block trajectory likelihood replays them exactly. A row ends
    when its episode ends, the turn is not complete by the end of the canvas, or the observation and one more token do
    not fit; its last call's decode of the rest of the canvas is kept (the canvas a single-turn rollout would have).

    A full-diffusion (bidirectional) policy runs the same loop in **segment rounds**: its semi-autoregressive segments
    of ``sampling.block_length`` tokens play the blocks (a turn stops at the end of its segment). Its sampler's record
    is then that of the calls, not of one decode of the final canvas (the turns before an observation attended masks
    where the observation now stands), so only estimators that score the finished sequence (ELBO) are exact for it,
    not the trajectory likelihood (the config check refuses that pairing).

    Args:
        policy: a block-diffusion policy (:class:`~dlmrl.models.block_policy.BlockDiffusionPolicy`), or a masked-diffusion
            policy (segment rounds).
        make_env, examples, num_generations, generator: as in :func:`rollout_tool_loop`.
        sampling: the ``sampling`` config section (steps, temperature, remasking, threshold, ...).
        gen_length: ``L``, the canvas (actions and observations together).
    Returns:
        A :class:`Rollout` as :func:`rollout_tool_loop`'s, with the sampler's record over the final canvas:
        ``reveal_step`` ``(B, L)`` long (global block numbering, ``NOT_SAMPLED`` on observation tokens),
        ``token_logprobs`` ``(B, L)`` float32 (0 on observation tokens) and ``row_nfe`` ``(B,)`` (passes summed over
        the row's calls; ``nfe`` their mean, ``passes`` their sum).
    Raises:
        ValueError: as :func:`rollout_tool_loop`.
    """
    from dlmrl.models.sampler import NOT_SAMPLED, generate
    from dlmrl.training.rollout import mean_nfe

    B = getattr(policy, "block_size", None) or sampling.block_length  # (full diffusion: LLaDA's semi-AR segments)
    tok, device, G, L = policy.tokenizer, policy.device, num_generations, gen_length
    envs, owners, prompt_ids, prompt_mask = _start(make_env, examples, G, tok, device)
    E, s = len(envs), sampling
    canvas = torch.full((E, L), policy.mask_token_id, dtype=torch.long, device=device)
    reveal = torch.full((E, L), NOT_SAMPLED, dtype=torch.long, device=device)
    logp = torch.zeros((E, L), dtype=torch.float32, device=device)
    action = torch.zeros((E, L), dtype=torch.bool, device=device)
    observation = torch.zeros((E, L), dtype=torch.bool, device=device)
    row_nfe = torch.zeros(E, dtype=torch.long)
    start, turns, final = [0] * E, [0] * E, [0.0] * E
    active, turn = list(range(E)), 0
    max_turns = max((env.max_turns for env in envs), default=0)
    while active:
        _check_turns(turn, max_turns)
        idx = torch.tensor(active, dtype=torch.long, device=device)
        out = generate(policy, prompt_ids[idx], prompt_mask[idx], gen_length=L, block_length=s.block_length,
                       steps=s.steps, temperature=s.temperature, remasking=s.remasking, cfg_scale=s.cfg_scale,
                       canvas=canvas[idx], generator=generator, threshold=s.threshold,
                       threshold_factor=s.threshold_factor, cache=s.cache)
        still = []
        for k, e in enumerate(active):
            env, lo = envs[e], start[e]
            row_nfe[e] += int(out.row_nfe[k])
            rest = out.canvas[k, lo:].tolist()
            eos = policy.eos_token_id  # (the policy's text ends at its first EOS, as the task's decode reads it)
            stop = rest.index(eos) + 1 if eos is not None and eos in rest else len(rest)
            n, text, complete = cut_turn_tokens(tok, rest[:stop], env.turn_end)
            end = min(L, -(-(lo + n) // B) * B) if complete else L  # (the turn's end, up to its block's end)
            turns[e] += 1
            if not complete and stop == len(rest):  # (the canvas ran out mid-turn, no EOS: no turn to run)
                final[e], done = env.close(), True
            else:  # (a complete turn, or the policy ended its text with EOS)
                _, done, final[e] = env.step(text)
                # (the row keeps the rest of the turn's block: the observation starts a line after what it holds)
                kept = tok.decode(out.canvas[k, lo:end].tolist(), skip_special_tokens=True)
                obs = tok(env.observation_text(kept), add_special_tokens=False)["input_ids"]
                if obs and (done or not complete or end + len(obs) + 1 > L):
                    # the row ends before the observation: the policy never sees it, so the reward must not count it
                    final[e], done = env.close(drop_last_observation=True), True
            keep = slice(lo, L if done else end)  # (a finished row keeps its last decode of the whole canvas)
            sampled = out.reveal_step[k, keep] != NOT_SAMPLED
            canvas[e, keep] = out.canvas[k, keep]
            reveal[e, keep] = out.reveal_step[k, keep]
            logp[e, keep] = out.token_logprobs[k, keep]
            action[e, keep] = sampled
            if not done:
                canvas[e, end:end + len(obs)] = torch.tensor(obs, dtype=torch.long, device=device)
                observation[e, end:end + len(obs)] = True
                start[e] = end + len(obs)
                still.append(e)
        active, turn = still, turn + 1
    return _trajectories(examples, owners, envs, final, turns, G, prompt_ids, prompt_mask, canvas, action,
                         observation, mean_nfe(row_nfe), int(row_nfe.sum()), reveal_step=reveal, token_logprobs=logp,
                         row_nfe=row_nfe.to(device))
