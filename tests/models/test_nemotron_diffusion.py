"""The ``nemotron_diffusion`` family (Nemotron-Labs-Diffusion on its own ``modeling_nemotron_labs_diffusion.py``) on
the offline stand-in ``tests/models/remote_code/nemotron_diffusion`` (see its README): detection, loading through
``auto_map`` + ``trust_remote_code`` only when asked, the mask id and block size from the checkpoint, the
``dlm_paradigm`` check against ``model.kind``, greedy block decoding against the code's ``generate`` and the AR kind
against its ``ar_generate`` (their semantics re-implemented below as oracles, through the code's own calling
conventions), likelihoods against the code's own forward, and two training steps of the block and AR kinds with LoRA
and with every weight."""

from __future__ import annotations

import json
import math
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from datasets import Dataset

from dlmrl import Trainer
from dlmrl.models.ar import load_ar_policy
from dlmrl.models.families import FAMILIES, detect_family
from dlmrl.models.loading import checkpoint_block_size, load_block_policy, load_policy
from dlmrl.models.nemotron_diffusion import (
    NEMOTRON_BLOCK_SIZE,
    NEMOTRON_MASK_TOKEN_ID,
    adapt_model,
    check_explicit_mask,
)
from tests.models.block_helpers import ATOL
from tests.models.checkpoints import (
    ALPHABET,
    REMOTE_CODE,
    build_remote_model,
    char_tokenizer,
    isolated_remote_code,
)

BLOCK = 4
MASK = 3  # (the stand-in's <mask>; the released configs' mask_token_id is 100)
PROMPTS = ["12+3=", "1234+56=", "7="]  # left-padded by 3, 0 and 6
CONFIG = {
    "model_type": "nemotron_labs_diffusion",
    "architectures": ["NemotronLabsDiffusionModel"],
    "auto_map": {"AutoConfig": "configuration_nemotron_labs_diffusion.NemotronLabsDiffusionConfig",
                 "AutoModel": "modeling_nemotron_labs_diffusion.NemotronLabsDiffusionModel"},
    "vocab_size": 128,  # (above the family's default mask id 100)
    "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 8, "rms_norm_eps": 1e-5, "max_position_embeddings": 512,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "llama_4_scaling_beta": 0.1,
                        "original_max_position_embeddings": 16384},
    "initializer_range": 0.5,  # (0.02 in the release; larger so that the random model's predictions are not uniform)
    "attention_dropout": 0.0, "dlm_paradigm": "bidirectional", "block_size": BLOCK, "mask_token_id": MASK,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "tie_word_embeddings": False,
}


