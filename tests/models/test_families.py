"""Family adapters on real tiny checkpoints: detection, remote code, mask ids, and the sampler and the
estimators giving the same numbers through each adapter as a direct computation from the model's logits.

The direct computations call each underlying model the way its own reference code does (LLaDA's
``generate.py``: ``model(x).logits``; Dream's ``generation_utils.py``: ``model(x, "full", None)`` then
``cat([l[:, :1], l[:, :-1]], 1)``; a ``*ForMaskedLM``: ``model(input_ids=x).logits`` with its default
positions) on unpadded inputs.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dlmrl.estimators import SDMC, Exact, OneStep, score
from dlmrl.models.families import FAMILIES, detect_family, shift_logits_right
from dlmrl.models.loading import load_policy, read_checkpoint_config, resolve_mask_token_id
from dlmrl.models.policy import canvas_logits
from dlmrl.models.sampler import generate
from tests.models.checkpoints import BUILDERS, FAMILY_OF, LLADA_MASK, LLADA_VOCAB, isolated_remote_code
from tests.tolerances import forward_tol, rounding_tol

KINDS = list(BUILDERS)
P, L = 4, 3  # prompt and canvas length of the hand-checked batches


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    with isolated_remote_code(root / "hf_modules"):
        yield {kind: build(root / kind) for kind, build in BUILDERS.items()}


@pytest.fixture(scope="module")
def policies(checkpoints):
    """Each checkpoint in float64: the adapters' numbers equal the direct computations to rounding (other shapes,
    padding, the estimators' sums), and greedy choices made along two paths do not flip on a near-tie."""
    return {kind: load_policy(str(path), trust_remote_code=True, dtype="float64") for kind, path in checkpoints.items()}


#: accumulations on the way to one log-prob: ≤ 2 layers × (16 hidden + 10 keys + 32 MLP), then the log-sum-exp over
#: the vocabulary (LLaDA's stand-in: 126464 tokens); the tolerance scales it by the compared values' size
FAMILY_TERMS = 2 * (16 + 10 + 32) + LLADA_VOCAB


def direct_logits(kind: str, model, ids: torch.Tensor) -> torch.Tensor:
    """``(B, T, V)`` logits of an unpadded batch straight from the model, with the family's convention."""
    if kind == "llada":
        return model(ids).logits
    if kind == "dream":
        raw = model(ids, "full", None).logits
        return torch.cat([raw[:, :1], raw[:, :-1]], dim=1)
    return model(input_ids=ids).logits


def batch(policy, seed: int = 0):
    """Two prompts of length P and two completions of length L from the character tokens (no padding)."""
    g = torch.Generator().manual_seed(seed)
    lo = policy.tokenizer.convert_tokens_to_ids("0")
    prompt = torch.randint(lo, lo + 10, (2, P), generator=g)
    completion = torch.randint(lo, lo + 10, (2, L), generator=g)
    return prompt, torch.ones(2, P, dtype=torch.bool), completion, torch.ones(2, L, dtype=torch.bool)


# ------------------------------------------------------------------------------ detection and loading


@pytest.mark.parametrize("kind", KINDS)
def test_family_is_detected_from_config_json_without_running_its_code(kind, checkpoints, policies):
    assert detect_family(read_checkpoint_config(str(checkpoints[kind]))) == FAMILY_OF[kind]
    assert policies[kind].family == FAMILY_OF[kind]


def test_mask_token_ids_come_from_tokenizer_config_or_family(policies):
    for kind in ("bert", "roberta", "modernbert"):
        assert policies[kind].mask_token_id == policies[kind].tokenizer.mask_token_id == 4
    # LLaDA: the tokenizer declares no mask token; config.json's mask_token_id (LLaDA's 126336) is used
    assert policies["llada"].tokenizer.mask_token_id is None
    assert policies["llada"].mask_token_id == LLADA_MASK
    # Dream: the tokenizer's <|mask|>, repeated by config.json
    assert policies["dream"].mask_token_id == policies["dream"].tokenizer.mask_token_id == 2


