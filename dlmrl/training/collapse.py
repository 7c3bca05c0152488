"""The collapse monitor: a warning (and, opt-in, a resumable stop) when the policy's negative log-likelihood of its
own samples or its KL to the reference rises far above its running baseline, or (``direction`` ``fall`` / ``both``)
that likelihood's NLL falls far below it.

NVIDIA's RL work on diffusion LMs (NeMo RL, pull request 3167) reports DiffuGRPO and coupled-GRPO collapsing under
full fine-tuning with KL 0: the entropy of the policy's own samples blows up, driven by negative advantages, and
the outputs turn to gibberish within 50-120 steps, while the reward has not yet fallen much. The monitor watches
two series the trainer logs every step:

- ``sample_nll``: the mean negative log-likelihood per token of the step's own samples under the distribution
  they were drawn from, a Monte Carlo estimate of the sampling entropy per token: the sampler's recorded log-probs
  where the rollout carries them (the diffusion kinds' samplers, the uniform sampler), else the scorer's
  old-policy scores (the AR kind's exact token log-probs);
- ``kl``: the objective's KL estimate toward its reference, when the run has one (β > 0).

**Rule** (dlmrl interpretation; NVIDIA gives no threshold): a value fires when it exceeds ``ratio`` times its
baseline, the median of the previous ``window`` steps' values (robust to single spikes; nothing fires before
``window`` steps are seen), and the baseline is above its series' floor (:data:`FLOORS`: a KL grows from 0 as any
run starts to move, so a KL baseline below 0.05 nats per token is not one to multiply).
It detects an onset: a rise that lasts becomes the baseline after about ``window / 2`` steps.

``direction`` (``train.collapse_direction``) says which way ``sample_nll`` is watched: ``"rise"`` (above),
``"fall"`` (below its baseline divided by ``ratio``: the opposite failure, the policy's entropy collapsing onto a few
outputs, Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models", arXiv
2505.22617, which is what the shipped tiny diffusion model does under full fine-tuning at a high learning rate,
``benchmarks/collapse.py``), or ``"both"``. ``kl`` is watched for rises under ``"rise"`` and ``"both"`` (a KL that
falls is no failure); ``"fall"`` watches the entropy collapse alone, because a KL toward the initial model grows
steadily in a healthy run and a ratio small enough to catch that collapse early (the benchmark's 1.25) fires on that
growth. The warning names
the step and the series once per episode (consecutive firing steps); with ``stop`` the trainer
ends the run after that step's checkpoint (``summary.json``'s ``stop_reason`` ``collapse``), which ``--resume``
continues.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from dlmrl.config.schema import COLLAPSE_DIRECTIONS

#: the series the monitor watches, in the order it reports them
SERIES = ("sample_nll", "kl")
#: the directions :class:`CollapseMonitor` watches (``train.collapse_direction``)
DIRECTIONS = COLLAPSE_DIRECTIONS
#: per series, a baseline below this is not multiplied: a KL starts at 0 and grows while the first steps move the
#: policy (0.004 -> 0.08 nats per token over steps 3-5 of the tiny AR recipe), which is no collapse; the collapses of
#: our probes went from 0.1-0.4 to 7-13 (ours)
FLOORS = {"sample_nll": 1e-3, "kl": 0.05}


def watched(direction: str) -> dict[str, tuple[str, ...]]:
    """Per series of :data:`SERIES`, the ways it fires under ``direction`` (``"rise"``: above ``ratio x`` its
    baseline, ``"fall"``: below ``baseline / ratio``; empty: not watched). A KL that falls is no failure, and
    ``"fall"`` leaves the KL alone (module docstring)."""
    return {"sample_nll": {"rise": ("rise",), "fall": ("fall",), "both": ("rise", "fall")}[direction],
            "kl": () if direction == "fall" else ("rise",)}


@dataclass
class CollapseMonitor:
    """Running baselines of :data:`SERIES` and the firing rule (module docstring).

    Args:
        window: steps in the running baseline (``train.collapse_window``; 0 = off).
        ratio: a value above ``ratio`` x its baseline fires (``train.collapse_ratio``, > 1).
        stop: stop the run after a firing step's checkpoint (``train.stop_on_collapse``).
        direction: ``"rise"`` (NVIDIA's failure: ``sample_nll`` above ``ratio x baseline``), ``"fall"``
            (``sample_nll`` below ``baseline / ratio``, alone) or ``"both"``; ``kl`` fires on rises under ``"rise"``
            and ``"both"`` (``train.collapse_direction``; module docstring).

    Raises:
        ValueError: ``direction`` is not one of :data:`DIRECTIONS`.
    """

    window: int = 20
    ratio: float = 3.0
    stop: bool = False
    direction: str = "rise"
    history: dict = field(default_factory=dict)
    firing: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"collapse direction must be one of {DIRECTIONS}, got {self.direction!r}")

    def observe(self, step: int, record: dict) -> tuple[dict, str | None]:
        """Update with step ``step``'s metrics ``record``. Returns ``(fields, warning)``: the fields to log
        (``<series>_baseline`` for each watched series with a baseline, ``collapse``: whether any fired) and the
        warning text when a series starts firing (``None`` otherwise)."""
        if self.window <= 0:
            return {}, None
        fields, started = {}, []
        fired = False
        for name in SERIES:
            value = record.get(name)
            past = self.history.setdefault(name, [])
            baseline = statistics.median(past) if len(past) >= self.window else None
            if baseline is not None:
                fields[f"{name}_baseline"] = baseline
            usable = value is not None and baseline is not None and baseline > FLOORS[name]
            ways = watched(self.direction)[name]
            rose = usable and "rise" in ways and value > self.ratio * baseline
            fell = usable and "fall" in ways and value * self.ratio < baseline
            now = rose or fell
            if now and not self.firing.get(name):
                started.append(f"{name} {value:.4g} is {value / baseline:.2f}x its running baseline {baseline:.4g} "
                               f"(median of the previous {self.window} steps"
                               + ("; a fall: the policy's entropy collapsing)" if fell else ")"))
            self.firing[name] = now
            fired = fired or now
            if value is not None:
                past.append(float(value))
                del past[:-self.window]
        fields["collapse"] = fired
        warning = None
        if started:
            warning = (f"step {step}: possible collapse: {'; '.join(started)}. "
                       + ("NVIDIA reports diffusion RL under full fine-tuning with KL 0 turning to gibberish within "
                          "50-120 steps of such a rise" if any("a fall" not in w for w in started) else
                          "A policy whose entropy collapses writes the same few outputs whatever their reward")
                       + "; consider a KL term (train.beta), a reference that follows the policy, a lower learning "
                       "rate or LoRA"
                       + (". Stopping (train.stop_on_collapse): the checkpoint of this step is saved; --resume "
                          "continues" if self.stop else " (train.stop_on_collapse: true stops here)"))
        return fields, warning

    def state_dict(self) -> dict:
        return {"history": {k: list(v) for k, v in self.history.items()}, "firing": dict(self.firing)}

    def load_state_dict(self, state: dict) -> None:
        self.history = {k: list(v) for k, v in (state or {}).get("history", {}).items()}
        self.firing = dict((state or {}).get("firing", {}))
