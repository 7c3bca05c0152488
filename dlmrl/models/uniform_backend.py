"""The seam a rollout backend for ``model.kind: uniform`` plugs into (e.g. vLLM serving DiffusionGemma).

dlmrl's RL path reads a rollout through one call, :meth:`UniformRolloutBackend.sample` (what
:func:`dlmrl.training.uniform_trajectory.rollout_uniform` calls on the policy), and one container,
:class:`~dlmrl.models.uniform_sampler.UniformSampleOutput`. Of that container it reads only the fields named here
(:data:`OUTPUT_FIELDS`, :data:`SETTINGS_FIELDS`, :data:`CANVAS_FIELDS`; :func:`dlmrl.training.uniform_trajectory.record_of`
and ``completion_of``); the others (``entropies``, ``stopped``, ``final_canvas``, ``final_logprobs``,
``finished_before``, ``remaining``, ``decoder_calls``, ...) are diagnostics. A backend that runs the sampler
elsewhere (another process, an inference server) returns an object with these fields, and the likelihood replays it
under the training weights (:func:`~dlmrl.training.uniform_trajectory.trajectory_logprobs`): the recorded
log-probs are the behaviour policy's, the replay's are the current policy's, and their gap at equal weights is the
``rollout_logp_gap`` the trainer logs. :func:`check_backend_output` checks the shapes and dtypes a backend returns.

(dlmrl interpretation: the split into what the ratio needs and what is diagnostic is ours, read off the code above.)
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

#: :class:`~dlmrl.models.uniform_sampler.UniformSampleOutput` fields the RL path reads
OUTPUT_FIELDS = ("sequences", "completions", "prompt_length", "canvases", "decoder_forward_passes", "settings")
#: fields of ``output.settings`` it reads
SETTINGS_FIELDS = ("canvas_length", "max_denoising_steps")
#: :class:`~dlmrl.models.uniform_sampler.CanvasRecord` fields it reads, per canvas (``S`` steps, ``B`` rows,
#: ``L`` canvas positions): name → (dims, dtype kind)
CANVAS_FIELDS = {
    "input_canvases": ("SBL", "long"),   # the canvas fed to the decoder at each step (the replay's input)
    "drawn": ("SBL", "long"),            # the token drawn at every position
    "accepted": ("SBL", "bool"),         # the positions the entropy bound kept
    "logprobs": ("SBL", "float"),        # log softmax(logits / τ)[drawn], the behaviour policy's log-probs
    "temperatures": ("S", "float"),      # τ of each step
    "active": ("SB", "bool"),            # the row was still denoising at the step
    "final_is_draw": ((), "bool"),       # the appended canvas is the last step's draw (else its argmax)
    "num_steps": ((), "int"),            # S, the steps run for the batch
}


@runtime_checkable
class UniformRolloutBackend(Protocol):
    """What :func:`~dlmrl.training.uniform_trajectory.rollout_uniform` calls to sample: the policy itself
    (:class:`~dlmrl.models.uniform_policy.UniformNoisePolicy`, dlmrl's own sampler) or any object with this method
    and the policy's ``canvas_length``, ``eos_token_id``, ``pad_token_id`` and ``device``.

    ``sample(prompt_ids (B, P) long left-padded, prompt_mask (B, P) bool, max_new_tokens, *, seed, draw_last_step,
    **settings)`` returns an object with :data:`OUTPUT_FIELDS` (a ``UniformSampleOutput`` or the like), the whole
    batch sampled with the one ``seed``; ``settings`` are the ``sampling`` keys of
    :func:`~dlmrl.training.uniform_trajectory.sampler_settings` (``max_denoising_steps``, ``entropy_bound``,
    ``t_min``, ``t_max``, ``stability_threshold``, ``confidence_threshold``).
    """

    canvas_length: int
    eos_token_id: int | None
    pad_token_id: int

    def sample(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, max_new_tokens: int, *,
               seed: int | None = None, draw_last_step: bool = False, **settings): ...


_DTYPES = {"long": (torch.int64,), "bool": (torch.bool,), "float": (torch.float16, torch.bfloat16, torch.float32,
                                                                     torch.float64)}


def check_backend_output(out, batch_size: int, prompt_length: int) -> None:
    """Check that a backend's output has what the ratio reads, with consistent shapes and dtypes.

    Args:
        out: the object ``sample`` returned.
        batch_size: ``B``, the rows asked for; prompt_length: ``P``.
    Raises:
        ValueError: a missing field, or one of the wrong shape or dtype (naming it and the canvas).
    """
    for name in OUTPUT_FIELDS:
        if not hasattr(out, name):
            raise ValueError(f"rollout backend output: no field {name!r} (needed: {', '.join(OUTPUT_FIELDS)})")
    for name in SETTINGS_FIELDS:
        if not hasattr(out.settings, name):
            raise ValueError(f"rollout backend output: settings has no {name!r}")
    L, N = int(out.settings.canvas_length), int(out.settings.max_denoising_steps)
    if int(out.prompt_length) != prompt_length:
        raise ValueError(f"rollout backend output: prompt_length {out.prompt_length} != the prompts' {prompt_length}")
    C = len(out.canvases)
    if tuple(out.sequences.shape) != (batch_size, prompt_length + C * L) or out.sequences.dtype != torch.int64:
        raise ValueError(f"rollout backend output: sequences must be (B, P + C·L) = "
                         f"{(batch_size, prompt_length + C * L)} int64, got {tuple(out.sequences.shape)} "
                         f"{out.sequences.dtype}")
    if not torch.equal(out.completions, out.sequences[:, prompt_length:]):
        raise ValueError("rollout backend output: completions must be sequences[:, prompt_length:]")
    if tuple(out.decoder_forward_passes.shape) != (batch_size,):
        raise ValueError(f"rollout backend output: decoder_forward_passes must be ({batch_size},)")
    for c, rec in enumerate(out.canvases):
        steps = int(rec.temperatures.shape[0]) if hasattr(rec, "temperatures") else 0
        if not 1 <= steps <= N:
            raise ValueError(f"rollout backend output: canvas {c} has {steps} steps; expected 1..{N} "
                             "(max_denoising_steps)")
        size = {"S": steps, "B": batch_size, "L": L}
        for name, (dims, kind) in CANVAS_FIELDS.items():
            if not hasattr(rec, name):
                raise ValueError(f"rollout backend output: canvas {c} has no field {name!r}")
            value = getattr(rec, name)
            if dims == ():
                ok = isinstance(value, bool) if kind == "bool" else (type(value) is int and value == steps)
                if not ok:
                    raise ValueError(f"rollout backend output: canvas {c} {name} must be "
                                     f"{'a bool' if kind == 'bool' else f'the int {steps} (its steps)'}, got {value!r}")
                continue
            want = tuple(size[d] for d in dims)
            if tuple(value.shape) != want or value.dtype not in _DTYPES[kind]:
                raise ValueError(f"rollout backend output: canvas {c} {name} must be {dims} = {want} {kind}, got "
                                 f"{tuple(value.shape)} {value.dtype}")
