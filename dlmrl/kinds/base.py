"""The :class:`PolicyKind` interface: what a kind of policy (``model.kind``) decides, and the registry of kinds.

A policy kind is one way a language model writes and scores a completion: full-attention masked diffusion
(``diffusion``, :mod:`dlmrl.kinds.masked`), block diffusion (``block``, :mod:`dlmrl.kinds.block`) or a causal LM
(``ar``, :mod:`dlmrl.kinds.causal`). The config check, ``--dry-run``, the trainer, evaluation, the Python API and
the CLI ask the kind object of ``model.kind`` (:func:`kind_of`) instead of comparing the name; a new kind is a new
module with a subclass and a ``KINDS.register(name)(instance)`` line (README, "Extending dlmrl"), loaded like any
other plugin (``--import``, the ``dlmrl.plugins`` entry point).

The base class holds the defaults a kind inherits; the abstract methods are what every kind must say.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from dlmrl.errors import ConfigError
from dlmrl.registry import Registry

__all__ = ["KINDS", "PolicyKind", "check_key", "check_nemotron_paradigm", "find_kind", "is_policy", "kind_names",
           "kind_of", "policy_kind", "refuse_claimed_checkpoint", "refuse_other_kinds_keys", "warn_key"]

def check_key(cond: bool, key: str, msg: str) -> None:
    """Raise ``ConfigError("config key '<key>': <msg>")`` unless ``cond`` (the config check's one refusal form; the
    CLI adds the file and line of the key)."""
    if not cond:
        raise ConfigError(f"config key {key!r}: {msg}")


def warn_key(msg: str, stacklevel: int = 4) -> None:
    """A ``UserWarning`` from a kind's config check (attributed to the caller of :func:`dlmrl.config.validate`)."""
    import warnings

    warnings.warn(msg, UserWarning, stacklevel=stacklevel)


def refuse_other_kinds_keys(cfg) -> None:
    """Refuse a ``sampling`` key that another registered kind reads only (its :attr:`PolicyKind.sampling_keys`) when it
    is set (null, and false, pass) on a config whose ``model.kind`` does not read it.

    Raises:
        ConfigError: naming the key and the kind that reads it.
    """
    s, mine = cfg.sampling, cfg.model.kind
    for name in KINDS.names():
        other = KINDS.get(name)
        if name == mine or (mine in KINDS and KINDS.get(mine).sampling_keys is other.sampling_keys):
            continue
        for key in other.sampling_keys:
            value = getattr(s, key, None)
            check_key(value is None or value is False, f"sampling.{key}",
                      f"is a setting of model.kind {name}'s sampler ({other.checkpoint_description or name}); "
                      f"model.kind {mine!r} does not read it (remove it)")


def refuse_claimed_checkpoint(cfg) -> None:
    """Refuse a local (or shipped) checkpoint whose ``config.json`` another registered kind claims
    (:meth:`PolicyKind.claims_config`: e.g. a DiffusionGemma, which has no mask token and is no causal LM: it would
    fail at load, or be trained as something it is not); unreadable configs and hub ids are left to the load. Then
    a Nemotron-Labs-Diffusion ``config.json``'s ``dlm_paradigm`` against ``model.kind`` (:func:`check_nemotron_paradigm`).

    Raises:
        ConfigError: naming ``model.kind``.
    """
    import json
    from pathlib import Path

    from dlmrl.models.loading import resolve_model_path

    file = Path(resolve_model_path(cfg.model.name_or_path)) / "config.json"
    try:
        config = json.loads(file.read_text()) if file.is_file() else None
    except (OSError, ValueError):
        return
    if not isinstance(config, dict):
        return
    for name in KINDS.names():
        other = KINDS.get(name)
        check_key(name == cfg.model.kind or not other.claims_config(config), "model.kind",
                  f"{cfg.model.name_or_path!r} is a {other.checkpoint_description}; model.kind {cfg.model.kind!r} "
                  f"cannot run it: set model.kind {name}")
    check_nemotron_paradigm(cfg, config, file)


