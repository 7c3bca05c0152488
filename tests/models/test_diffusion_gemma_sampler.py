"""DiffusionGemma (transformers' ``DiffusionGemmaForBlockDiffusion``): the tiny offline model, detection and native
loading, the forward pieces, and dlmrl's sampler token-identical to ``model.generate`` for the same seed (batches,
left padding, canvas lengths, step counts, entropy bounds, temperature schedules, early stopping on and off, EOS
inside a canvas, several canvases, bfloat16), with its records checked against the model's logits caught by a
forward hook (log-probs, entropies, the entropy-bound acceptance recomputed by hand, temperatures, argmax)."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

from dlmrl.models.diffusion_gemma import (
    build_tiny_diffusion_gemma,
    canvas_attention_masks,
    canvas_logits,
    encode,
    is_diffusion_gemma,
    load_diffusion_gemma,
    new_cache,
    position_ids,
)
from dlmrl.models.uniform_sampler import entropy_bound_accept, resolve_settings, sample_diffusion_gemma
from tests.tolerances import rounding_tol

VOCAB = 128
PROMPT = 6
LEFT_PAD = (0, 2, 1, 3, 0)  # five rows, four of them left-padded differently


def _prompts(seed: int = 123, rows: int = len(LEFT_PAD)) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, PROMPT)`` ids in ``[3, V - 3)`` (clear of the special and image ids), left padding with pad id 0."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB - 3, (rows, PROMPT), generator=g)
    mask = torch.ones_like(ids)
    for row, pad in enumerate(LEFT_PAD[:rows]):
        ids[row, :pad] = 0
        mask[row, :pad] = 0
    return ids, mask


def _with_eos_bias(model, scale: float):
    """A copy whose EOS row of the tied embedding / output head is ``scale`` times longer, so that EOS wins the
    argmax at some positions (its logit ``h·e_eos`` spreads ``scale`` times wider)."""
    biased = copy.deepcopy(model)
    with torch.no_grad():
        biased.model.decoder.embed_tokens.weight[1] *= scale
    return biased


@pytest.fixture(scope="module")
def models():
    base = build_tiny_diffusion_gemma(seed=0)
    return {
        "c8": base,
        "c4": build_tiny_diffusion_gemma(seed=1, canvas_length=4),
        "eos": _with_eos_bias(base, 2.0),  # EOS lands inside canvases, rows finish at different canvases
        "eos_all": _with_eos_bias(base, 3.0),  # every row finishes before the token budget is used up
        "bf16": build_tiny_diffusion_gemma(seed=2, dtype=torch.bfloat16),
    }


def _generate_kwargs(settings: dict) -> dict:
    """``generate``'s spelling: the entropy bound only through ``sampler_config`` (``generate`` hands an unknown
    keyword such as ``entropy_bound`` to the model's forward, which ignores it)."""
    kwargs = dict(settings)
    if "entropy_bound" in kwargs:
        kwargs["sampler_config"] = EntropyBoundSamplerConfig(entropy_bound=float(kwargs.pop("entropy_bound")))
    return kwargs


def _both(model, settings: dict, seed: int, **extra):
    ids, mask = _prompts()
    torch.manual_seed(seed)
    ref = model.generate(ids, attention_mask=mask, **_generate_kwargs(settings))
    torch.manual_seed(seed)
    out = sample_diffusion_gemma(model, ids, mask, **settings, **extra)
    return ref, out


def _stopped_early(out) -> bool:
    """Some row stopped before the step budget while another row went on (the frozen-row branch ran)."""
    for c in out.canvases:
        steps = c.steps_per_row()[~c.finished_before]
        if steps.numel() and steps.min() < out.settings.max_denoising_steps and steps.min() < steps.max():
            return True
    return False


def _eos_mid_canvas_and_continue(out) -> bool:
    """Some row put EOS before its canvas's last position and some row went on to a later canvas."""
    length = out.settings.canvas_length
    eos = out.completions == 1
    mid = any(bool(eos[:, c * length:(c + 1) * length - 1].any()) for c in range(len(out.canvases)))
    finished_then_padded = any(bool(c.finished_before.any() & ~c.finished_before.all()) for c in out.canvases)
    return mid and finished_then_padded