@pytest.mark.parametrize("kind", ["llada", "dream"])
def test_remote_code_is_refused_unless_trusted(kind, checkpoints):
    with pytest.raises(ValueError, match=r"model\.trust_remote_code=true"):
        load_policy(str(checkpoints[kind]))


@pytest.mark.parametrize("kind", ["llada", "dream", "sdar"])
def test_a_fully_trained_checkpoint_saves_its_model_code_and_loads_back(kind, checkpoints, policies, tmp_path):
    # save_pretrained of a model built from checkpoint code writes that code (as transformers' Auto classes arrange),
    # so a fully fine-tuned model's folder loads like the original: same class, same logits
    from dlmrl.models.lora import save_final_model

    policy = policies[kind]
    out = tmp_path / "final"
    save_final_model(policy.model, policy.tokenizer, out)
    code = {p.name for p in out.glob("*.py")}
    assert {f"configuration_{kind}.py", f"modeling_{kind}.py"} <= code, sorted(code)
    with isolated_remote_code(tmp_path / "modules"):
        again = load_policy(str(out), trust_remote_code=True, dtype="float64")
        assert again.family == policy.family and type(again.model).__name__ == type(policy.model).__name__
        prompt, _, completion, _ = batch(policy)
        ids = torch.cat([prompt, completion.masked_fill(completion > 0, policy.mask_token_id)], dim=1)
        mask = torch.ones_like(ids, dtype=torch.bool)
        with torch.no_grad():
            a, b = again(ids, mask), policy(ids, mask)
        # the same float64 weights in another model instance: equal up to summation order (kernel choice)
        tol = forward_tol(scale=float(b.abs().max()), terms=FAMILY_TERMS)
        torch.testing.assert_close(a, b, atol=tol, rtol=0)


def test_family_override_wins_over_detection(checkpoints, policies):
    # The Dream stand-in loaded as LLaDA: same weights, but no shift any more.
    as_llada = load_policy(str(checkpoints["dream"]), family="llada", trust_remote_code=True, dtype="float64")
    assert as_llada.family == "llada"
    ids = torch.tensor([[5, 6, 7, 2, 2]])
    with torch.no_grad():
        torch.testing.assert_close(as_llada(ids), as_llada.model(ids, "full", None).logits)
        assert not torch.allclose(as_llada(ids), policies["dream"](ids))
    bert = load_policy(str(checkpoints["bert"]), family="masked_lm")
    assert bert.family == "masked_lm"
    with pytest.raises(KeyError, match="Did you mean 'dream'"):
        load_policy(str(checkpoints["bert"]), family="drem")


def test_mask_token_id_override_and_range_check(checkpoints):
    policy = load_policy(str(checkpoints["llada"]), trust_remote_code=True, mask_token_id=126335)
    assert policy.mask_token_id == 126335
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        load_policy(str(checkpoints["llada"]), trust_remote_code=True, mask_token_id=LLADA_VOCAB)


def test_resolve_mask_token_id_order_and_conflict():
    tok, no_tok = SimpleNamespace(mask_token_id=4), SimpleNamespace(mask_token_id=None)
    assert resolve_mask_token_id(tok, {}, 126336) == 4
    assert resolve_mask_token_id(no_tok, {"mask_token_id": 7}, 126336) == 7
    assert resolve_mask_token_id(no_tok, {}, 126336) == 126336
    assert resolve_mask_token_id(tok, {"mask_token_id": 9}, None, override=9) == 9
    with pytest.raises(ValueError, match="differs from config.json"):
        resolve_mask_token_id(tok, {"mask_token_id": 9}, None)
    with pytest.raises(ValueError, match="no mask token"):
        resolve_mask_token_id(no_tok, {}, None)