def check_nemotron_paradigm(cfg, config: dict, file) -> None:
    """A local Nemotron-Labs-Diffusion ``config.json`` (``config``, read from ``file``) whose ``dlm_paradigm``
    ``model.kind`` cannot run is refused, naming the key and the file
    (:func:`dlmrl.models.nemotron_diffusion.paradigm_problem`); a paradigm dlmrl runs differently from the code's own
    forward is explained in a warning (:func:`~dlmrl.models.nemotron_diffusion.paradigm_note`). Other checkpoints pass.

    Raises:
        ConfigError: naming ``model.kind``.
    """
    import warnings

    from dlmrl.models.nemotron_diffusion import (
        checkpoint_paradigm,
        is_nemotron_diffusion,
        paradigm_note,
        paradigm_problem,
    )

    if not is_nemotron_diffusion(config):
        return
    paradigm, kind = checkpoint_paradigm(config), cfg.model.kind
    problem = paradigm_problem(paradigm, kind, str(file))
    check_key(problem is None, "model.kind", f"model.kind {kind!r} on {cfg.model.name_or_path!r}: {problem}")
    note = paradigm_note(paradigm, kind)
    if note:
        warnings.warn(f"{cfg.model.name_or_path}: {note}", UserWarning, stacklevel=4)


#: the keys :meth:`PolicyKind.memory_shapes` returns
MEMORY_SHAPE_KEYS = ("canvases", "positions", "head_positions", "scored_positions", "float_copy_all", "cached",
                     "rollout_block", "rollout_forward_positions", "dense_mask", "prefill_positions")