#: (id, model, settings, witness): each case also checks that what it is named for happened.
CASES = [
    ("defaults-2-canvases", "c8", {}, lambda out: len(out.canvases) == 2),
    ("gamma0.1-3-canvases", "c8", {"entropy_bound": 0.1, "max_new_tokens": 24}, lambda out: len(out.canvases) == 3),
    ("gamma0.5-canvas4-4-canvases", "c4", {"entropy_bound": 0.5, "max_new_tokens": 14},
     lambda out: len(out.canvases) == 4),
    ("3-steps-t1.5-to-0.1", "c8", {"max_denoising_steps": 3, "t_min": 0.1, "t_max": 1.5, "max_new_tokens": 20},
     lambda out: [c.num_steps for c in out.canvases] == [3, 3, 3]),
    ("1-step", "c4", {"max_denoising_steps": 1, "max_new_tokens": 12},
     lambda out: [c.num_steps for c in out.canvases] == [1, 1, 1]),
    ("early-stop-stable-and-confident", "c8",
     {"max_denoising_steps": 12, "confidence_threshold": 1.0, "max_new_tokens": 24}, _stopped_early),
    ("early-stop-stability-2", "c4",
     {"max_denoising_steps": 10, "stability_threshold": 2, "confidence_threshold": 1.5, "t_min": 0.2}, _stopped_early),
    ("early-stop-off", "c8", {"stability_threshold": None, "max_denoising_steps": 6, "max_new_tokens": 24},
     lambda out: all(c.num_steps == 6 and bool(c.active[:, ~c.finished_before].all()) for c in out.canvases)),
    ("eos-inside-canvas", "eos", {"max_new_tokens": 24}, _eos_mid_canvas_and_continue),
    ("eos-every-row-finishes", "eos_all", {"max_new_tokens": 40, "confidence_threshold": 1.0},
     lambda out: len(out.canvases) < 5 and bool((out.completions[:, -1] == 0).all())),
    ("max-length-stop", "c8", {"max_length": PROMPT + 8, "max_new_tokens": 24}, lambda out: len(out.canvases) == 1),
    ("no-eos-no-pad", "eos", {"eos_token_id": None, "pad_token_id": None, "max_new_tokens": 16},
     lambda out: len(out.canvases) == 2 and bool((out.completions == 1).any())),
    ("bfloat16", "bf16", {"max_new_tokens": 16, "confidence_threshold": 1.0, "entropy_bound": 0.3},
     lambda out: len(out.canvases) == 2),
]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(("name", "model_key", "settings", "witness"), CASES, ids=[c[0] for c in CASES])
def test_token_identical_to_generate(models, name, model_key, settings, witness, seed):
    ref, out = _both(models[model_key], settings, seed)
    assert torch.equal(out.sequences, ref.sequences), name
    assert torch.equal(out.tokens_per_forward, ref.tokens_per_forward)
    if seed == 0:  # the case's named behaviour happened (seed 1 only adds coverage)
        assert witness(out), f"{name}: the case did not exercise what it is named for"


def test_seed_and_generator_draw_the_global_stream_without_touching_it(models):
    """``seed=s`` equals ``torch.manual_seed(s)`` then ``generate``, and leaves the global RNG where it was."""
    model = models["c8"]
    ids, mask = _prompts()
    torch.manual_seed(5)
    ref = model.generate(ids, attention_mask=mask)
    torch.manual_seed(99)
    before = torch.get_rng_state()
    out = sample_diffusion_gemma(model, ids, mask, seed=5)
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(out.sequences, ref.sequences)
    again = sample_diffusion_gemma(model, ids, mask, generator=torch.Generator().manual_seed(5))
    assert torch.equal(again.sequences, ref.sequences)
    other = sample_diffusion_gemma(model, ids, mask, seed=6)
    assert not torch.equal(other.sequences, ref.sequences)


class _LogitsHook:
    """Catches the logits of every canvas pass (the encoder runs through ``model.model.encoder``, not the top
    module's forward, so only canvas passes reach this hook)."""

    def __init__(self, model):
        self.logits = []
        self.handle = model.register_forward_hook(self._catch)

    def _catch(self, module, args, output):
        self.logits.append(output.logits.detach().clone())

    def close(self):
        self.handle.remove()


def _hooked(model, settings, seed, **extra):
    ids, mask = _prompts()
    hook = _LogitsHook(model)
    try:
        out = sample_diffusion_gemma(model, ids, mask, seed=seed, **settings, **extra)
    finally:
        hook.close()
    assert len(hook.logits) == out.decoder_calls
    per_canvas, k = [], 0
    for c in out.canvases:
        per_canvas.append(hook.logits[k:k + c.num_steps])
        k += c.num_steps
    return out, per_canvas


