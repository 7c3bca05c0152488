"""The autoregressive adapter: any ``transformers`` causal LM as a policy (baselines on the same tasks).

An AR policy has exact token log-probs, so its "estimator" is one forward pass over
``[prompt | completion]`` with no mask plan. Prompts are left-padded; position ids are
counted over real tokens (as in the diffusion policy), so a row's log-probs and its greedy output do
not depend on how much padding its batch needs.

Sampling uses ``model.generate`` with a generation config built here from the arguments alone: the
checkpoint's ``generation_config.json`` sampling defaults (repetition penalty, top-k, min-p, ...) are
ignored, so the sampled distribution is exactly ``softmax(logits / T)`` cut by top-p, the one
:meth:`AutoregressivePolicy.token_logprobs` scores. A per-step temperature hook
(:class:`StepTemperatureProcessor`) carries HAPO's adaptive temperature (:class:`HapoTemperature`).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)

from dlmrl.models.loading import DTYPES, SHIPPED_AR, looks_local, shipped_path
from dlmrl.models.lora import attach_adapter, check_adapter_kind, find_adapter
from dlmrl.models.policy import position_ids_from_mask
from dlmrl.models.token_scores import (
    STAT_ENTROPY,
    STAT_LOGP,
    HeadRequest,
    hf_output_head,
    tap_head,
    token_logprobs_from_logits,
    unwrap_model,
)
from dlmrl.objectives.entropy import HapoEntropyStats, hapo_temperature

#: Name that resolves to the tiny causal Sudoku model shipped in ``dlmrl/assets/tiny_sudoku_ar``.
TINY_AR_DEFAULT = "tiny-sudoku-ar"

#: ``temperature_fn(input_ids (B, T) long, scores (B, V) float) -> (B,) or scalar`` positive factor.
TemperatureFn = Callable[[torch.Tensor, torch.Tensor], "torch.Tensor | float"]




def resolve_ar_model_path(name_or_path: str) -> str:
    """A shipped name (``tiny-sudoku-ar``, ``tiny-multihop-ar``, ``tiny-recommend-ar``) → its checkpoint folder in
    ``dlmrl/assets``; anything else is returned unchanged."""
    return shipped_path(name_or_path, SHIPPED_AR) or name_or_path


class ARRollout(NamedTuple):
    """Sampled completions; unpacks as ``completion, completion_mask = policy.generate(...)``.

    Attributes:
        completion: ``(B, L)`` long, ``L = max_new_tokens``; pad id after the first EOS.
        completion_mask: ``(B, L)`` bool, True up to and including the first EOS (all generated
            tokens when a row hit ``max_new_tokens`` without EOS).
    """

    completion: torch.Tensor
    completion_mask: torch.Tensor


def _unwrap(model: nn.Module) -> nn.Module:
    """The ``PreTrainedModel`` inside DDP/accelerate and ``peft`` wrappers (``generate`` lives there; a LoRA
    adapter stays injected in its layers, and ``_blank_generation_config`` must reach its generation config)."""
    while hasattr(model, "module") and not hasattr(model, "generate"):
        model = model.module
    if hasattr(model, "get_base_model") and hasattr(model, "peft_config"):
        model = model.get_base_model()
    return model


def _check_left_padded(prompt_mask: torch.Tensor) -> None:
    m = prompt_mask.bool()
    if (m[:, :-1] & ~m[:, 1:]).any():
        raise ValueError("prompts must be left-padded: prompt_mask has a padding position after a real token")
    if not m[:, -1].all():
        raise ValueError("every prompt needs at least one real token (its last position predicts the first "
                         "completion token)")


def _seed_from(generator: torch.Generator | int | None) -> int | None:
    if generator is None or isinstance(generator, int) and not isinstance(generator, bool):
        return generator
    if isinstance(generator, torch.Generator):
        return int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device).item())
    raise TypeError(f"generator must be a torch.Generator, an int seed or None, got {type(generator).__name__}")


def draw_seed(generator: torch.Generator | int | None) -> int | None:
    """The sampling seed :meth:`AutoregressivePolicy.generate` takes from ``generator`` (one draw from a
    ``torch.Generator``; an int or ``None`` as it is)."""
    return _seed_from(generator)


@contextlib.contextmanager
def _seeded(seed: int | None, device: torch.device):
    """Seed torch's global RNG inside, restore the caller's RNG state after (``generate`` samples with it)."""
    if seed is None:
        yield
        return
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


@contextlib.contextmanager
def _blank_generation_config(model: nn.Module):
    """Hide the checkpoint's generation defaults so ``generate`` uses only what we pass."""
    saved = model.generation_config
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = saved