def test_detection_from_config_dicts():
    assert detect_family({"model_type": "llada", "architectures": ["LLaDAModelLM"]}) == "llada"
    assert detect_family({"auto_map": {"AutoModel": "modeling_dream.DreamModel"}, "model_type": "Dream"}) == "dream"
    assert detect_family({"model_type": "roberta", "architectures": ["RobertaForMaskedLM"]}) == "masked_lm"
    assert detect_family({"model_type": "llama", "is_causal": False}) == "tiny"
    with pytest.raises(ValueError, match="cannot detect"):
        detect_family({"model_type": "llama"})  # a causal Llama is not a masked denoiser
    with pytest.raises(ValueError, match="several model families"):
        detect_family({"model_type": "llada", "architectures": ["BertForMaskedLM"]})
    assert set(FAMILIES.names()) >= {"llada", "dream", "masked_lm", "tiny"}


def test_shift_logits_right_keeps_each_rows_first_real_token():
    raw = torch.arange(8.0).view(2, 4, 1)  # output at position j is j (+4 in row 1)
    assert shift_logits_right(raw)[..., 0].tolist() == [[0, 0, 1, 2], [4, 4, 5, 6]]
    pad = torch.tensor([[False, False, True, True], [True, True, True, True]])
    assert shift_logits_right(raw, pad)[0, 2:, 0].tolist() == [2, 2]  # first real keeps its own, then shift


# ------------------------------------------------------------------ adapters against direct computation


@pytest.mark.parametrize("kind", KINDS)
@torch.no_grad()
def test_policy_logits_equal_the_models_own(kind, policies):
    policy = policies[kind]
    prompt, _, completion, _ = batch(policy)
    ids = torch.cat([prompt, completion.masked_fill(torch.tensor([True, False, True]), policy.mask_token_id)], 1)
    torch.testing.assert_close(policy(ids), direct_logits(kind, policy.model, ids))


ESTIMATORS = {"sdmc": SDMC(num_nodes=3), "exact": Exact(), "one_step": OneStep(p_mask_prompt=0.5, num_samples=2)}