RECORD_SETTINGS = {"max_denoising_steps": 6, "confidence_threshold": 1.0, "entropy_bound": 0.4, "max_new_tokens": 24}
#: on the EOS-biased model with seed 2: rows stop early at different steps (10 or 11 of 12) and finish at different
#: canvases, so the frozen-row and padding branches are in the records
STOPPING_SETTINGS = dict(RECORD_SETTINGS, max_denoising_steps=12)


def test_record_logprobs_entropies_and_temperatures_match_the_hooked_logits(models):
    out, logits = _hooked(models["eos"], STOPPING_SETTINGS, seed=2)
    s = out.settings
    checked = frozen_final = 0
    for c, steps in zip(out.canvases, logits):
        for k, raw in enumerate(steps):
            n = int(c.remaining[k])
            assert n == s.max_denoising_steps - k
            expected_t = s.t_min + (s.t_max - s.t_min) * n / s.max_denoising_steps
            assert abs(float(c.temperatures[k]) - expected_t) <= rounding_tol(s.t_max, 3)
            scaled = raw / c.temperatures[k]
            logp = torch.log_softmax(scaled, dim=-1)
            # log_softmax (x - max - log Σ exp(x - max)) against x - logsumexp(x): the V-term sum (relative V·eps,
            # so V·eps in log; the sum is ≥ 1) and a few subtractions at the scale of |x| + log V
            scale = float(scaled.abs().max()) + math.log(VOCAB)
            tol = rounding_tol(1.0, VOCAB) + rounding_tol(scale, 4)
            recomputed = logp.gather(-1, c.drawn[k].unsqueeze(-1)).squeeze(-1)
            assert torch.allclose(c.logprobs[k], recomputed, rtol=0, atol=tol)
            entropy = -(logp.exp() * logp).sum(-1)
            assert torch.allclose(c.entropies[k], entropy, rtol=0, atol=rounding_tol(scale, VOCAB + 8))
            checked += 1
        # the appended canvas is the argmax of each row's last active step's scaled logits, with its log-prob
        for row in range(c.final_canvas.shape[0]):
            if c.finished_before[row]:
                continue
            last = int(c.active[:, row].nonzero().max())
            frozen_final += last < c.num_steps - 1
            scaled = steps[last][row] / c.temperatures[last]
            assert torch.equal(c.final_canvas[row], scaled.argmax(-1))
            expected = torch.log_softmax(scaled, -1).gather(-1, c.final_canvas[row].unsqueeze(-1)).squeeze(-1)
            scale = float(scaled.abs().max()) + math.log(VOCAB)
            assert torch.allclose(c.final_logprobs[row], expected, rtol=0,
                                  atol=rounding_tol(1.0, VOCAB) + rounding_tol(scale, 4))
    assert checked >= 12 and frozen_final > 0


def test_accepted_masks_follow_the_entropy_bound_rule_by_hand(models):
    """Per row and step: the accepted positions are a prefix of the positions sorted by entropy, with
    Σ H − max H ≤ γ, and one more would break it (arXiv 2505.24857's bound, as ``EntropyBoundSampler`` applies it)."""
    out, _ = _hooked(models["c8"], RECORD_SETTINGS, seed=4)
    gamma = out.settings.entropy_bound
    sizes = set()
    for c in out.canvases:
        for k in range(c.num_steps):
            for row in range(c.accepted.shape[1]):
                h = c.entropies[k, row].double().tolist()
                accepted = c.accepted[k, row].tolist()
                order = sorted(range(len(h)), key=lambda i: h[i])
                count = sum(accepted)
                assert all(accepted[i] for i in order[:count]), "not a prefix of the entropy order"
                tol = rounding_tol(sum(h), len(h))
                prefix = [h[i] for i in order[:count]]
                assert sum(prefix) - max(prefix) <= gamma + tol
                if count < len(h):
                    longer = prefix + [h[order[count]]]
                    assert sum(longer) - max(longer) > gamma - tol
                sizes.add(count)
    assert len(sizes) >= 3, f"acceptance sizes {sizes}: the bound never discriminated"
    assert torch.equal(entropy_bound_accept(out.canvases[0].entropies[0], gamma), out.canvases[0].accepted[0])


