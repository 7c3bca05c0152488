import pytest
import torch

from dlmrl.models.families import detect_family
from dlmrl.models.loading import load_policy
from dlmrl.models.policy import canvas_logits, position_ids_from_mask
from dlmrl.models.tokenizer import build_char_tokenizer
from tests.helpers import save_tiny_checkpoint
from tests.tolerances import forward_tol


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    path = save_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))
    return load_policy(str(path))


def test_loads_tiny_family_with_mask_token(tiny_policy):
    assert tiny_policy.family == "tiny"
    assert tiny_policy.mask_token_id == tiny_policy.tokenizer.mask_token_id == 3
    assert detect_family(tiny_policy.model.config) == "tiny"


def test_tiny_model_is_bidirectional(tiny_policy):
    x = torch.randint(5, 15, (1, 10))
    y = x.clone()
    y[0, -1] = 5 if x[0, -1] != 5 else 6
    a, b = tiny_policy(x), tiny_policy(y)
    assert not torch.allclose(a[0, 0], b[0, 0]), "position 0 must see the last token"


def test_left_padding_does_not_change_logits(tiny_policy):
    # padding changes the batch's shape, so the logits agree to rounding: compared in float64 (|logit| ≤ 5, the
    # check below; 2 layers × (32 hidden + 12 keys + 64 MLP) accumulations; tests/tolerances.py): ≈ 2.4e-10
    tiny_policy = load_policy(tiny_policy.model.name_or_path, dtype="float64")
    tok = tiny_policy.tokenizer
    enc = tok(["[BOS]12=", "[BOS]1234=34"], add_special_tokens=False, padding=True, return_tensors="pt")
    canvas = torch.full((2, 4), tiny_policy.mask_token_id)
    both = canvas_logits(tiny_policy, enc["input_ids"], enc["attention_mask"].bool(), canvas)
    alone = tok(["[BOS]12="], add_special_tokens=False, return_tensors="pt")
    single = canvas_logits(tiny_policy, alone["input_ids"], alone["attention_mask"].bool(), canvas[:1])
    assert both.dtype == torch.float64 and both.abs().max() <= 5
    torch.testing.assert_close(both[0], single[0], atol=forward_tol(scale=5, terms=2 * (32 + 12 + 64)), rtol=0)


def test_position_ids_count_real_tokens():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]


def test_char_tokenizer_round_trip():
    tok = build_char_tokenizer()
    ids = tok("1203=\n", add_special_tokens=False)["input_ids"]
    assert len(ids) == 6
    assert tok.decode(ids) == "1203=\n"


def test_missing_local_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_policy(str(tmp_path / "nope"))


def test_hub_ids_with_dots_are_not_taken_for_local_paths():
    from dlmrl.models.loading import looks_local

    assert not looks_local("GSAI-ML/LLaDA-1.5") and not looks_local("Qwen/Qwen2.5-0.5B-Instruct")
    assert not looks_local("bert-base-uncased")
    assert looks_local("./ckpt") and looks_local("/abs/ckpt") and looks_local("runs/x/final_model")
    assert looks_local("model.safetensors") and looks_local("~/ckpt")


def test_shipped_default_loads():
    policy = load_policy("tiny-sudoku")
    assert policy.family == "tiny"
    assert sum(p.numel() for p in policy.parameters()) > 100_000


def test_masked_lm_family_greedy_output_independent_of_left_padding(tmp_path):
    from transformers import BertConfig, BertForMaskedLM

    from dlmrl.models.sampler import generate

    tok = build_char_tokenizer()
    torch.manual_seed(0)
    bert = BertForMaskedLM(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=64, max_position_embeddings=64, pad_token_id=0))
    bert.save_pretrained(tmp_path, safe_serialization=True)
    tok.save_pretrained(tmp_path)
    policy = load_policy(str(tmp_path))
    assert policy.family == "masked_lm"
    alone = tok(["[BOS]12="], add_special_tokens=False, return_tensors="pt")
    both = tok(["[BOS]12=", "[BOS]1234567="], add_special_tokens=False, padding=True, return_tensors="pt")
    kw = {"gen_length": 8, "block_length": 8, "steps": 8}
    a = generate(policy, alone["input_ids"], alone["attention_mask"].bool(), **kw).canvas
    b = generate(policy, both["input_ids"], both["attention_mask"].bool(), **kw).canvas
    assert torch.equal(a[0], b[0])
