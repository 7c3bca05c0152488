"""A uniform-noise diffusion LM as a dlmrl policy (``model.kind: uniform``): Google's DiffusionGemma
(``DiffusionGemmaForBlockDiffusion``, transformers' own class) with its tokenizer.

:class:`UniformNoisePolicy` holds the model and says what the trainer, the rollout and the scorer read of it: the
tokenizer's EOS and pad ids (the sampler's stop and padding, given to it instead of the checkpoint's generation
config's, so that a completion ends where the task's tokenizer says), the canvas length ``L``, the device. Sampling
is :meth:`UniformNoisePolicy.sample`, i.e. :func:`dlmrl.models.uniform_sampler.sample_diffusion_gemma`.

:func:`load_uniform_policy` loads a checkpoint natively (no ``trust_remote_code``: transformers ships the class);
:func:`uniform_policy_from_model` wraps an already-loaded model; :func:`build_tiny_uniform_policy` builds a tiny random
one with the tiny Sudoku character tokenizer's vocabulary, for tests (:func:`save_tiny_uniform_checkpoint` saves it
with ``save_pretrained``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dlmrl.models.diffusion_gemma import (
    build_tiny_diffusion_gemma,
    load_diffusion_gemma,
    tiny_generation_config,
    unwrap_diffusion_gemma,
)

__all__ = ["UniformNoisePolicy", "build_tiny_uniform_policy", "load_uniform_policy", "save_tiny_uniform_checkpoint",
           "uniform_policy_from_model"]

#: the ``family`` a uniform-noise policy reports (one family so far)
UNIFORM_FAMILY = "diffusion_gemma"


@dataclass
class UniformNoisePolicy:
    """A DiffusionGemma model and its tokenizer as a policy.

    Attributes:
        model: a ``DiffusionGemmaForBlockDiffusion`` (or a PEFT / accelerate wrapper of one).
        tokenizer: its tokenizer (left padding).
        eos_token_id: where a completion ends (the tokenizer's EOS; ``None``: completions end at the token budget).
        pad_token_id: the id written after EOS (the tokenizer's pad, else its EOS).
        kind: ``"uniform"``. family: ``"diffusion_gemma"``.
    """

    model: nn.Module
    tokenizer: Any
    eos_token_id: int | None
    pad_token_id: int
    kind: str = field(default="uniform", init=False)
    family: str = field(default=UNIFORM_FAMILY, init=False)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def parameters(self):
        return self.model.parameters()

    @property
    def canvas_length(self) -> int:
        """``L``: the tokens one canvas (block) holds (``config.canvas_length``)."""
        return int(unwrap_diffusion_gemma(self.model).config.canvas_length)

    @property
    def vocab_size(self) -> int:
        """``V``: the model's vocabulary (the uniform noise's range)."""
        return int(unwrap_diffusion_gemma(self.model).config.text_config.vocab_size)

    def sample(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, max_new_tokens: int, *,
               generator: torch.Generator | None = None, seed: int | None = None, draw_last_step: bool = False,
               **settings):
        """``sample_diffusion_gemma`` on left-padded prompts with this policy's EOS and pad ids and a budget of
        ``max_new_tokens`` (``ceil(max_new_tokens / L)`` canvases at most); ``settings`` as its keyword arguments
        (``max_denoising_steps``, ``entropy_bound``, ``t_min``, ``t_max``, ``stability_threshold``,
        ``confidence_threshold``; not given: the checkpoint's generation config's).

        Returns:
            :class:`~dlmrl.models.uniform_sampler.UniformSampleOutput`.
        Raises:
            ValueError: a bad setting (named, :func:`~dlmrl.models.uniform_sampler.resolve_settings`).
        """
        from dlmrl.models.uniform_sampler import sample_diffusion_gemma

        return sample_diffusion_gemma(self.model, prompt_ids, prompt_mask, generator=generator, seed=seed,
                                      draw_last_step=draw_last_step, max_new_tokens=int(max_new_tokens),
                                      eos_token_id=self.eos_token_id, pad_token_id=self.pad_token_id, **settings)


def uniform_policy_from_model(model: nn.Module, tokenizer, label: str | None = None) -> UniformNoisePolicy:
    """An already-loaded DiffusionGemma and its tokenizer as a policy: the tokenizer switched to left padding, EOS
    as padding when it has no pad token.

    Raises:
        TypeError: ``model`` is not (a wrapper of) a ``DiffusionGemmaForBlockDiffusion``.
        ValueError: a tokenizer with neither a pad nor an EOS token (naming ``label``).
    """
    unwrap_diffusion_gemma(model)  # (TypeError for another model)
    tokenizer.padding_side = "left"
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ValueError(f"{label or type(model).__name__}: the tokenizer has neither a pad nor an EOS token")
    return UniformNoisePolicy(model=model, tokenizer=tokenizer, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=int(pad))


def load_uniform_policy(name_or_path: str, dtype: str = "float32", device: str | torch.device = "cpu",
                        adapter_kinds: tuple[str, ...] = ("uniform",)) -> UniformNoisePolicy:
    """Load a DiffusionGemma checkpoint and its tokenizer natively (transformers' class, ``trust_remote_code``
    off: :func:`dlmrl.models.diffusion_gemma.load_diffusion_gemma`).

    Args:
        name_or_path: a local folder or a hub id whose ``config.json`` has ``model_type: diffusion_gemma``. A folder
            holding a LoRA adapter (``adapter_config.json``, as a LoRA run's ``final_model/``) loads its base (named by
            ``dlmrl_base_model.json`` or ``adapter_config.json``) with these arguments and puts the adapter on it (a
            ``peft.PeftModel``, adapter frozen, each adapter shared by the encoder and the decoder:
            :func:`dlmrl.models.diffusion_gemma.share_encoder_adapters`).
        dtype: ``float32``, ``bfloat16``, ``float16`` or ``float64``.
        adapter_kinds: the policy kinds whose LoRA adapters this call loads (default ``uniform``; a kind of your own
            that runs DiffusionGemma passes its name).
    Raises:
        ValueError: an unknown dtype, a checkpoint of another model type, a tokenizer without pad and EOS, or an
            adapter trained as a kind not in ``adapter_kinds``.
        OSError: no checkpoint there.
    """
    from transformers import AutoTokenizer

    from dlmrl.models.diffusion_gemma import share_encoder_adapters
    from dlmrl.models.loading import resolve_model_path
    from dlmrl.models.lora import attach_adapter, check_adapter_kind, find_adapter

    if dtype not in ("float32", "bfloat16", "float16", "float64"):
        raise ValueError(f"model.dtype must be float32, bfloat16, float16 or float64, got {dtype!r}")
    name_or_path = resolve_model_path(name_or_path)  # (a shipped name, e.g. an adapter's base tiny-sudoku-uniform)
    adapter = find_adapter(name_or_path)
    if adapter is not None:
        check_adapter_kind(adapter, adapter_kinds)
        policy = load_uniform_policy(adapter.base_model_name_or_path, dtype, device, adapter_kinds)
        with warnings.catch_warnings():  # (peft saved each shared adapter once, under the encoder's names: the
            # decoder's are "missing" until share_encoder_adapters makes them the encoder's)
            warnings.filterwarnings("ignore", message="Found missing adapter keys.*decoder", category=UserWarning)
            policy.model = attach_adapter(policy.model, adapter).to(device)
        share_encoder_adapters(policy.model)
        return policy
    model = load_diffusion_gemma(name_or_path, dtype).to(device)
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    return uniform_policy_from_model(model, tokenizer, label=name_or_path)


def build_tiny_uniform_policy(seed: int = 0, canvas_length: int = 8, max_denoising_steps: int = 4,
                              tokenizer=None) -> UniformNoisePolicy:
    """A tiny random DiffusionGemma (:func:`~dlmrl.models.diffusion_gemma.build_tiny_diffusion_gemma`) over a
    tokenizer's vocabulary (default: the tiny Sudoku character tokenizer, 19 ids: pad 0, bos 1, eos 2), plus the
    three image ids the class reserves at the end (``V = len(tokenizer) + 3``); its generation config carries the
    tokenizer's special ids and ``max_denoising_steps``. Float32, eval mode. For tests."""
    if tokenizer is None:
        from dlmrl.models.tokenizer import build_char_tokenizer

        tokenizer = build_char_tokenizer()
    gen = tiny_generation_config(max_new_tokens=2 * canvas_length, max_denoising_steps=max_denoising_steps,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                 bos_token_id=tokenizer.bos_token_id)
    model = build_tiny_diffusion_gemma(seed=seed, vocab_size=len(tokenizer) + 3, canvas_length=canvas_length,
                                       generation_config=gen)
    return uniform_policy_from_model(model, tokenizer)


def save_tiny_uniform_checkpoint(path: str | Path, seed: int = 0, canvas_length: int = 8,
                                 max_denoising_steps: int = 4, tokenizer=None) -> Path:
    """:func:`build_tiny_uniform_policy` saved with ``save_pretrained`` (model, generation config, tokenizer) to
    ``path`` (under a second; about 0.7 MB)."""
    path = Path(path)
    policy = build_tiny_uniform_policy(seed, canvas_length, max_denoising_steps, tokenizer)
    policy.model.save_pretrained(path, safe_serialization=True)
    policy.tokenizer.save_pretrained(path)
    return path