def test_records_chain_the_canvases(models):
    """The next step's input keeps the accepted draws; a stopped row's canvas is frozen; the forward counts add up;
    the appended canvas is in ``sequences`` (up to EOS padding)."""
    out, _ = _hooked(models["eos"], STOPPING_SETTINGS, seed=2)
    P = out.prompt_length
    frozen = carried = 0
    for c in out.canvases:
        for k in range(c.num_steps - 1):
            for row in range(c.accepted.shape[1]):
                if k > 0 and c.stopped[k - 1, row]:  # stopped before step k: step k leaves its canvas as it was
                    assert torch.equal(c.input_canvases[k + 1, row], c.input_canvases[k, row])
                    frozen += 1
                else:
                    a = c.accepted[k, row]
                    assert torch.equal(c.input_canvases[k + 1, row][a], c.drawn[k, row][a])
                    carried += 1
        appended = out.sequences[:, c.start:c.start + out.settings.canvas_length]
        same = (appended == c.final_canvas) | (appended == out.settings.pad_token_id)
        assert bool(same.all())
        assert c.start >= P
    assert frozen and carried
    total = sum(c.steps_per_row() for c in out.canvases)
    assert torch.equal(total.to(out.decoder_forward_passes.dtype), out.decoder_forward_passes)
    assert out.accepted_logprob_sum().shape == (len(LEFT_PAD),)
    assert bool((out.accepted_logprob_sum() <= 0).all())


def test_draw_last_step_appends_the_last_draw(models):
    """dlmrl's RL mode: same draws as generate up to the append, then the last step's draw instead of the argmax."""
    model = models["c8"]
    settings = dict(RECORD_SETTINGS, max_new_tokens=16)
    argmax = sample_diffusion_gemma(model, *_prompts(), seed=8, **settings)
    drawn = sample_diffusion_gemma(model, *_prompts(), seed=8, draw_last_step=True, **settings)
    first_a, first_d = argmax.canvases[0], drawn.canvases[0]
    for field in ("input_canvases", "drawn", "accepted", "logprobs", "active"):
        assert torch.equal(getattr(first_a, field), getattr(first_d, field)), field
    for c in drawn.canvases:
        assert c.final_is_draw
        for row in range(c.final_canvas.shape[0]):
            last = int(c.active[:, row].nonzero().max()) if c.active[:, row].any() else None
            if last is None:
                continue
            assert torch.equal(c.final_canvas[row], c.drawn[last, row])
            assert torch.equal(c.final_logprobs[row], c.logprobs[last, row])
    assert not torch.equal(first_a.final_canvas, first_d.final_canvas), "draw == argmax: the mode was not exercised"
    P, L = drawn.prompt_length, drawn.settings.canvas_length
    assert torch.equal(drawn.sequences[:, P:P + L], first_d.final_canvas)  # no EOS in this case


def test_records_hold_no_vocabulary_sized_tensor():
    """The record's size is set by steps × rows × canvas, not by the vocabulary (262k for the real model)."""
    settings = {"stability_threshold": None, "eos_token_id": None, "max_new_tokens": 16, "max_denoising_steps": 4}
    sizes = []
    for vocab in (128, 1024):
        model = build_tiny_diffusion_gemma(seed=0, vocab_size=vocab)
        ids, mask = _prompts()
        out = sample_diffusion_gemma(model, ids, mask, seed=0, **settings)
        sizes.append(out.record_bytes())
    assert sizes[0] == sizes[1]
    rows, canvas, steps = len(LEFT_PAD), 8, 4
    assert sizes[0] < 2 * steps * rows * canvas * 64  # a few scalars per (canvas, step, row, position)


def test_forward_pieces_equal_the_models_own_call(models):
    """``encode`` + ``canvas_logits`` give the logits of one ``model(input_ids=..., decoder_input_ids=...)`` call."""
    from transformers import DynamicCache

    model = models["c8"]
    ids, _ = _prompts(rows=3)
    ids[ids == 0] = 5  # unpadded, so both paths attend everywhere
    canvas = torch.randint(0, VOCAB, (3, 8), generator=torch.Generator().manual_seed(0))
    full = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        ref = model(input_ids=ids, decoder_input_ids=canvas,
                    cache=DynamicCache(config=model.config.get_text_config(decoder=True))).logits
        cache = new_cache(model)
        encode(model, ids, full, cache, position_ids(0, PROMPT, "cpu"))
        masks = canvas_attention_masks(model, canvas, cache, torch.nn.functional.pad(full, (0, 8), value=True))
        mine = canvas_logits(model, canvas, cache, masks, position_ids(PROMPT, 8, "cpu"))
    assert mine.dtype == torch.float32 and mine.shape == (3, 8, VOCAB)
    assert torch.equal(mine, ref)


