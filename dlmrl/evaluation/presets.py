"""Sampling protocols of the papers as presets (``eval.preset``), and the settings an evaluation actually uses.

| preset | gen lengths | steps | block | temperature | shots | protocol | source |
|---|---|---|---|---|---|---|---|
| ``d1`` | 128, 256, 512 | gen_length / 2 | 32 | 0 (greedy) | 0 | ``d1`` | d1 ``eval/eval.py`` (``diffusion_steps = gen_length // 2``, ``block_length`` 32, ``temperature`` 0, ``few_shot`` 0), ``eval/run_eval.sh`` |
| ``spg`` | 128, 256, 512 | gen_length / 2 | 32 | 0 | 0 | ``d1`` | SPG (facebookresearch/SPG) ``eval/eval.py``, ``eval/sbatch_eval_llada.sh`` (d1's settings) |
| ``gdpo`` | 128, 256, 512 | gen_length | 32 | 0 | 0 | ``d1`` | GDPO (arXiv 2510.08554): steps = gen_length, otherwise d1's protocol (as dlmrl issue 14 reports it; GDPO's evaluation code was not read) |

A preset decides the gen lengths ``dlmrl eval`` runs (``--gen-lengths`` overrides them), the steps at each length,
the block length and the temperature; ``eval.steps``, ``eval.temperature`` and ``sampling.block_length`` are then
not used for evaluation (training rollouts keep ``sampling``). ``eval.protocol`` set explicitly wins over the
preset's protocol. Every preset is zero-shot (SPG evaluates its own Sudoku split 3-shot; that is not reproduced).
Papers quote each length; ``dlmrl eval`` also prints the best of the lengths and their mean.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["PRESETS", "EvalPreset", "EvalSettings", "eval_settings", "preset_steps"]


@dataclass(frozen=True)
class EvalPreset:
    """One paper's sampling protocol (module table)."""

    name: str
    gen_lengths: tuple[int, ...]
    steps_divisor: int  # steps = gen_length // steps_divisor
    block_length: int
    temperature: float
    few_shot: int
    protocol: str
    source: str


PRESETS = {
    "d1": EvalPreset("d1", (128, 256, 512), 2, 32, 0.0, 0, "d1", "d1 eval/eval.py, eval/run_eval.sh"),
    "spg": EvalPreset("spg", (128, 256, 512), 2, 32, 0.0, 0, "d1", "SPG eval/eval.py, eval/sbatch_eval_llada.sh"),
    "gdpo": EvalPreset("gdpo", (128, 256, 512), 1, 32, 0.0, 0, "d1", "GDPO arXiv 2510.08554 (steps = gen_length)"),
}


def preset_steps(preset: EvalPreset, gen_length: int) -> int:
    """The preset's steps at ``gen_length`` (d1: ``gen_length // 2``)."""
    return max(1, gen_length // preset.steps_divisor)


def preset_length_problem(preset: EvalPreset, gen_length: int) -> str | None:
    """Why the diffusion sampler cannot decode ``gen_length`` tokens with ``preset``'s blocks and steps (``None``:
    it can): the length must be a multiple of the block length, and the steps split evenly over the blocks."""
    steps, blocks = preset_steps(preset, gen_length), gen_length // preset.block_length
    if gen_length % preset.block_length or steps % max(blocks, 1):
        return (f"it decodes in blocks of {preset.block_length} with {steps} steps at gen_length {gen_length}; use "
                f"a multiple of {preset.block_length}")
    return None


@dataclass(frozen=True)
class EvalSettings:
    """What one held-out evaluation runs with (it goes into the result's record). Evaluation always decodes with
    ``low_confidence`` remasking and no classifier-free guidance (as d1), whatever ``sampling`` says."""

    protocol: str
    preset: str
    gen_length: int
    steps: int
    block_length: int
    temperature: float
    few_shot: int
    remasking: str
    cfg_scale: float
    num_puzzles: int
    batch_size: int
    seed: int

    def as_dict(self) -> dict:
        return asdict(self)


def eval_settings(cfg, gen_length: int | None = None) -> EvalSettings:
    """The settings of a held-out evaluation of config ``cfg`` at ``gen_length`` (default: ``sampling.gen_length``;
    the tiny Sudoku task's 16-cell canvas has its own): the preset's where ``eval.preset`` names one, else the
    ``eval`` section's steps and temperature with ``sampling.block_length``."""
    ev, s = cfg.eval, cfg.sampling
    length = gen_length or s.gen_length
    preset = PRESETS.get(ev.preset)
    protocol = ev.protocol or (preset.protocol if preset else "strict")
    common = {"protocol": protocol, "preset": ev.preset, "gen_length": length, "remasking": "low_confidence",
              "cfg_scale": 0.0, "num_puzzles": ev.num_puzzles, "batch_size": ev.batch_size,
              "seed": cfg.train.seed}
    if preset is None:
        return EvalSettings(steps=ev.steps, block_length=s.block_length, temperature=ev.temperature, few_shot=0,
                            **common)
    return EvalSettings(steps=preset_steps(preset, length), block_length=preset.block_length,
                        temperature=preset.temperature, few_shot=preset.few_shot, **common)