class PolicyKind(ABC):
    """A kind of policy: how it loads, checks its config keys, samples a group, records a rollout, is scored,
    decodes held-out examples and describes itself in ``--dry-run``.

    Capabilities (class attributes) say what the shared code may do with a policy of this kind:

    Attributes:
        name: the ``model.kind`` value.
        algorithm_policy: the entry of an algorithm preset's ``policies`` that covers this kind (``"diffusion"``:
            the presets' sequence-likelihood parts run on a likelihood estimator's terms; ``"ar"``: on exact token
            log-probs).
        autoregressive: writes left to right with ``generate`` (a completion ends at EOS; HAPO's adaptive
            temperature, multi-turn episodes and episode/beam evaluation need it).
        denoises: decodes a canvas over a schedule of denoising steps (``sampling.steps``, blocks, the eval presets'
            step counts apply; an infill task writes only its blank cells).
        scores_with_estimators: the likelihood is a diffusion estimator's (the ``estimator`` section, its NFE; a
            rollout records the sampler's per-token log-probs, so ``train.rollout_is_cap`` and the rollout gap apply).
        uses_families: the checkpoint is one of the diffusion families (:data:`dlmrl.models.families.FAMILIES`,
            ``model.family``, detected from ``config.json``).
        stops_at_eos_by_default: ``sampling.stop_at_eos: null`` means on (rows end at the block holding their EOS).
        default_algorithm: the algorithm the Python API trains when the caller names none (``None``: the default
            recipe's).
        turn_stops_at: with tools inside the rollout, where a turn ends (the ``--dry-run`` text).
        scores_by: what a kind without estimators scores with, for messages (default ``"exact token log-probs"``).
        estimator_names: the ``estimator.name`` values a kind resolves itself (:meth:`own_estimator`), its default
            likelihood first (what null means); ``()`` (default): the masked-diffusion estimators' registry
            (:attr:`scores_with_estimators`) or none.
        sampling_keys: the ``sampling.*`` keys only this kind reads; every other kind refuses them when set
            (:func:`refuse_other_kinds_keys`).
        checkpoint_description: what a checkpoint this kind claims is (:meth:`claims_config`), for messages.
        self_conditioned: its default likelihood (``estimator_names[0]``) replays steps that read the previous
            step's logits (self-conditioning), so ``estimator.self_conditioning`` chooses whether the gradient
            flows through them (default False: every kind but ``uniform`` refuses a value other than ``detached``).
        checkpoint_kinds: the other kinds whose saved checkpoints (``config.json``'s ``dlmrl_kind``) this kind runs
            without the config check calling it a contradiction (default: none; its own name always).
        lora_scope: where :meth:`lora_targets` looks for ``model.lora_target_modules``' names when it narrows
            peft's rule, for the message that refuses a name (default ``""``: anywhere in the model).
    """

    name: str = ""
    algorithm_policy: str = "diffusion"
    autoregressive: bool = False
    denoises: bool = True
    scores_with_estimators: bool = True
    uses_families: bool = True
    stops_at_eos_by_default: bool = False
    default_algorithm: str | None = None
    turn_stops_at: str = ""
    checkpoint_kinds: tuple[str, ...] = ()
    sampling_keys: tuple[str, ...] = ()
    checkpoint_description: str = ""
    scores_by: str = "exact token log-probs"
    estimator_names: tuple[str, ...] = ()
    self_conditioned: bool = False
    lora_scope: str = ""

    def __repr__(self) -> str:
        return f"<policy kind {self.name!r}>"

    def accepts_checkpoint(self, recorded: str) -> bool:
        """Whether a checkpoint saved as kind ``recorded`` runs as this kind (its own, or :attr:`checkpoint_kinds`)."""
        return recorded == self.name or recorded in self.checkpoint_kinds

    # ----- loading -----------------------------------------------------------------------------------------
    def model_path(self, name_or_path: str) -> str:
        """``name_or_path`` with a shipped model's name resolved to its folder (a hub id or path as given)."""
        from dlmrl.models.loading import resolve_model_path

        return resolve_model_path(name_or_path)

    @abstractmethod
    def load(self, model_cfg):
        """The policy of the ``model`` section (``name_or_path``, ``family``, ``trust_remote_code``, ``dtype``, ...).

        Raises:
            OSError, ValueError: a model that cannot be loaded (the caller names ``model.name_or_path``).
        """

    @abstractmethod
    def owns(self, policy) -> bool:
        """Whether ``policy`` (a loaded or given policy object) is a policy of this kind."""

    @abstractmethod
    def wrap(self, model, tokenizer, cfg):
        """A policy of this kind around a loaded ``transformers`` ``model`` and its ``tokenizer`` (the Python API's
        ``Trainer(model=<nn.Module>)``).

        Raises:
            ConfigError: a model this kind cannot run (naming the key).
        """

    def lora_targets(self, spec: str):
        """peft's ``target_modules`` for ``model.lora_target_modules`` ``spec`` (default:
        :func:`dlmrl.models.lora.parse_target_modules`: ``all-linear`` = every ``nn.Linear`` but the output head,
        else the comma list's names matched as name suffixes).

        Raises:
            ValueError: a bad spec (the caller names the key).
        """
        from dlmrl.models.lora import parse_target_modules

        return parse_target_modules(spec)

    def adapter_attached(self, model) -> None:
        """Called with the policy's model (a ``peft.PeftModel``) right after a LoRA adapter is put on it, fresh or
        loaded from a folder (default: nothing; e.g. a model that runs one set of weights as two module trees
        shares each adapter between them)."""

    def claims_config(self, config: dict) -> bool:
        """Whether a checkpoint's ``config.json`` (a dict) is one only this kind runs; every other kind then refuses
        it naming ``model.kind`` (:func:`refuse_claimed_checkpoint`; default: no)."""
        return False

    def claims_model(self, model) -> bool:
        """Whether a loaded ``transformers`` model that records no kind runs as this kind only (default: no; the
        Python API then takes ``model.kind`` from the config)."""
        return False

    def adopt_model_settings(self, cfg, model) -> None:
        """Fill config keys a given model object decides (default: none)."""

    def check_loaded(self, cfg, policy) -> None:
        """What only a loaded (or given) policy can tell, beyond its kind (default: nothing).

        Raises:
            ConfigError: naming the key.
        """

    # ----- the config check ----------------------------------------------------------------------------------
    def check_model(self, cfg) -> None:
        """The ``model`` keys this kind reads or refuses, and how the task's canvas fits it (default:
        ``model.block_size`` unset; an :attr:`autoregressive` kind writes Sudoku's whole grid, ``answer_mode`` full or
        text).

        Raises:
            ConfigError: naming the key.
        """
        m, t = cfg.model, cfg.task
        check_key(m.block_size is None, "model.block_size",
                  f"is the block size of a block-diffusion policy; model.kind is {m.kind!r} (set model.kind block, or "
                  "remove model.block_size; a full-diffusion sampler's semi-autoregressive block is "
                  "sampling.block_length)")
        if self.autoregressive:  # (left to right: no canvas of givens to infill)
            sudoku_grid = t.name == "sudoku" and t.answer_mode != "text"  # (the tiny model's 16-cell canvas)
            check_key(not sudoku_grid or t.answer_mode == "full", "task.answer_mode",
                      f"model.kind {self.name!r} generates the whole grid left to right: use answer_mode full (or "
                      "text)")

    def denoising_blocks(self, cfg) -> tuple[int, str] | None:
        """``(blocks, where)``: the blocks the sampler splits ``sampling.gen_length`` into and how that count is
        made (for the messages about ``sampling.steps`` / ``eval.steps``), or ``None`` when no step schedule
        applies (default).

        Raises:
            ConfigError: a length the blocks cannot split.
        """
        return None

    def check_step_count(self, key: str, steps: int, blocks: int, where: str, cfg) -> None:
        """Warn about a valid but doubtful step count ``steps`` of ``key`` over ``blocks`` (default: nothing)."""

    def check_sampling(self, cfg) -> None:
        """The ``sampling`` keys that depend on the kind: threshold decoding, ``sampling.cache``,
        ``sampling.stop_at_eos``, a checkpoint's own code (default: the uniform-noise sampler's keys are refused
        when set, :func:`refuse_other_kinds_keys`; an :attr:`autoregressive` kind refuses the diffusion
        samplers' threshold decoding and block cache, and ``stop_at_eos: false``: ``generate`` stops at EOS).

        Raises:
            ConfigError: naming the key.
        """
        refuse_other_kinds_keys(cfg)
        if not self.autoregressive:
            return
        s = cfg.sampling
        if s.adaptive:
            check_key(False, "sampling.threshold" if s.threshold is not None else "sampling.threshold_factor",
                      f"is a diffusion-sampler setting; model.kind {self.name!r} decodes left to right (set it null)")
        check_key(s.cache == "none", "sampling.cache",
                  f"is the diffusion sampler's block cache; model.kind {self.name!r} decodes with transformers' own "
                  "key/value cache (set it none)")
        check_key(s.stop_at_eos is not False, "sampling.stop_at_eos",
                  f"model.kind {self.name!r} always ends a completion at EOS (transformers' generate stops there); set "
                  "it null")

    def runs_preset(self, preset) -> bool:
        """Whether the algorithm preset ``preset`` runs on this kind at all (default: its ``policies`` name
        :attr:`algorithm_policy`); the config check refuses ``train.algorithm`` otherwise, naming the preset's
        policies."""
        return self.algorithm_policy in preset.policies

    def preset_problem(self, preset) -> str | None:
        """Why the preset ``preset`` (which :meth:`runs_preset` admits) cannot run on this kind whatever the rest of
        the config says, e.g. an input the kind's likelihood does not give (default: ``None``, it can). The config
        check refuses ``train.algorithm`` with this text; ``dlmrl list algorithms`` leaves the kind out."""
        return None

    def check_algorithm(self, cfg, preset) -> None:
        """The algorithm preset ``preset`` (already known to run on this kind: :meth:`runs_preset`) on this kind,
        beyond that (default: nothing).

        Raises:
            ConfigError: naming ``train.algorithm`` (or the key that asks for what the kind lacks).
        """

    def measures_rollout_gap(self, scorer) -> bool:
        """Whether ``scorer``'s old-policy scores are log-probs of the distribution the rollout drew from, so the
        trainer logs ``rollout_logp_gap_mean`` / ``_max`` (default: an estimator kind whose estimator is the exact
        trajectory, :func:`dlmrl.training.update.measures_rollout_mismatch`)."""
        if not self.scores_with_estimators:
            return False
        from dlmrl.estimators.trajectory import Trajectory  # (the rule of measures_rollout_mismatch)

        est = getattr(scorer, "estimator", None)
        return isinstance(est, Trajectory) and est.merge == 1 and est.order == "sampled"

    def rollout_is_cap_problem(self, cfg) -> str | None:
        """Why ``train.rollout_is_cap`` does not apply to a kind without estimators (:attr:`scores_with_estimators`
        false), or ``None`` where its rollouts record the sampler's log-probs and its scorer is their exact
        likelihood (default: its rollouts record none). An estimator kind's check is the estimator's
        (:func:`dlmrl.config.check_estimator.check_rollout_is_cap`)."""
        return f"corrects diffusion rollouts; model.kind {cfg.model.kind!r} rollouts record no log-probs (set it null)"

    def check_estimator(self, cfg, name: str, estimator, section) -> None:
        """The training estimator ``estimator`` (registered as ``name``, built from the ``estimator`` ``section``)
        on this kind (default: nothing).

        Raises:
            ConfigError: naming the key.
        """

    def estimator_class(self, name: str):
        """The class of ``estimator.name`` ``name`` (one of :attr:`estimator_names`, not the first), for the config
        check of ``estimator.options`` (default: none)."""
        return

    def own_estimator(self, cfg):
        """The estimator the ``estimator`` section builds for one of :attr:`estimator_names`, or ``None`` for the
        kind's default likelihood (default: ``None``).

        Raises:
            ConfigError: a value the estimator's class rejects (naming the key).
        """
        return

    def check_tools_in_rollout(self, cfg, estimator_name: str) -> None:
        """Tools inside the rollout (``train.env`` with a single-turn preset) with this kind's likelihood (default:
        allowed).

        Raises:
            ConfigError: naming ``train.env``.
        """

    def eval_preset_problem(self, preset, gen_length: int) -> str | None:
        """Why eval preset ``preset`` cannot decode ``gen_length`` tokens with this kind, or ``None`` (its steps and
        blocks apply to a denoising sampler)."""
        if not self.denoises:
            return None
        from dlmrl.evaluation.presets import preset_length_problem

        return preset_length_problem(preset, gen_length)

    def estimator_sampling(self, cfg):
        """The ``sampling`` section as the likelihood estimator sees one denoising run (default: the config's)."""
        return cfg.sampling

    # ----- budgets and sizes -----------------------------------------------------------------------------------
    def generation_budget(self, gen_length: int, preset) -> int:
        """The tokens a rollout may sample per completion (default: the canvas, ``gen_length``)."""
        return gen_length

    def budget_parts(self, preset) -> str:
        """What :meth:`generation_budget` adds to ``sampling.gen_length``, as words for messages (default: none)."""
        return ""

    def scoring_nfe(self, estimator, gen_length: int):
        """Forward passes per completion when scoring: the estimator's NFE at ``gen_length`` (default; the config
        check passes :meth:`scored_length`)."""
        return estimator.describe(gen_length).nfe

    def scored_length(self, cfg) -> int:
        """The canvas length an estimator's NFE is counted at (default ``sampling.gen_length``; the block kind's
        estimators run per block, all blocks in each composite pass: one block)."""
        return cfg.sampling.gen_length

    @abstractmethod
    def memory_shapes(self, cfg, prompt: int, per_update: int, nfe: int) -> dict:
        """The shapes the memory plan needs (:func:`dlmrl.training.memory_config.settings_from_config`), for ``prompt``
        prompt tokens, ``per_update`` completions per optimizer step and process, and the scoring NFE ``nfe``; every
        key below is required (:data:`MEMORY_SHAPE_KEYS`; a missing one is refused naming the kind):

        - ``canvases``: sequences scored with gradient per optimizer step (AR: ``per_update``; an estimator kind:
          ``per_update × nfe``); ``positions``: positions of one scored sequence (prompt included);
        - ``head_positions``: positions whose logits the scorer keeps (``None``: all); ``scored_positions``: the
          completion positions whose log-probs it takes; ``float_copy_all``: the forward converts its whole output
          to float32;
        - ``cached``: the rollout keeps a key/value cache of the prompt and completion; ``rollout_block``: positions
          a rollout step scores; ``rollout_forward_positions``: positions a rollout forward runs;
          ``prefill_positions``: positions of a rollout's prefill pass (0: none);
        - ``dense_mask``: the forward builds a dense 4-D attention mask (block-causal).

        Optional (``False`` when absent): ``soft_inputs`` / ``rollout_soft_inputs``: each scored position of a
        forward with grad / of a sampling step also reads a vocabulary-sized input in the weights' dtype
        (DiffusionGemma's self-conditioning logits); ``rollout_sampler`` (``"gumbel"`` when absent): whose step
        tensors the plan counts (``MemorySettings.rollout_sampler``); ``uncheckpointed_positions`` /
        ``kv_copy_positions`` (0 when absent): ``MemorySettings``' fields of those names; ``canvases_per_forward`` (``None`` when absent): the canvases
        the kind's scorer runs in one forward with grad when that is not ``estimator.micro_batch`` (the uniform kind
        rounds it down to whole rows).
        """

    # ----- training ----------------------------------------------------------------------------------------
    @abstractmethod
    def build_scorer(self, policy, ref, cfg, estimator, objective, processes: int):
        """The scorer of a run: old, reference and current scores of a rollout batch. The update loop
        (:mod:`dlmrl.training.update`) reads the interface of :class:`dlmrl.training.scorers.DiffusionScorer` and
        :class:`~dlmrl.training.scorers.ARScorer`: ``prepare(ro, num_iterations, generator, ...)`` (old and
        reference scores, no grad), ``backward(j, loss_fn, backward, rows)`` (the current scores of inner iteration
        ``j`` with grad, per-token ``(B, L)`` log-probs into the objective), the attributes ``old_scores``, ``nfe``
        and ``lockstep``. ``estimator``: the training estimator for a kind that :attr:`scores_with_estimators`, else
        ``None``; ``processes``: the process count."""

    @abstractmethod
    def sample(self, policy, task, cfg, examples: list, generator, max_length: int, temperature_fn=None,
               prompts: tuple[int, int] | None = None):
        """G completions per example (``prompts = (lo, hi)``: one process's share, with the random numbers those
        rows have in the whole batch), a :class:`~dlmrl.training.rollout.Rollout`: the trainer reads ``examples``,
        ``prompt_ids`` / ``prompt_mask``, ``completion`` / ``completion_mask`` ``(B, L)``, ``group_ids``, ``nfe``,
        ``passes`` and ``row_nfe``; its scorer reads what the kind records (``reveal_step`` and ``token_logprobs``
        for the masked trajectory, ``kind_record`` for a kind's own). Rewards are added by the caller. ``max_length``:
        the kind's :meth:`generation_budget`; ``temperature_fn``: HAPO's per-step temperature (AR)."""

    @abstractmethod
    def sample_tool_loop(self, policy, make_env, examples: list, generator, max_length: int, cfg, task,
                         temperature_fn=None):
        """G trajectories per example with the environment's tools run inside each sequence."""

    @abstractmethod
    def evaluate(self, policy, task, settings) -> dict:
        """Decode the held-out examples with ``settings`` (:class:`~dlmrl.evaluation.presets.EvalSettings`: steps,
        block length, temperature, batch size, seed, protocol) and score them with the task's metrics; the result is
        :func:`dlmrl.evaluation.heldout.evaluate`'s dict (the task's metrics, ``nfe``, ``examples``, ...), which
        :func:`dlmrl.evaluation.configured.evaluate_with_config` records."""

    def record_sampling(self, sampling: dict, cfg, policy) -> dict:
        """The eval record's ``sampling`` fields for this kind (default: as decoded)."""
        return sampling

    # ----- --dry-run -----------------------------------------------------------------------------------------
    def plan_model(self, cfg, path) -> dict:
        """The ``model`` section's entries this kind adds after ``source`` (``path``: the resolved folder or id)."""
        return {}

    @abstractmethod
    def plan_token_logprobs(self, cfg, family: str) -> str:
        """How scoring takes the chosen tokens' log-probs with ``estimator.logits_chunk`` > 0 (``family``: the
        configured or detected family name)."""

    @abstractmethod
    def plan_estimator(self, cfg, spec) -> dict:
        """The ``estimator`` section: the likelihood this kind trains with and its NFE."""

    @abstractmethod
    def plan_sampler(self, cfg, preset, written) -> dict:
        """The ``sampler`` section (``written``: an infill task's ``(fewest, most, mean)`` written tokens, or
        ``None``)."""

    def plan_scoring(self, cfg, nfe: int, processes: int) -> dict:
        """The ``sizes`` section's scoring entries (default: none)."""
        return {}

    def plan_budget(self, preset) -> str:
        """How the tools-inside-the-rollout token budget is made, for ``--dry-run``."""
        return "the canvas, sampling.gen_length"