def test_tiny_model_shape_and_size():
    model = build_tiny_diffusion_gemma(seed=0)
    text = model.config.text_config
    assert (text.num_hidden_layers, text.hidden_size, text.num_experts) == (2, 64, 4)
    assert model.config.canvas_length == 8 and text.vocab_size == VOCAB
    assert sum(p.numel() for p in model.parameters()) == 161_880
    assert not model.training
    with pytest.raises(ValueError, match="vocab_size"):
        build_tiny_diffusion_gemma(vocab_size=4)


def test_detection():
    assert is_diffusion_gemma({"model_type": "diffusion_gemma"})
    assert is_diffusion_gemma({"architectures": ["DiffusionGemmaForBlockDiffusion"]})
    assert not is_diffusion_gemma({"model_type": "diffusion_gemma_text"})
    assert not is_diffusion_gemma({"model_type": "gemma3", "architectures": ["DiffusionGemmaForBlockDiffusion"]})
    assert not is_diffusion_gemma({"model_type": "llama"})
    assert is_diffusion_gemma(build_tiny_diffusion_gemma(seed=0).config)


def test_native_load_round_trip(tmp_path, models):
    model = models["c8"]
    model.save_pretrained(tmp_path / "dg")
    config = json.loads((tmp_path / "dg" / "config.json").read_text())
    assert is_diffusion_gemma(config) and "auto_map" not in config
    loaded = load_diffusion_gemma(str(tmp_path / "dg"), "float32")
    assert type(loaded) is type(model) and loaded.dtype == torch.float32
    state, other = model.state_dict(), loaded.state_dict()
    assert all(torch.equal(state[k], other[k]) for k in state)
    assert loaded.generation_config.sampler_config.entropy_bound == model.generation_config.sampler_config.entropy_bound
    ids, mask = _prompts()
    a = sample_diffusion_gemma(model, ids, mask, seed=2)
    b = sample_diffusion_gemma(loaded, ids, mask, seed=2)
    assert torch.equal(a.sequences, b.sequences)

    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="'llama'"):
        load_diffusion_gemma(str(tmp_path / "llama"))
    with pytest.raises(ValueError, match="dtype"):
        load_diffusion_gemma(str(tmp_path / "dg"), "float13")


def test_settings_resolution_and_errors(models):
    model = models["c8"]
    s = resolve_settings(model, PROMPT)
    assert (s.max_new_tokens, s.max_denoising_steps, s.entropy_bound) == (16, 8, 1.0)  # the tiny generation config
    assert (s.t_min, s.t_max, s.stability_threshold, s.confidence_threshold) == (0.4, 0.8, 1, 0.005)
    assert not resolve_settings(model, PROMPT, stability_threshold=None).early_stopping
    assert resolve_settings(model, PROMPT, max_length=PROMPT + 40, max_new_tokens=256).max_new_tokens == 40
    ids, mask = _prompts()
    with pytest.raises(ValueError, match="entropy_bnd"):
        sample_diffusion_gemma(model, ids, mask, entropy_bnd=0.2)
    with pytest.raises(ValueError, match="seed or generator"):
        sample_diffusion_gemma(model, ids, mask, seed=1, generator=torch.Generator())
    with pytest.raises(ValueError, match="entropy_bound or sampler_config"):
        sample_diffusion_gemma(model, ids, mask, entropy_bound=0.2,
                               sampler_config=EntropyBoundSamplerConfig(entropy_bound=0.2))
    with pytest.raises(ValueError, match="cache_implementation"):
        sample_diffusion_gemma(model, ids, mask, cache_implementation="static")
    with pytest.raises(ValueError, match="attention_mask"):
        sample_diffusion_gemma(model, ids, mask[:, 1:])
    with pytest.raises(ValueError, match="t_max"):
        sample_diffusion_gemma(model, ids, mask, t_min=0.9, t_max=0.5)
    with pytest.raises(ValueError, match="stability_threshold"):
        sample_diffusion_gemma(model, ids, mask, stability_threshold=-1)
    with pytest.raises(ValueError, match="confidence_threshold"):
        sample_diffusion_gemma(model, ids, mask, confidence_threshold=1)  # an int, as transformers refuses it
    with pytest.raises(TypeError, match="DiffusionGemmaForBlockDiffusion"):
        sample_diffusion_gemma(torch.nn.Linear(2, 2), ids, mask)