def save_nemotron_like(path: Path, **changes) -> Path:
    """A tiny Nemotron-Labs-Diffusion-like checkpoint (``AutoModel``): :data:`CONFIG` with ``changes`` (a value
    ``None`` drops the key), the stand-in's code, a character tokenizer as wide as the head without a mask token
    (filler tokens ``<t0>``... between the specials and the characters), random weights."""
    config = {k: v for k, v in {**CONFIG, **changes}.items() if v is not None}
    path.mkdir(parents=True, exist_ok=True)
    for source in (REMOTE_CODE / "nemotron_diffusion").glob("*.py"):
        shutil.copy(source, path / source.name)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    fillers = [f"<t{i}>" for i in range(config["vocab_size"] - 5 - len(ALPHABET))]  # (a tokenizer as wide as the head)
    char_tokenizer(["<pad>", "<s>", "</s>", "<mask>", "<unk>", *fillers], bos_token="<s>", eos_token="</s>",
                   pad_token="<pad>", unk_token="<unk>").save_pretrained(path)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build_remote_model(path, "AutoModel").save_pretrained(path, safe_serialization=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


def _copy_with(path: Path, dest: Path, **changes) -> Path:
    shutil.copytree(path, dest)
    config = json.loads((dest / "config.json").read_text())
    config.update(changes)
    (dest / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    return dest


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("nemotron")
    with isolated_remote_code(root / "hf_modules"):
        yield root


@pytest.fixture(scope="module")
def nemotron_path(root):
    return save_nemotron_like(root / "nemotron")


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (transformers' deprecations; dlmrl's paradigm notes)
        return fn(*args, **kwargs)


@pytest.fixture(scope="module")
def block(nemotron_path):
    policy = _quiet(load_block_policy, str(nemotron_path), trust_remote_code=True)
    assert not policy.model.training
    return policy


@pytest.fixture(scope="module")
def ar(nemotron_path):
    return _quiet(load_ar_policy, str(nemotron_path), trust_remote_code=True)


def _encode(policy, texts):
    enc = policy.tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"].bool()


def _tokens(shape, seed):
    """Random tokens (ids >= 5: no special token, so no mask token)."""
    return torch.randint(5, CONFIG["vocab_size"], shape, generator=torch.Generator().manual_seed(seed))


def _diffusion_mode(model, on: bool):
    for layer in model.encoder.layers:
        layer.self_attn.diffusion_lm = on


# ------------------------------------------------------------------------------------ detection and loading


def test_both_classes_are_detected_and_a_plain_ministral_is_not():
    assert detect_family(CONFIG) == "nemotron_diffusion"
    assert detect_family({"auto_map": CONFIG["auto_map"]}) == "nemotron_diffusion"
    assert detect_family({"architectures": ["MinistralDiffEncoderModel"]}) == "nemotron_diffusion"
    assert detect_family({"auto_map": {"AutoModel": "modeling_ministral_dlm.MinistralDiffEncoderModel"}}) \
        == "nemotron_diffusion"
    with pytest.raises(ValueError, match="cannot detect"):  # (the AR model it starts from)
        detect_family({"model_type": "ministral3", "architectures": ["Ministral3ForCausalLM"]})
    fam = FAMILIES.get("nemotron_diffusion")
    assert fam.default_block_size == NEMOTRON_BLOCK_SIZE == 32 and fam.default_mask_token_id == NEMOTRON_MASK_TOKEN_ID


def test_the_code_runs_only_when_trusted(nemotron_path):
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_block_policy(str(nemotron_path))
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_ar_policy(str(nemotron_path))


def test_mask_id_and_block_size_come_from_the_checkpoint(nemotron_path, block, root):
    assert block.family == "nemotron_diffusion" and block.kind == "block" and not block.prompt_blocks
    assert block.clean_context == "causal" and block.logit_shift == 0  # (generate's default causal_context=True)
    assert block.mask_token_id == MASK and block.block_size == BLOCK
    assert checkpoint_block_size(str(nemotron_path)) == BLOCK
    assert type(block.model).__name__ == "NemotronLabsDiffusionModel"
    assert type(block.model).__module__.startswith("transformers_modules")
    bare = _copy_with(nemotron_path, root / "bare", mask_token_id=None, block_size=None)
    assert checkpoint_block_size(str(bare)) == NEMOTRON_BLOCK_SIZE
    policy = _quiet(load_policy, str(bare), trust_remote_code=True)
    assert policy.mask_token_id == NEMOTRON_MASK_TOKEN_ID == 100


def test_the_stand_in_breaks_on_transformers_5_without_the_mask_keyword_patch(nemotron_path):
    """The code's causal path (``ar_generate``'s) calls ``create_causal_mask`` with 4.5x keywords: a ``TypeError`` on
    the unpatched module, fine after :func:`~dlmrl.models.nemotron_diffusion.patch_mask_keywords`."""
    import sys

    from dlmrl.models.compat import load_checkpoint_model

    model = _quiet(load_checkpoint_model, str(nemotron_path), True, torch.float32, "AutoModel")
    module = sys.modules[type(model.encoder).__module__]
    _diffusion_mode(model, False)
    original = module.create_causal_mask
    if getattr(original, "_dlmrl_translates", False):  # (patched by an earlier load in this process)
        module.create_causal_mask = original.__kwdefaults__["_fn"]
    try:
        with pytest.raises(TypeError, match="input_embeds"):
            model(input_ids=_tokens((1, 5), 0))
    finally:
        module.create_causal_mask = original
    adapt_model(model)
    assert model(input_ids=_tokens((1, 5), 0)).logits.shape == (1, 5, CONFIG["vocab_size"])


# ------------------------------------------------------------------------------------ the paradigm check


def _validate(path, kind, *extra):
    from dlmrl.config import Config, apply_overrides, validate

    cfg = Config()
    apply_overrides(cfg, [f"model.name_or_path={path}", f"model.kind={kind}", "model.trust_remote_code=true",
                          "task.answer_mode=text", "sampling.gen_length=8", "sampling.steps=8", *extra])
    validate(cfg, for_training=False)
    return cfg


@pytest.mark.parametrize("kind", ["block", "diffusion"])
def test_a_diffusion_kind_on_an_autoregressive_declaration_is_refused_naming_the_key(nemotron_path, root, kind):
    from dlmrl.config import ConfigError

    path = root / f"declared_ar_{kind}"
    if not path.exists():
        _copy_with(nemotron_path, path, dlm_paradigm="autoregressive")
    extra = ["sampling.block_length=8"] if kind == "diffusion" else []
    with pytest.raises(ConfigError, match=r"model\.kind.*dlm_paradigm 'autoregressive'.*set dlm_paradigm to "
                                          r"'bidirectional'.*set model.kind ar") as err:
        _validate(path, kind, *extra)
    assert str(path / "config.json") in str(err.value)
    with pytest.raises(ValueError, match="dlm_paradigm 'autoregressive'"):  # (the load refuses it too: hub ids)
        _quiet(load_block_policy, str(path), trust_remote_code=True)
    # not vacuous: the code really builds causal attention for that declaration
    from dlmrl.models.compat import load_checkpoint_model

    model = adapt_model(_quiet(load_checkpoint_model, str(path), True, torch.float32, "AutoModel"))
    ids = _tokens((1, 6), 1)
    other = ids.clone()
    other[0, -1] += 1
    assert torch.equal(model(input_ids=ids).logits[:, :-1], model(input_ids=other).logits[:, :-1])


@pytest.mark.parametrize("kind", ["block", "ar"])
def test_an_unknown_paradigm_is_refused_for_every_kind(nemotron_path, root, kind):
    from dlmrl.config import ConfigError

    path = root / f"unknown_{kind}"
    _copy_with(nemotron_path, path, dlm_paradigm="sbd_block_diff")
    with pytest.raises(ConfigError, match="dlm_paradigm 'sbd_block_diff'.*does not know") as err:
        _validate(path, kind)
    assert "set dlm_paradigm in that file" in str(err.value)  # (the key named, not a template's braces)


def test_the_ar_kind_on_a_bidirectional_declaration_is_explained_and_runs_causally(nemotron_path, ar):
    with pytest.warns(UserWarning, match="dlm_paradigm 'bidirectional'.*causal mask"):
        _validate(nemotron_path, "ar")
    # the code's own forward attends both ways; the AR kind's does not
    ids = _tokens((1, 6), 2)
    other = ids.clone()
    other[0, -1] += 1
    model = ar.model
    own = lambda x: type(model).forward(model, input_ids=x).logits[:, :-1]
    assert not torch.equal(own(ids), own(other))
    assert torch.equal(model(input_ids=ids).logits[:, :-1], model(input_ids=other).logits[:, :-1])


def test_an_autoregressive_declaration_runs_the_ar_kind_without_a_note(nemotron_path, root):
    path = _copy_with(nemotron_path, root / "declared_ar_for_ar", dlm_paradigm="autoregressive")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*dlm_paradigm")
        _validate(path, "ar")


def test_block_diff_loads_the_same_weights_with_the_mask_taking_class(nemotron_path, root, block):
    """``block_diff`` would build the flex class (its own mask, which ignores dlmrl's: the probe refuses it); dlmrl
    builds the ``bidirectional`` class, keeps the declared value in the config, and gets the same logits."""
    from dlmrl.models.compat import load_checkpoint_model

    path = _copy_with(nemotron_path, root / "block_diff", dlm_paradigm="block_diff")
    with pytest.warns(UserWarning, match="dlm_paradigm 'block_diff'.*flex attention"):
        _validate(path, "block")
    policy = _quiet(load_block_policy, str(path), trust_remote_code=True)
    assert policy.model.config.dlm_paradigm == "block_diff"
    assert type(policy.model.encoder.layers[0].self_attn).__name__ == "Ministral3Attention"
    ids, pm = _encode(policy, PROMPTS)
    canvas = _tokens((3, 8), 3)
    torch.testing.assert_close(policy.completion_logits(ids, pm, canvas), block.completion_logits(ids, pm, canvas),
                               atol=0, rtol=0)
    flex = adapt_model(_quiet(load_checkpoint_model, str(path), True, torch.float32, "AutoModel"))
    assert type(flex.encoder.layers[0].self_attn).__name__ == "NemotronLabsDiffusionFlexAttention"
    with pytest.raises(ValueError, match="does not follow an explicit mask"):
        check_explicit_mask(flex, "flex")


# ------------------------------------------------------------------------------------ oracles: the code's decoders


def nemotron_generate(model, prompt: torch.Tensor, gen_length: int, block_length: int, mask_id: int) -> torch.Tensor:
    """Test oracle: ``NemotronLabsDiffusionModel.generate(prompt, max_new_tokens=gen_length, block_length,
    threshold=None, causal_context=False, temperature=0)`` re-implemented from its semantics through the code's own
    calls: one prompt ``(1, P)`` prefilled with ``model(prompt, use_cache=True, use_causal_mask=False)``; per block,
    ``block_length`` masks appended and ``block_length`` steps (``_get_num_transfer_tokens``: one token per step) of
    ``model(block, past_key_values=cache, use_cache=False)``, the argmax and its softmax probability, the most
    confident masked position revealed (``_get_transfer_index``); then ``model(block, past_key_values=cache,
    use_cache=True)`` extends the cache. Its EOS stop is left out (``generate`` returns the prefix of this output up to
    the first EOS)."""
    out = model(prompt, use_cache=True, use_causal_mask=False)
    cache = out.past_key_values
    x = prompt.clone()
    for _ in range(gen_length // block_length):
        blk = torch.full((1, block_length), mask_id, dtype=torch.long)
        for _step in range(block_length):
            active = blk[0] == mask_id
            if not active.any():
                break
            logits = model(blk, past_key_values=cache, use_cache=False).logits[0]
            x0 = logits.argmax(-1)
            conf = torch.where(active, torch.softmax(logits.float(), -1).gather(-1, x0[:, None])[:, 0], -math.inf)
            pick = conf.argmax()
            blk[0, pick] = x0[pick]
        cache = model(blk, past_key_values=cache, use_cache=True, use_causal_mask=False).past_key_values
        x = torch.cat([x, blk], 1)
    return x[0, prompt.shape[1]:]


def nemotron_ar_generate(model, prompt: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """Test oracle: ``ar_generate(prompt, max_new_tokens, temperature=0)`` re-implemented from its semantics: every
    attention layer switched to ``diffusion_lm=False`` (the code's causal path), the encoder called directly with an
    explicit ``DynamicCache``, ``cache_position`` and ``position_ids``, the head on the last hidden state, argmax; its
    EOS stop left out. The layers are switched back after (``ar_generate`` leaves them causal)."""
    from transformers import DynamicCache

    p = prompt.shape[1]
    _diffusion_mode(model, False)
    try:
        out = model.encoder(input_ids=prompt, position_ids=torch.arange(p)[None], past_key_values=DynamicCache(),
                            use_cache=True, cache_position=torch.arange(p))
        tokens = []
        for step in range(max_new_tokens):
            token = model.diffusion_head(out.last_hidden_state[:, -1]).argmax(-1, keepdim=True)
            tokens.append(token)
            pos = torch.tensor([p + step])
            out = model.encoder(input_ids=token, position_ids=pos[None], past_key_values=out.past_key_values,
                                use_cache=True, cache_position=pos)
    finally:
        _diffusion_mode(model, True)
    return torch.cat(tokens, 1)[0]


def _block_context(policy):
    """The policy with ``clean_context="block"``: ``generate(causal_context=False)``'s layout."""
    import dataclasses

    return dataclasses.replace(policy, clean_context="block")


@pytest.mark.parametrize("gen_length", [8, 12])
@torch.no_grad()
def test_greedy_block_decoding_equals_the_codes_generate(block, gen_length):
    ids, pm = _encode(block, PROMPTS)
    ours = _block_context(block).sample_blocks(ids, pm, gen_length=gen_length, steps=gen_length, temperature=0.0)
    for row in range(ids.shape[0]):
        prompt = ids[row:row + 1, pm[row]]
        theirs = nemotron_generate(block.model, prompt, gen_length, BLOCK, block.mask_token_id)
        assert torch.equal(ours.canvas[row], theirs), (row, ours.canvas[row], theirs)
    assert len(set(map(tuple, ours.canvas.tolist()))) == 3  # (not vacuous: the rows differ)


@torch.no_grad()
def test_ar_greedy_decoding_equals_the_codes_ar_generate(ar):
    ids, pm = _encode(ar, PROMPTS)
    ours = ar.generate(ids, pm, max_new_tokens=6, temperature=0.0)
    for row in range(ids.shape[0]):
        prompt = ids[row:row + 1, pm[row]]
        theirs = nemotron_ar_generate(ar.model, prompt, 6)
        n = int(ours.completion_mask[row].sum())  # (up to its first stop token)
        assert n >= 1 and torch.equal(ours.completion[row, :n], theirs[:n]), (row, ours.completion[row], theirs)


# ------------------------------------------------------------------------------------ likelihoods vs the code's forward


@torch.no_grad()
def test_the_composite_pass_equals_the_codes_cached_calls(block):
    """Block ``b``'s noisy logits of dlmrl's composite pass equal the code's own call of that block against a cache of
    the prompt and the clean blocks before it (``generate``'s calls), per unpadded row."""
    ids, pm = _encode(block, PROMPTS)
    length = 9  # (the last block has 1 token)
    clean = _tokens((3, length), 4)
    noisy = clean.masked_fill(torch.rand(3, length, generator=torch.Generator().manual_seed(5)) < 0.5, MASK)
    ours = _block_context(block).completion_logits(ids, pm, noisy, clean=clean)
    model = block.model
    for row in range(3):
        cache = model(ids[row:row + 1, pm[row]], use_cache=True).past_key_values
        for lo in range(0, length, BLOCK):
            hi = min(lo + BLOCK, length)
            theirs = model(noisy[row:row + 1, lo:hi], past_key_values=cache, use_cache=False).logits[0].float()
            torch.testing.assert_close(ours[row, lo:hi], theirs, atol=ATOL, rtol=0)
            cache = model(clean[row:row + 1, lo:hi], past_key_values=cache, use_cache=True).past_key_values


@torch.no_grad()
def test_full_diffusion_logits_equal_the_codes_bidirectional_forward(nemotron_path):
    """``model.kind: diffusion`` (full attention, :func:`~dlmrl.models.nemotron_diffusion.nemotron_logits`): an
    unpadded row's logits are the code's own forward's (no mask: it attends both ways); a left-padded row's are those of
    the row without its padding."""
    policy = _quiet(load_policy, str(nemotron_path), trust_remote_code=True)
    ids, pm = _encode(policy, PROMPTS)
    canvas = _tokens((3, 6), 10)
    canvas[:, ::2] = MASK
    seq = torch.cat([ids, canvas], 1)
    mask = torch.cat([pm, torch.ones_like(canvas, dtype=torch.bool)], 1)
    ours = policy(seq, mask)
    for row in range(3):
        theirs = policy.model(seq[row:row + 1, mask[row]]).logits[0].float()
        torch.testing.assert_close(ours[row, mask[row]], theirs, atol=ATOL, rtol=0)


@torch.no_grad()
def test_ar_token_logprobs_equal_the_codes_causal_forward(ar):
    ids, pm = _encode(ar, PROMPTS)
    completion = _tokens((3, 5), 6)
    cmask = torch.ones_like(completion, dtype=torch.bool)
    logp, _ = ar.token_logprobs(ids, pm, completion, cmask)
    model = ar.model
    _diffusion_mode(model, False)
    try:
        for row in range(3):
            seq = torch.cat([ids[row, pm[row]], completion[row]])[None]
            logits = type(model).forward(model, input_ids=seq).logits[0, -6:-1].float()
            theirs = torch.log_softmax(logits, -1).gather(-1, completion[row, :, None])[:, 0]
            torch.testing.assert_close(logp[row], theirs, atol=ATOL, rtol=0)
    finally:
        _diffusion_mode(model, True)


# ------------------------------------------------------------------------------------ causal_context=True (the default)


def _causal_call(model, ids, cache=None):
    """The code's cache pass of ``generate(causal_context=True)``: the layers switched to ``diffusion_lm=False``,
    ``model(ids, past_key_values=cache, use_cache=True, use_causal_mask=True)``, switched back."""
    _diffusion_mode(model, False)
    try:
        return model(ids, past_key_values=cache, use_cache=True, use_causal_mask=True)
    finally:
        _diffusion_mode(model, True)


def nemotron_generate_causal(model, prompt: torch.Tensor, gen_length: int, block_length: int,
                             mask_id: int) -> torch.Tensor:
    """Test oracle: ``NemotronLabsDiffusionModel.generate(prompt, max_new_tokens=gen_length, block_length,
    threshold=None, causal_context=True, temperature=0)`` re-implemented from its semantics through the code's own
    calls: one prompt ``(1, P)`` prefilled causally (:func:`_causal_call`), the argmax of its last logits the first
    block's first token; per block, that token then ``block_length − 1`` masks, ``_get_num_transfer_tokens`` over the
    ``block_length − 1`` masks in ``block_length`` steps (one token per step) of ``model(block, past_key_values=cache,
    use_cache=False)`` (bidirectional against the cache), the most confident masked position revealed; then the block
    cached causally and the argmax of its last logits the next block's first token. Its EOS stop and thinking budget
    are left out."""
    out = _causal_call(model, prompt)
    cache, first = out.past_key_values, out.logits[0, -1].argmax()
    blocks = []
    for _ in range(gen_length // block_length):
        blk = torch.full((1, block_length), mask_id, dtype=torch.long)
        blk[0, 0] = first
        for _step in range(block_length):
            active = blk[0] == mask_id
            if not active.any():
                break
            logits = model(blk, past_key_values=cache, use_cache=False).logits[0]
            x0 = logits.argmax(-1)
            conf = torch.where(active, torch.softmax(logits.float(), -1).gather(-1, x0[:, None])[:, 0], -math.inf)
            pick = conf.argmax()
            blk[0, pick] = x0[pick]
        out = _causal_call(model, blk, cache)
        cache, first = out.past_key_values, out.logits[0, -1].argmax()
        blocks.append(blk)
    return torch.cat(blocks, 1)[0]


@pytest.mark.parametrize("cache", [True, False])
@pytest.mark.parametrize("gen_length", [8, 12])
@torch.no_grad()
def test_greedy_causal_context_decoding_equals_the_codes_generate(block, gen_length, cache):
    ids, pm = _encode(block, PROMPTS)
    ours = block.sample_blocks(ids, pm, gen_length=gen_length, steps=gen_length, temperature=0.0, cache=cache)
    for row in range(ids.shape[0]):
        prompt = ids[row:row + 1, pm[row]]
        theirs = nemotron_generate_causal(block.model, prompt, gen_length, BLOCK, block.mask_token_id)
        assert torch.equal(ours.canvas[row], theirs), (row, ours.canvas[row], theirs)
    assert len(set(map(tuple, ours.canvas.tolist()))) == 3  # (not vacuous: the rows differ)
    other = _block_context(block).sample_blocks(ids, pm, gen_length=gen_length, steps=gen_length, temperature=0.0)
    assert not torch.equal(other.canvas, ours.canvas)  # (nor is it the block-context layout)
    assert (ours.reveal_step[:, ::BLOCK] == torch.arange(0, gen_length, BLOCK)).all()  # (a block's first token first)


def test_causal_sources_and_the_causal_composite_mask_by_hand():
    from dlmrl.models.block_attention import causal_sources, composite_mask

    pm = torch.tensor([[False, True, True]])  # (P = 3, one padding)
    assert causal_sources(pm, 5, 2).tolist() == [[2, 4, 3 + 5 + 1, 6, 3 + 5 + 3]]
    assert causal_sources(torch.zeros(1, 1, dtype=torch.bool), 2, 1).tolist() == [[1, 1 + 2]]  # (no prompt token)
    m = composite_mask(pm, 4, 2, clean_context="causal")[0, 0]  # (T = 3 + 8)
    assert m[2].tolist() == [False, True, True] + [False] * 8  # (the prompt token attends the prompt up to itself)
    assert m[1].tolist() == [False, True] + [False] * 9
    assert m[0].tolist() == [True] + [False] * 10  # (padding attends itself only)
    clean = [3 + 4 + j for j in range(4)]  # (clean i attends the real prompt and clean j <= i)
    for i in range(4):
        assert m[clean[i]].tolist() == [False, True, True] + [False] * 4 + [j <= i for j in range(4)]
    # noisy block 2 (positions 2, 3): the real prompt, clean block 1, its own block both ways
    assert m[3 + 2].tolist() == [False, True, True, False, False, True, True, True, True, False, False]
    assert torch.equal(composite_mask(pm, 4, 2, clean_context="block")[0, 0, 3:7],
                       m[3:7])  # (the noisy half as in the block layout)
    with pytest.raises(ValueError, match="clean_context"):
        composite_mask(pm, 4, 2, clean_context="token")


@torch.no_grad()
def test_the_causal_composite_pass_equals_the_codes_cached_calls(block):
    """Block ``b``'s logits of dlmrl's composite pass with the causal clean context equal the code's calls of
    ``generate(causal_context=True)``: the block against a causal cache of the prompt and the clean blocks before it,
    unshifted, and at the block's first position the last logits of the causal pass that stored the context."""
    ids, pm = _encode(block, PROMPTS)
    length = 9  # (the last block has 1 token)
    clean = _tokens((3, length), 4)
    noisy = clean.masked_fill(torch.rand(3, length, generator=torch.Generator().manual_seed(5)) < 0.5, MASK)
    ours = block.completion_logits(ids, pm, noisy, clean=clean)
    model = block.model
    for row in range(3):
        out = _causal_call(model, ids[row:row + 1, pm[row]])
        for lo in range(0, length, BLOCK):
            hi = min(lo + BLOCK, length)
            theirs = model(noisy[row:row + 1, lo:hi], past_key_values=out.past_key_values,
                           use_cache=False).logits[0].float()
            theirs[0] = out.logits[0, -1].float()
            torch.testing.assert_close(ours[row, lo:hi], theirs, atol=ATOL, rtol=0)
            out = _causal_call(model, clean[row:row + 1, lo:hi], out.past_key_values)
    block_layout = _block_context(block).completion_logits(ids, pm, noisy, clean=clean)
    assert (ours - block_layout).abs().amax() > 1e-2  # (not vacuous: the layouts differ)
    # the uncached pass (clean=None) is the composite pass with the canvas as its clean half
    torch.testing.assert_close(block.completion_logits(ids, pm, clean), block.completion_logits(ids, pm, clean, clean),
                               atol=0, rtol=0)


@pytest.mark.parametrize("threshold", [None, 0.05])
@torch.no_grad()
def test_causal_context_rollouts_are_the_same_with_and_without_the_cache(block, threshold):
    prompts = _encode(block, PROMPTS)
    outs = [block.sample_blocks(*prompts, gen_length=8, steps=8, temperature=1.0, threshold=threshold, cache=cache,
                                generator=torch.Generator().manual_seed(3)) for cache in (True, False)]
    cached, plain = outs
    assert torch.equal(cached.canvas, plain.canvas) and torch.equal(cached.reveal_step, plain.reveal_step)
    torch.testing.assert_close(cached.token_logprobs, plain.token_logprobs, atol=ATOL, rtol=0)
    assert (cached.canvas != MASK).all() and (cached.token_logprobs < 0).all()
    for lo in range(0, 8, BLOCK):  # (a block's first token is revealed alone at the block's first step)
        first = cached.reveal_step[:, lo]
        assert ((cached.reveal_step[:, lo:lo + BLOCK] > first[:, None]).sum(1) == BLOCK - 1).all()
    if threshold is not None:  # (not vacuous: some step revealed several tokens of a row at once)
        assert any(len(r.unique()) < len(r) for r in cached.reveal_step)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@torch.no_grad()
def test_the_causal_trajectory_likelihood_equals_the_sampler_and_the_codes_calls_per_step(block, temperature):
    """The block trajectory likelihood (composite passes, one per step) equals the log-probs the cached sampler
    recorded, and each step replayed through the code's own calls: the block's canvas before that step against the
    causal cache of the prompt and the finished blocks (``generate(causal_context=True)``'s calls), a block's first
    token from the last logits of the causal pass before it; ``log_softmax`` at T = 1 with the mask token excluded."""
    from dlmrl.estimators import score
    from dlmrl.estimators.block_plans import block_trajectory_plan

    ids, pm = _encode(block, PROMPTS)
    out = block.sample_blocks(ids, pm, gen_length=8, steps=8, temperature=temperature,
                              generator=torch.Generator().manual_seed(7))
    mask = torch.ones_like(out.canvas, dtype=torch.bool)
    plan = block_trajectory_plan(mask, out.reveal_step, BLOCK, 1, temperature=1.0)
    ours = score(block, ids, pm, out.canvas, mask, plan)
    torch.testing.assert_close(ours.per_token, out.token_logprobs, atol=ATOL, rtol=0)
    model = block.model
    for row in range(3):
        ctx = _causal_call(model, ids[row:row + 1, pm[row]])
        for lo in range(0, 8, BLOCK):
            hi = lo + BLOCK
            steps = out.reveal_step[row, lo:hi]
            for s in steps.unique().tolist():
                blk = out.canvas[row:row + 1, lo:hi].masked_fill(steps >= s, MASK)
                logits = model(blk, past_key_values=ctx.past_key_values, use_cache=False).logits[0].double()
                logits[0] = ctx.logits[0, -1].double()
                logits[:, MASK] = -math.inf
                logp = torch.log_softmax(logits, -1).gather(-1, out.canvas[row, lo:hi, None])[:, 0]
                now = steps == s
                torch.testing.assert_close(ours.per_token[row, lo:hi][now].double(), logp[now], atol=ATOL, rtol=0)
            ctx = _causal_call(model, out.canvas[row:row + 1, lo:hi], ctx.past_key_values)


def test_causal_context_scores_from_the_head_in_chunks_equal_the_full_logits(block):
    """``estimator.logits_chunk`` taps the output head: with the causal clean context a block's first token is scored
    at the clean output before it, the others at their noisy position (with and without the clean completion)."""
    from dlmrl.models.canvas_scores import canvas_token_logprobs

    ids, pm = _encode(block, PROMPTS)
    clean = _tokens((3, 9), 6)
    noisy = clean.masked_fill(torch.arange(9) % 2 == 0, MASK)
    scored = noisy == MASK
    for given in (clean, None):
        full, _ = canvas_token_logprobs(block, ids, pm, noisy, clean, scored, clean=given)
        chunked, _ = canvas_token_logprobs(block, ids, pm, noisy, clean, scored, clean=given, logits_chunk=3)
        torch.testing.assert_close(chunked, full, atol=ATOL, rtol=0)
    assert scored[:, BLOCK].all() and (full[:, BLOCK] < 0).all()


def test_sampling_causal_context_reaches_the_policy_and_is_checked(nemotron_path):
    """``sampling.causal_context``: null keeps the family's ``"causal"``, false sets ``"block"`` on the loaded policy
    (rollouts and likelihoods alike); a value that is not a boolean, or the key under another kind, is refused naming
    it."""
    import dataclasses

    from dlmrl.config import ConfigError
    from dlmrl.training.run_setup import check_policy, load_configured_policy

    for value, expected in (("null", "causal"), ("true", "causal"), ("false", "block")):
        cfg = _quiet(_validate, nemotron_path, "block", f"sampling.causal_context={value}")
        assert _quiet(load_configured_policy, cfg).clean_context == expected
    with pytest.raises(ConfigError, match="sampling.causal_context"):
        _quiet(_validate, nemotron_path, "block", "sampling.causal_context=3")
    shifted = dataclasses.replace(_quiet(load_configured_policy, cfg), logit_shift=1)  # (Fast-dLLM v2's outputs)
    with pytest.raises(ConfigError, match="sampling.causal_context.*logit_shift 1"):
        check_policy(_quiet(_validate, nemotron_path, "block", "sampling.causal_context=true"), shifted)
    with pytest.raises(ConfigError, match="sampling.causal_context.*model.kind block"):
        _quiet(_validate, nemotron_path, "diffusion", "sampling.causal_context=true", "sampling.block_length=8")
    # a family that attends its context block-causally (SDAR, LLaDA2, the tiny one) has no AR head to take a block's
    # first token from: true is refused (a reviewer's finding: an SDAR run took it silently); false is its own layout
    blockwise = dataclasses.replace(_quiet(load_configured_policy, cfg), family="sdar", clean_context="block")
    with pytest.raises(ConfigError, match="sampling.causal_context.*causal clean context"):
        check_policy(_quiet(_validate, nemotron_path, "block", "sampling.causal_context=true"), blockwise)
    check_policy(_quiet(_validate, nemotron_path, "block", "sampling.causal_context=false"), blockwise)


def test_causal_context_needs_no_logit_shift(block):
    import dataclasses

    with pytest.raises(ValueError, match="clean_context 'causal'.*logit_shift 0"):
        dataclasses.replace(block, logit_shift=1)
    with pytest.raises(ValueError, match="clean_context must be one of"):
        dataclasses.replace(block, clean_context="token")


# ------------------------------------------------------------------------------------ activation checkpointing


def _composite_grads(policy, ids, pm, noisy, clean):
    policy.model.zero_grad(set_to_none=True)
    logits = policy.completion_logits(ids, pm, noisy, clean=clean)
    torch.log_softmax(logits, -1).gather(-1, clean[..., None]).sum().backward()
    return {n: p.grad.detach().clone() for n, p in policy.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("own", [False, True])
def test_activation_checkpointing_recomputes_under_the_explicit_mask(nemotron_path, own):
    """dlmrl's checkpointing (``dlmrl.models.lora.enable_gradient_checkpointing``) gives the gradients of the plain
    backward: the recomputation runs under the pass's mask (``context_fn``). The class's own checkpointing, without
    it, recomputes every layer without the mask (bidirectionally), which torch's checkpoint catches here only because
    the recomputation saves one tensor fewer (the mask)."""
    from dlmrl.models.lora import enable_gradient_checkpointing

    policy = _quiet(load_block_policy, str(nemotron_path), trust_remote_code=True)
    ids, pm = _encode(policy, PROMPTS)
    clean = _tokens((3, 8), 8)
    noisy = clean.masked_fill(torch.arange(8) % 3 == 0, MASK)
    policy.model.train()
    plain = _composite_grads(policy, ids, pm, noisy, clean)
    calls = []
    policy.model.encoder.layers[0].self_attn.register_forward_pre_hook(lambda *_: calls.append(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        if own:
            type(policy.model).activation_checkpointing_enable(policy.model, {"use_reentrant": False})
        else:
            enable_gradient_checkpointing(policy.model)
    if own:
        with pytest.raises(torch.utils.checkpoint.CheckpointError, match="different number of tensors"):
            _composite_grads(policy, ids, pm, noisy, clean)
        return
    checkpointed = _composite_grads(policy, ids, pm, noisy, clean)
    assert len(calls) == 2  # (not vacuous: the layer ran again in the backward pass)
    assert set(checkpointed) == set(plain)
    gap = max(float((checkpointed[n] - g).abs().max()) for n, g in plain.items())
    assert gap <= ATOL, gap


def test_ar_activation_checkpointing_gives_the_plain_gradients(nemotron_path):
    from dlmrl.models.lora import enable_gradient_checkpointing

    policy = _quiet(load_ar_policy, str(nemotron_path), trust_remote_code=True)
    ids, pm = _encode(policy, PROMPTS)
    completion = _tokens((3, 5), 9)
    cmask = torch.ones_like(completion, dtype=torch.bool)
    policy.model.train()

    def grads():
        policy.model.zero_grad(set_to_none=True)
        policy.token_logprobs(ids, pm, completion, cmask, entropy=False)[0].sum().backward()
        return {n: p.grad.detach().clone() for n, p in policy.model.named_parameters() if p.grad is not None}

    plain = grads()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        enable_gradient_checkpointing(policy.model)
    assert policy.model.encoder.layers[0].gradient_checkpointing
    checkpointed = grads()
    assert set(checkpointed) == set(plain)
    assert max(float((checkpointed[n] - g).abs().max()) for n, g in plain.items()) <= ATOL


# ------------------------------------------------------------------------------------ training: block and AR kinds


def digit_sum(prompts, completions, **columns):
    """A reward that differs between completions: the sum of their digits, scaled."""
    return [sum(int(c) for c in text if c.isdigit()) / 50 for text in completions]


@pytest.mark.parametrize("kind,lora", [("block", True), ("block", False), ("ar", True), ("ar", False)])
def test_two_training_steps(nemotron_path, tmp_path, kind, lora):
    data = Dataset.from_dict({"prompt": ["12+3=", "7*8=", "1+1=", "9-4="]})
    config = {"model.kind": kind, "model.trust_remote_code": True, "model.use_peft": lora,
              "model.gradient_checkpointing": True,
              "model.lora_target_modules": "q_proj,k_proj,v_proj,o_proj", "model.lora_dropout": 0.0,
              "train.max_steps": 2, "train.prompts_per_step": 2, "train.num_generations": 2,
              "sampling.gen_length": 8, "train.learning_rate": 1e-2, "train.warmup_steps": 0,
              "output_dir": str(tmp_path / "run")}
    if kind == "block":
        config.update({"sampling.steps": 8, "train.algorithm": "tracerl", "estimator.name": "trajectory",
                       "estimator.merge": 1})
    else:
        config.update({"train.algorithm": "grpo", "task.answer_mode": "text"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = Trainer(str(nemotron_path), reward_funcs=[digit_sum], train_dataset=data, config=config)
        before = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
        trainer.train(progress=False)
    after = {k.replace("base_model.model.", "").replace(".base_layer", ""): v
             for k, v in trainer.model.state_dict().items()}
    moved = [k for k in before if not torch.equal(before[k], after[k])]
    if lora:  # (the base frozen, the adapter trained: lora_B starts at 0)
        assert not moved, moved
        assert any("lora_B" in k and v.abs().max() > 0 for k, v in after.items())
    else:
        assert any("encoder.layers.0.mlp" in k for k in moved) and any("diffusion_head" in k for k in moved), moved
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert math.isfinite(r["loss"]) and r["grad_norm"] > 0
        if kind == "block":  # (the exact old-policy scores are the log-probs the cached sampler drew with)
            assert r["rollout_logp_gap_max"] <= ATOL, r


def test_a_hub_id_recipe_under_model_kind_ar_needs_trust_remote_code():
    """The AR recipe names a hub id, so no config.json is read at config time; its ``model.architecture`` (the memory
    plan's description, ``model_type: nemotron_labs_diffusion``) says the checkpoint ships its own code:
    ``trust_remote_code`` false is refused at config time, naming the key (a reviewer's finding: it passed
    ``--dry-run`` and would have failed only at load). A diffusion-only architecture under ``model.kind: ar`` is
    refused naming ``model.kind``."""
    from types import SimpleNamespace

    from dlmrl.config import ConfigError
    from dlmrl.kinds.causal import refuse_diffusion_checkpoint

    def cfg(trust, model_type):
        return SimpleNamespace(model=SimpleNamespace(name_or_path="nvidia/Nemotron-Labs-Diffusion-8B",
                                                     trust_remote_code=trust,
                                                     architecture={"model_type": model_type}))

    with pytest.raises(ConfigError, match="model.trust_remote_code.*'nemotron_diffusion'"):
        refuse_diffusion_checkpoint(cfg(False, "nemotron_labs_diffusion"))
    refuse_diffusion_checkpoint(cfg(True, "nemotron_labs_diffusion"))  # (runs causally: accepted)
    refuse_diffusion_checkpoint(cfg(False, "qwen2"))  # (an ordinary causal LM)
    with pytest.raises(ConfigError, match="model.kind.*'sdar' diffusion checkpoint.*set model.kind block"):
        refuse_diffusion_checkpoint(cfg(True, "sdar"))