#: the policy kinds by ``model.kind`` name (each entry an instance of a :class:`PolicyKind` subclass)
KINDS: Registry[PolicyKind] = Registry("policy kind")


def kind_of(name: str) -> PolicyKind:
    """The registered kind called ``name``.

    Raises:
        ConfigError: an unknown name (naming ``model.kind`` and the known kinds).
    """
    if name not in KINDS:
        raise ConfigError(f"config key 'model.kind': unknown policy kind {name!r}; use {', '.join(kind_names())}")
    return KINDS.get(name)


def find_kind(name: str) -> PolicyKind | None:
    """The registered kind called ``name``, or ``None`` (the callers that run before the config check, which refuses
    an unknown ``model.kind`` naming it)."""
    return KINDS.get(name) if name in KINDS else None


def policy_kind(policy) -> PolicyKind:
    """The kind of ``policy``: the registered kind its ``kind`` attribute names when that kind
    :meth:`~PolicyKind.owns` it (a block or AR policy says so; a kind from outside sets it on its own policy class),
    else the first whose ``owns`` accepts it, from the most specific built-in kind (block, ar) to the
    masked-diffusion kind, which takes any other policy.

    Raises:
        ValueError: no registered kind owns it.
    """
    named = getattr(policy, "kind", None)
    if isinstance(named, str) and named in KINDS and KINDS.get(named).owns(policy):
        return KINDS.get(named)
    built_in = [n for n in ("block", "ar", "diffusion") if n in KINDS]
    order = built_in + [n for n in KINDS.names() if n not in built_in]
    for name in order:
        if KINDS.get(name).owns(policy):
            return KINDS.get(name)
    raise ValueError(f"no registered policy kind owns a {type(policy).__name__}")


def is_policy(obj) -> bool:
    """Whether ``obj`` is a dlmrl policy: an instance of the built-in policy classes, or an object whose ``kind``
    attribute names a registered kind that :meth:`~PolicyKind.owns` it (a kind of your own with its own policy
    class)."""
    from dlmrl.models.ar import AutoregressivePolicy
    from dlmrl.models.policy import MaskedDiffusionPolicy

    if isinstance(obj, (AutoregressivePolicy, MaskedDiffusionPolicy)):
        return True
    named = getattr(obj, "kind", None)
    return isinstance(named, str) and named in KINDS and KINDS.get(named).owns(obj)


def kind_names() -> list[str]:
    """The registered kinds' names, built-in ones first in their historical order."""
    first = [n for n in ("diffusion", "block", "ar") if n in KINDS]
    return first + [n for n in KINDS.names() if n not in first]