class StepTemperatureProcessor(LogitsProcessor):
    """Divide each row's next-token logits by a factor computed afresh at every decoding step.

    ``temperature_fn(input_ids (B, T), scores (B, V)) -> f (B,) or scalar``, ``f > 0``; the processor
    returns ``scores / f[:, None]``. Passed to ``model.generate`` as a custom logits processor it runs
    before transformers' temperature, top-k and top-p warpers (custom processors are merged ahead of
    the sampling warpers), so the effective temperature of step ``t`` is ``T · f_t`` and top-p acts on
    the final distribution. ``scores`` reach it at temperature 1 (raw logits after any penalties).
    The factors applied are kept in ``factors`` (one ``(B,)`` tensor per step) so the exact sampling
    temperatures can be rebuilt with :meth:`applied`.
    """

    def __init__(self, temperature_fn: TemperatureFn):
        self.temperature_fn = temperature_fn
        self.factors: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        f = torch.as_tensor(self.temperature_fn(input_ids, scores), dtype=scores.dtype, device=scores.device)
        f = f.expand(scores.shape[0])  # (B,)
        if not torch.isfinite(f).all() or (f <= 0).any():
            raise ValueError(f"temperature_fn must return finite factors > 0, got {f.tolist()}")
        self.factors.append(f.detach())
        return scores / f[:, None]

    def applied(self, length: int | None = None) -> torch.Tensor:
        """``(B, steps)`` factors applied so far, padded with 1 (or cut) to ``length`` columns."""
        f = torch.stack(self.factors, dim=1)  # (B, steps)
        if length is not None:
            f = f[:, :length]
            f = torch.cat([f, f.new_ones(f.shape[0], length - f.shape[1])], dim=1)
        return f


class RowSliceSampler(LogitsProcessor):
    """transformers' multinomial draw done for rows ``[start, start + B)`` of a batch of ``total`` rows.

    ``torch.multinomial(p, 1)`` is ``argmax(p / q)`` with ``q ~ Exp(1)`` drawn like ``p``; this processor draws
    ``q`` for the whole ``(total, V)`` batch from its own generator (seeded with the seed ``generate`` seeds
    transformers' sampler with), keeps this call's rows, picks ``argmax(softmax(scores) / q)`` and returns
    scores that put all mass on that token, so transformers' own draw can only confirm it. Each row's token
    then depends on its place in the whole batch, not on which rows share the call (data-parallel
    sampling), and a call with every row (``start = 0``, ``total = B``) draws the numbers transformers would.
    transformers runs custom processors before its temperature and top-p warpers, so this one applies those
    warpers itself (the same classes, in transformers' order) and must come after every other custom
    processor; the warpers then leave its one-token distribution unchanged.
    """

    def __init__(self, seed: int, start: int, total: int, temperature: float = 1.0, top_p: float = 1.0):
        self.seed, self.start, self.total = seed, start, total
        self.generator: torch.Generator | None = None
        self.warpers = LogitsProcessorList()
        if temperature != 1.0:
            self.warpers.append(TemperatureLogitsWarper(temperature))
        if top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p))

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        B, V = scores.shape
        if not 0 <= self.start <= self.start + B <= self.total:
            raise ValueError(f"rows {self.start}..{self.start + B} do not lie in a batch of {self.total}")
        if self.generator is None:
            self.generator = torch.Generator(device=scores.device).manual_seed(self.seed)
        probs = torch.softmax(self.warpers(input_ids, scores), dim=-1)  # (B, V), as transformers' sampling step
        q = torch.empty((self.total, V), dtype=probs.dtype, device=scores.device).exponential_(
            1, generator=self.generator)[self.start : self.start + B]  # (B, V)
        token = (probs / q).argmax(dim=-1)  # (B,)
        return torch.full_like(scores, float("-inf")).scatter_(1, token[:, None], 0.0)