@pytest.mark.parametrize("estimator", list(ESTIMATORS))
@pytest.mark.parametrize("kind", KINDS)
@torch.no_grad()
def test_estimator_terms_equal_hand_computation(kind, estimator, policies):
    policy = policies[kind]
    prompt, prompt_mask, completion, completion_mask = batch(policy, seed=1)
    plan = ESTIMATORS[estimator].make_plan(completion_mask, 3, prompt_mask)
    est = score(policy, prompt, prompt_mask, completion, completion_mask, plan)

    masks = plan.masks.flatten(0, 1)  # (S·B, L), sample-major like the plan
    rows = torch.arange(2).repeat(plan.masks.shape[0])  # (S·B,)
    canvas = completion[rows].masked_fill(masks, policy.mask_token_id)
    p = prompt[rows]
    if plan.prompt_masks is not None:
        p = p.masked_fill(plan.prompt_masks.flatten(0, 1), policy.mask_token_id)
    logits = direct_logits(kind, policy.model, torch.cat([p, canvas], 1))[:, P:]
    dtype = logits.dtype  # float64, the weights' (LLaDA2's code returns float32 logits whatever the weights)
    assert dtype == (torch.float32 if kind == "llada2" else torch.float64)
    token_logp = torch.log_softmax(logits, -1).gather(-1, completion[rows][..., None])[..., 0]  # (S·B, L)
    terms = plan.weights.flatten()[:, None] * torch.where(masks, token_logp, 0.0)
    expected = torch.zeros(2, L, dtype=dtype).index_add(0, rows, terms)
    assert est.per_token.dtype == dtype
    # a token's term sums ≤ S weighted log-probs (the random stand-ins' reach |log p| ≈ 100): ≲ 1e-5, against O(1)
    # for a wrong mask, weight or shift
    scale = float(terms.abs().max()) * plan.masks.shape[0]
    tol = forward_tol(scale=scale, terms=FAMILY_TERMS)
    if dtype == torch.float32:  # (float64 internals rounded once to float32 logits, then a float32 log_softmax over
        tol = rounding_tol(scale, n=2 * (len(policy.tokenizer) + 4))  # the vocabulary and S weighted terms)
    torch.testing.assert_close(est.per_token, expected, atol=tol, rtol=0)
    torch.testing.assert_close(est.sequence, expected.sum(-1), atol=L * tol, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
@torch.no_grad()
def test_one_sampler_step_is_the_argmax_of_the_models_logits(kind, policies):
    policy = policies[kind]
    prompt, prompt_mask, _, _ = batch(policy, seed=2)
    out = generate(policy, prompt, prompt_mask, gen_length=L, block_length=L, steps=1)
    logits = direct_logits(kind, policy.model, torch.cat([prompt, torch.full((2, L), policy.mask_token_id)], 1))
    logits = logits[:, P:].clone()
    logits[..., policy.mask_token_id] = float("-inf")
    assert out.nfe == 1
    assert torch.equal(out.canvas, logits.argmax(-1))


@pytest.mark.parametrize("kind", KINDS)
@torch.no_grad()
def test_greedy_decoding_equals_a_hand_loop(kind, policies):
    """One token per step: reveal the masked position whose argmax token (never the mask token) is most probable
    under the full softmax (mask token included, as LLaDA's generate computes the confidence)."""
    policy = policies[kind]
    mask = policy.mask_token_id
    prompt, prompt_mask, _, _ = batch(policy, seed=3)
    out = generate(policy, prompt, prompt_mask, gen_length=L, block_length=L, steps=L)
    for b in range(2):
        x = torch.full((L,), mask)
        for _ in range(L):
            logits = direct_logits(kind, policy.model, torch.cat([prompt[b], x])[None])[0, P:].double()
            probs = torch.softmax(logits, -1)  # (L, V), the full softmax
            x0 = logits.index_fill(-1, torch.tensor([mask]), float("-inf")).argmax(-1)
            conf = probs.gather(-1, x0[:, None])[:, 0]
            i = int(torch.where(x == mask, conf, -1.0).argmax())
            x[i] = x0[i]
        assert torch.equal(out.canvas[b], x), (kind, b)


@pytest.mark.parametrize("kind", KINDS)
@torch.no_grad()
def test_left_padding_changes_nothing(kind, policies):
    """A prompt batched with a longer one gives the same logits and the same greedy canvas as alone."""
    policy = policies[kind]
    tok = policy.tokenizer
    both = tok(["12+3=", "1234+56="], add_special_tokens=False, padding=True, return_tensors="pt")
    alone = tok(["12+3="], add_special_tokens=False, return_tensors="pt")
    assert not both["attention_mask"][0].all()
    canvas = torch.full((2, 4), policy.mask_token_id)
    canvas[:, 1] = tok.convert_tokens_to_ids("7")
    padded = canvas_logits(policy, both["input_ids"], both["attention_mask"].bool(), canvas)
    single = canvas_logits(policy, alone["input_ids"], alone["attention_mask"].bool(), canvas[:1])
    tol = forward_tol(scale=float(padded.abs().max()), terms=FAMILY_TERMS)
    torch.testing.assert_close(padded[0], single[0], atol=tol, rtol=0)
    kw = {"gen_length": 4, "block_length": 4, "steps": 4}
    a = generate(policy, alone["input_ids"], alone["attention_mask"].bool(), **kw).canvas
    b = generate(policy, both["input_ids"], both["attention_mask"].bool(), **kw).canvas
    assert torch.equal(a[0], b[0])


@pytest.mark.parametrize("name", ["bert", "sdar"])
def test_an_explicit_family_that_contradicts_a_local_config_is_refused_before_loading(name, tmp_path):
    from dlmrl.config import Config, ConfigError, apply_overrides, validate

    path = BUILDERS[name](tmp_path / name)
    wrong = "tiny"

    def config(family):
        cfg = Config()
        apply_overrides(cfg, ["task.name=text", f"model.name_or_path={path}", f"model.family={family}",
                              "model.trust_remote_code=true", "model.kind=diffusion"])
        return cfg

    with pytest.raises(ConfigError, match=f"model.family.*'{wrong}' does not match.*'{FAMILY_OF[name]}' checkpoint"):
        validate(config(wrong), for_training=False)
    try:
        validate(config(FAMILY_OF[name]), for_training=False)
    except ConfigError as e:  # (other settings of this bare config may be refused, never the family)
        assert "model.family" not in str(e)
