"""The tiny default denoiser: a small Llama with bidirectional attention (LLaDA's architecture at toy scale)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def build_tiny_model(
    vocab_size: int,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    intermediate_size: int = 384,
    max_positions: int = 128,
    seed: int = 0,
) -> LlamaForCausalLM:
    """A freshly initialised bidirectional Llama (``config.is_causal = False``).

    Position ``i`` of the output predicts token ``i`` (masked-diffusion convention, no shift).
    The defaults give about 0.85M parameters.

    Args:
        vocab_size: tokenizer size ``V``.
        seed: seeds the initialisation.
    Returns:
        ``LlamaForCausalLM`` in float32, train mode.
    """
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        is_causal=False,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)