@dataclass
class AutoregressivePolicy:
    """A causal LM as a policy: exact token log-probs and entropies, sampling with ``generate``.

    Attributes:
        model: a ``transformers`` causal LM (``AutoModelForCausalLM``; may be wrapped by accelerate).
        tokenizer: its tokenizer (left padding), or ``None``.
        eos_token_id: the EOS id (``None`` when the model has none: completions then end only at
            ``max_new_tokens``).
        pad_token_id: the id written after EOS (the EOS id when the tokenizer has no pad token).
        stop_token_ids: every id that ends a completion (EOS plus the generation config's ``eos_token_id``
            list, e.g. an end-of-turn token).
        kind: ``"ar"`` (the diffusion policy is the masked-diffusion kind).
    """

    model: nn.Module
    tokenizer: Any
    eos_token_id: int | None
    pad_token_id: int
    stop_token_ids: tuple[int, ...] = ()
    kind: str = field(default="ar", init=False)

    def __post_init__(self) -> None:
        if not self.stop_token_ids and self.eos_token_id is not None:
            self.stop_token_ids = (int(self.eos_token_id),)
        params = inspect.signature(_unwrap(self.model).forward).parameters
        self._keeps_logits = "logits_to_keep" in params
        self._takes_positions = "position_ids" in params or any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def parameters(self):
        return self.model.parameters()

    def token_logprobs(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        completion: torch.Tensor,
        completion_mask: torch.Tensor,
        temperature: float | torch.Tensor = 1.0,
        logits_chunk: int | None = None,
        entropy: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Exact ``log p(y_t | q, y_<t)`` of each completion token and the entropy of each prediction.

        One forward pass over ``[prompt | completion]``; the logits at position ``P − 1 + t`` predict
        ``y_t``. Positions are counted over real prompt tokens, so left padding never changes a row. With
        ``logits_chunk`` the model's output head (``get_output_embeddings()``) is tapped and run only on the
        hidden states of the ``completion_mask`` positions, that many at a time, recomputed in the backward
        (:mod:`dlmrl.models.token_scores`): no ``(B, L, V)`` float32 logits; the same values up to float rounding.

        Args:
            prompt_ids: ``(B, P)`` long, left-padded; ``prompt_mask`` ``(B, P)`` bool, True on real tokens.
            completion: ``(B, L)`` long; ``completion_mask`` ``(B, L)`` bool, the tokens to score (up to
                and including EOS); tokens after the mask never influence scored ones (causal attention).
            temperature: logits are divided by it before the softmax: a float, or ``(B, L)`` per-token
                temperatures (e.g. the sampling temperatures of an adaptive sampler). 1 = the model's
                own distribution.
            logits_chunk: positions per output-head call (``estimator.logits_chunk``); ``None`` or 0 = full logits,
                as does a model whose head cannot be tapped (none named by ``get_output_embeddings()``).
            entropy: also compute the entropies (``False``: the second value is ``None``).
        Returns:
            ``logp`` ``(B, L)`` nats (differentiable) and ``entropy`` ``(B, L)`` nats (``−Σ_v p log p`` of the
            same distribution, detached) or ``None``, float32 (float64 for a float64 model); both 0 outside
            ``completion_mask``.
        Raises:
            HeadTapError: with ``logits_chunk``, a model whose forward changes its head's output (a soft cap, a
                logit scale), naming ``estimator.logits_chunk``.
        Reference: GRPO arXiv 2402.03300 (token ratio inputs).
        """
        _check_left_padded(prompt_mask)
        length = completion.shape[1]
        input_ids = torch.cat([prompt_ids, completion], dim=1)  # (B, P+L)
        attention_mask = torch.cat([prompt_mask.bool(), torch.ones_like(completion, dtype=torch.bool)], dim=1)
        extra = {"logits_to_keep": length + 1} if self._keeps_logits else {}
        if self._takes_positions:  # (a model without position ids must handle left padding itself)
            extra["position_ids"] = position_ids_from_mask(attention_mask)
        mask = completion_mask.bool()
        head = hf_output_head(self.model) if logits_chunk else None
        if head is not None:
            request = self._head_request(completion, mask, input_ids.shape[1], temperature, logits_chunk, entropy)
            with tap_head(unwrap_model(self.model), head, request):
                out = self.model(input_ids=input_ids, attention_mask=attention_mask.long(), use_cache=False, **extra)
            stats = out.logits[:, -(length + 1) : -1]  # (B, L, 2): position P-1+t scores y_t
            return stats[..., STAT_LOGP], stats[..., STAT_ENTROPY].detach() if entropy else None
        out = self.model(input_ids=input_ids, attention_mask=attention_mask.long(), use_cache=False, **extra)
        logits = out.logits[:, -(length + 1) : -1]  # (B, L, V): position P-1+t predicts y_t
        logp, ent = token_logprobs_from_logits(logits, completion, temperature, entropy=entropy)
        return torch.where(mask, logp, 0.0), torch.where(mask, ent, 0.0) if entropy else None

    def _head_request(self, completion: torch.Tensor, mask: torch.Tensor, total: int,
                      temperature: float | torch.Tensor, chunk: int, entropy: bool) -> HeadRequest:
        """The request for the head's input positions: the last ``L + 1`` with ``logits_to_keep`` (else all
        ``P + L``), position ``P − 1 + t`` scoring ``y_t`` on ``completion_mask``."""
        width = completion.shape[1] + 1 if self._keeps_logits else total
        b, length = completion.shape
        target = completion.new_zeros(b, width)
        scored = mask.new_zeros(b, width)
        lo = width - length - 1  # (the head position that predicts y_0)
        target[:, lo : lo + length], scored[:, lo : lo + length] = completion, mask
        temps = temperature
        if isinstance(temperature, torch.Tensor):
            temps = torch.ones(b, width, dtype=temperature.dtype, device=temperature.device)
            temps[:, lo : lo + length] = temperature
        return HeadRequest(target, scored, chunk, temps, None, entropy)

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        generator: torch.Generator | int | None = None,
        temperature_fn: TemperatureFn | StepTemperatureProcessor | None = None,
        noise_rows: tuple[int, int] | None = None,
        stopping_criteria: list | None = None,
    ) -> ARRollout:
        """Sample completions with ``model.generate``.

        Args:
            prompt_ids: ``(B, P)`` long, left-padded; ``prompt_mask`` ``(B, P)`` bool.
            max_new_tokens: completion length ``L`` (the output is padded to exactly ``L`` columns).
            temperature: 0 = greedy (argmax); > 0 samples from ``softmax(logits / T)``.
            top_p: nucleus cut-off in (0, 1]; 1 = none. No top-k, repetition penalty or other processor
                is applied (the checkpoint's generation defaults are ignored).
            generator: an ``int`` seed, or a ``torch.Generator`` from which a seed is drawn; the sampler
                itself draws from torch's *global* RNG (transformers' sampling does), so it is seeded
                with that value inside and the caller's global RNG state is restored after. ``None``
                uses the global RNG as it stands (and advances it).
            temperature_fn: a per-step temperature hook (see :class:`StepTemperatureProcessor`; pass the
                processor itself to read the factors it applied afterwards); the effective temperature is
                ``T · f_t``. Ignored when ``temperature == 0``.
            noise_rows: ``(start, total)``: the ``B`` prompts are rows ``[start, start + B)`` of a batch of
                ``total`` sampled together (one process's share of a data-parallel batch); each row's random
                numbers are those it has in the whole batch (:class:`RowSliceSampler`; ``generator`` must
                then be given), so the rows come out as in one call with the whole batch. ``None``: this
                call's rows are the batch.
            stopping_criteria: transformers ``StoppingCriteria`` (each ``(input_ids, scores) -> (B,) bool``) that end
                rows early besides the stop tokens (e.g. a tool call's closing line,
                :mod:`dlmrl.training.tool_loop`); a row they end is padded with the pad id, and the caller cuts it
                (the mask still runs to the first stop token or the end).
        Returns:
            :class:`ARRollout` ``(completion (B, L) long, completion_mask (B, L) bool)``: the mask covers
            the tokens up to and including the first stop token; pad id after it. The number of forward
            passes is ``completion_mask.sum(-1).max()`` (``generate`` stops when every row has ended).
        Raises:
            ValueError: on ``max_new_tokens < 1``, ``temperature < 0``, ``top_p`` outside (0, 1], or prompts
                that are not left-padded.
        """
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        _check_left_padded(prompt_mask)
        model = _unwrap(self.model)
        sample = temperature > 0
        gc = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=sample, num_beams=1, use_cache=True,
                              eos_token_id=list(self.stop_token_ids) or None, pad_token_id=self.pad_token_id)
        if sample:
            gc.update(temperature=float(temperature), top_p=float(top_p), top_k=0)
        processors = LogitsProcessorList()
        if sample and temperature_fn is not None:
            proc = (temperature_fn if isinstance(temperature_fn, StepTemperatureProcessor)
                    else StepTemperatureProcessor(temperature_fn))
            processors.append(proc)
        seed = _seed_from(generator)
        if sample and noise_rows is not None:
            if seed is None:
                raise ValueError("noise_rows needs a generator or a seed")
            processors.append(RowSliceSampler(seed, *noise_rows, temperature=float(temperature), top_p=float(top_p)))
        with _blank_generation_config(model), _seeded(seed, prompt_ids.device):
            out = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask.long(), generation_config=gc,
                                 logits_processor=processors or None,
                                 stopping_criteria=StoppingCriteriaList(stopping_criteria or []))
        return self._finish(out[:, prompt_ids.shape[1] :], max_new_tokens)

    def _finish(self, generated: torch.Tensor, length: int) -> ARRollout:
        """Mask after the first stop token, pad with the pad id to ``length`` columns."""
        stops = torch.tensor(self.stop_token_ids, dtype=torch.long, device=generated.device)
        is_stop = torch.isin(generated, stops).long()  # (B, L')
        mask = (is_stop.cumsum(-1) - is_stop) == 0  # True up to and including the first stop
        completion = torch.where(mask, generated, self.pad_token_id)
        missing = length - generated.shape[1]
        if missing > 0:
            completion = torch.cat([completion, completion.new_full((len(completion), missing), self.pad_token_id)], 1)
            mask = torch.cat([mask, mask.new_zeros(len(mask), missing)], 1)
        return ARRollout(completion, mask)


# -- HAPO's adaptive temperature ---------------------------------------------------------------


class HapoTemperature:
    """HAPO's adaptive temperature factor ``f_t = 1 + τ·ĥ_t`` for :class:`StepTemperatureProcessor`.

    ``ĥ_t`` is the normalised entropy of the current step's next-token distribution (at temperature 1),
    normalised with ``stats`` from the previous training step's rollouts by the same rule the loss uses
    (:meth:`dlmrl.objectives.entropy.HapoEntropyStats.normalize`, via
    :func:`~dlmrl.objectives.entropy.hapo_temperature`); the sampling temperature is ``T_t = T · (1 + τ·ĥ_t)``.
    With ``stats=None`` (the first step) the factor is 1.

    Args:
        stats: :class:`~dlmrl.objectives.entropy.HapoEntropyStats` or ``None``. tau: ``τ`` (0.05 in HAPO).
    Call: ``(input_ids (B, T) long, scores (B, V) float) -> (B,)`` float32 factors.
    Reference: HAPO arXiv 2509.16591, adaptive temperature sampling (τ = 0.05).
    """

    def __init__(self, stats: HapoEntropyStats | None, tau: float = 0.05):
        self.stats, self.tau = stats, tau

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.stats is None:
            return torch.ones(scores.shape[0], device=scores.device)
        entropy = torch.special.entr(scores.float().softmax(-1)).sum(-1)  # (B,)
        return hapo_temperature(entropy, self.stats, 1.0, self.tau)


# -- building and loading ----------------------------------------------------------------------


def build_tiny_causal_model(vocab_size: int, hidden_size: int = 64, num_layers: int = 4, num_heads: int = 4,
                            intermediate_size: int = 192, max_positions: int = 128, seed: int = 0,
                            bos_token_id: int | None = None, eos_token_id: int | None = None,
                            pad_token_id: int | None = None) -> LlamaForCausalLM:
    """A freshly initialised causal Llama (the AR counterpart of ``build_tiny_model``), float32.

    Position ``i`` predicts token ``i + 1`` (the usual causal-LM shift).
    """
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                         num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_heads,
                         max_position_embeddings=max_positions, tie_word_embeddings=True, attn_implementation="sdpa",
                         bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                                               pad_token_id=pad_token_id)
    return model


def _stop_ids(tokenizer, model: nn.Module) -> tuple[int, ...]:
    ids: list[int] = []
    for value in (tokenizer.eos_token_id, getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        for i in value if isinstance(value, (list, tuple)) else [value]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    return tuple(ids)


def load_ar_policy(name_or_path: str = TINY_AR_DEFAULT, trust_remote_code: bool = False, dtype: str = "float32",
                   device: str | torch.device = "cpu", adapter_kinds: tuple[str, ...] = ("ar",)) -> AutoregressivePolicy:
    """Load a causal LM and its tokenizer as an :class:`AutoregressivePolicy`.

    Args:
        name_or_path: a local folder, a hub id, or ``"tiny-sudoku-ar"`` for the shipped default. A folder
            holding a LoRA adapter (``adapter_config.json``, as a LoRA run's ``final_model/``) loads its base
            (named by ``dlmrl_base_model.json`` or ``adapter_config.json``) with these arguments and puts the
            adapter on it (a ``peft.PeftModel``, adapter frozen).
        trust_remote_code: passed to ``from_pretrained`` only as given (never forced on).
        dtype: ``float32``, ``bfloat16`` or ``float16``.
        adapter_kinds: the policy kinds whose LoRA adapters this call loads (default ``ar``; a kind of your own
            that runs causal LMs passes its name).
    The tokenizer is switched to left padding; a tokenizer without a pad token pads with EOS. A Nemotron-Labs-Diffusion
    checkpoint (``config.json`` read first) loads its own code through
    :func:`dlmrl.models.nemotron_diffusion.load_nemotron_causal`: the same weights run causally.
    Raises:
        ValueError: unknown dtype, a local folder without safetensors weights (only safetensors are
            loaded), a tokenizer with neither pad nor EOS token, or an adapter trained as a kind not in
            ``adapter_kinds``.
        FileNotFoundError: a local-looking path that does not exist.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in DTYPES:
        raise ValueError(f"model.dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    adapter = find_adapter(name_or_path)
    if adapter is not None:
        check_adapter_kind(adapter, adapter_kinds)
        policy = load_ar_policy(adapter.base_model_name_or_path, trust_remote_code, dtype, device, adapter_kinds)
        policy.model = attach_adapter(policy.model, adapter).to(device)
        return policy
    path = resolve_ar_model_path(name_or_path)
    local = Path(path)
    if looks_local(path) and not local.exists():
        raise FileNotFoundError(f"model path {path!r} does not exist")
    if local.is_dir() and not any(local.glob("*.safetensors")):
        raise ValueError(f"{path}: no *.safetensors weights; only safetensors checkpoints are loaded")
    from dlmrl.models.nemotron_diffusion import load_nemotron_causal, nemotron_config

    if nemotron_config(path) is not None:  # (the same weights as the block kind, run causally)
        if not trust_remote_code:
            raise ValueError(f"{path}: this Nemotron-Labs-Diffusion checkpoint ships its own model code, and loading it "
                             "runs that code: set model.trust_remote_code=true if you trust its source")
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        model = load_nemotron_causal(path, trust_remote_code, DTYPES[dtype]).to(device)
        return ar_policy_from_model(model, tokenizer, label=path)
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=trust_remote_code, dtype=DTYPES[dtype],
                                                 use_safetensors=True).to(device)
    return ar_policy_from_model(model, tokenizer, label=path)


def ar_policy_from_model(model: nn.Module, tokenizer, label: str | None = None) -> AutoregressivePolicy:
    """An already-loaded causal LM and its tokenizer as a policy (what :func:`load_ar_policy` does after loading):
    the tokenizer switched to left padding, EOS as padding when it has no pad token, the stop ids from the
    tokenizer and the generation config.

    Raises:
        ValueError: a tokenizer with neither a pad nor an EOS token (naming ``label``, default the model's path).
    """
    tokenizer.padding_side = "left"
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        label = label or getattr(getattr(model, "config", None), "_name_or_path", None) or type(model).__name__
        raise ValueError(f"{label}: the tokenizer has neither a pad nor an EOS token")
    return AutoregressivePolicy(model=model, tokenizer=tokenizer, eos_token_id=tokenizer.eos_token_id,
                                pad_token_id=int(pad), stop_token_ids=_stop_ids(tokenizer, model))
