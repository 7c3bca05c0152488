"""The Python API: :class:`Trainer`, shaped like TRL's ``GRPOTrainer``, over dlmrl's one training loop.

.. code-block:: python

    from datasets import Dataset
    from dlmrl import Trainer

    def digits(prompts, completions, **columns):          # TRL's reward signature
        return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]

    data = Dataset.from_dict({"prompt": ["1234=", "4321="]})
    trainer = Trainer("tiny-sudoku", reward_funcs=[digits], train_dataset=data,
                      config={"train.max_steps": 2, "train.prompts_per_step": 2, "train.num_generations": 2})
    trainer.train()

The trainer builds a ``task.name: dataset`` task (:class:`~dlmrl.data.dataset_task.DatasetTask`) from the datasets
and reward functions, loads (or takes) the policy, and runs :func:`dlmrl.training.trainer.train` with both, so a
run writes the files of any ``dlmrl train`` run into ``output_dir`` and resumes from its checkpoints.

Source of the conventions: TRL ``trl/trainer/grpo_trainer.py`` (``GRPOTrainer(model, reward_funcs, args,
train_dataset, eval_dataset, processing_class, callbacks)``; reward functions ``f(prompts, completions, **kwargs)``,
``None`` rewards, ``reward_weights``, ``rewards/<name>/mean`` logs).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dlmrl.config import (
    Config,
    ConfigError,
    apply_mapping,
    default_config_path,
    load_yaml,
    mapping_keys,
    task_options,
    use_the_algorithms_estimator,
    validate,
)
from dlmrl.data.dataset_task import DatasetTask
from dlmrl.kinds import KIND_KEY, KINDS, find_kind, is_policy, kind_names, kind_of, policy_kind
from dlmrl.rewards.functions import RewardFunctions
from dlmrl.training.callbacks import Callbacks

__all__ = ["DEFAULT_OUTPUT_DIR", "Trainer", "trainer_config"]

#: where a Python API run writes when the config names no ``output_dir``
DEFAULT_OUTPUT_DIR = "runs/trainer_output"


def _model_kind(model) -> str | None:
    """The policy kind ``model`` itself tells (a dlmrl policy; a shipped or saved model's name, whose ``config.json``
    records it), else ``None``."""
    if is_policy(model):
        return policy_kind(model).name  # (a BlockDiffusionPolicy is a block policy)
    if isinstance(model, str):
        from dlmrl.models.loading import checkpoint_kind

        return checkpoint_kind(model)  # (the kind a saved or shipped model records; None: not recorded)
    recorded = getattr(getattr(model, "config", None), KIND_KEY, None)  # (a loaded model saved by dlmrl)
    if recorded in kind_names():
        return recorded
    # (a model only one kind runs, e.g. a DiffusionGemma: the uniform-noise kind)
    return next((name for name in kind_names() if KINDS.get(name).claims_model(model)), None)


def trainer_config(config: Config | dict | None = None, model: Any = None) -> Config:
    """The config a :class:`Trainer` runs, not yet validated.

    - a :class:`~dlmrl.config.Config`: used as it is (a copy), every field as given;
    - a dict (``{"train.max_steps": 2}``, nested ``{"train": {"max_steps": 2}}`` or unique bare leaf names) or
      ``None``: overrides on the default recipe, as ``dlmrl train key=value ...`` applies them, and for the keys it
      does not set the API's defaults: ``output_dir`` :data:`DEFAULT_OUTPUT_DIR`, ``eval.num_puzzles`` 0 (the whole
      eval dataset), ``model.kind`` from the model (a dlmrl policy's type, ``"tiny-sudoku-ar"``), ``train.algorithm``
      ``grpo`` for an AR policy (the recipe's ``gdpo`` is diffusion-only).

    Either way ``task.name`` is ``dataset`` and ``model.name_or_path`` names ``model`` (a string, or a loaded
    model's ``config._name_or_path``).

    Raises:
        ConfigError: an unknown key or bad value (naming it), ``task.name`` other than ``dataset``, or a
            ``model.kind`` the policy contradicts.
        TypeError: a config of another type.
    """
    kind = _model_kind(model)
    if isinstance(config, Config):
        cfg, explicit = copy.deepcopy(config), None
    elif config is None or isinstance(config, dict):
        cfg = Config()
        load_yaml(cfg, default_config_path())
        mapping = dict(config or {})
        apply_mapping(cfg, mapping)
        explicit = mapping_keys(Config, mapping)
        if "output_dir" not in explicit:
            cfg.output_dir = DEFAULT_OUTPUT_DIR
        if "eval.num_puzzles" not in explicit:
            cfg.eval.num_puzzles = 0
        if "model.kind" not in explicit and kind is not None:
            cfg.model.kind = kind
        chosen_kind = find_kind(cfg.model.kind)
        default_algorithm = chosen_kind.default_algorithm if chosen_kind is not None else None
        if "train.algorithm" not in explicit and default_algorithm is not None:
            cfg.train.algorithm = default_algorithm
        use_the_algorithms_estimator(cfg, [f"{k}=" for k in explicit])
    else:
        raise TypeError(f"config: expected a dlmrl.config.Config, a dict of overrides or None, got "
                        f"{type(config).__name__}")
    if explicit is not None and "task.name" in explicit and cfg.task.name != "dataset":
        raise ConfigError(f"config key 'task.name': the Python API trains on train_dataset (task 'dataset'), got "
                          f"{cfg.task.name!r}")
    cfg.task.name = "dataset"
    configured = find_kind(cfg.model.kind)
    if kind is not None and cfg.model.kind != kind and not (configured is not None
                                                            and configured.accepts_checkpoint(kind)):
        raise ConfigError(f"config key 'model.kind': the model is a {kind} policy but model.kind is "
                          f"{cfg.model.kind!r}")
    if isinstance(model, str):
        cfg.model.name_or_path = model
    elif model is not None:
        inner = getattr(model, "model", model)  # (a dlmrl policy holds the transformers model)
        name = getattr(getattr(inner, "config", None), "_name_or_path", None)
        cfg.model.name_or_path = name or f"<{type(inner).__name__} object>"
        if configured is not None:  # (an unknown kind is refused by the config check, naming model.kind)
            configured.adopt_model_settings(cfg, model)  # (e.g. a loaded block model's own size)
    return cfg


def _policy_of(model, tokenizer, cfg: Config):
    """The policy to train: a dlmrl policy as it is; a name loaded as ``model.*`` says; a loaded ``transformers``
    model wrapped with ``tokenizer`` (else the tokenizer saved with it) as ``model.kind`` says (a model saved by
    dlmrl records its kind and block size in its config)."""
    from torch import nn

    from dlmrl.training.run_setup import load_configured_policy

    if is_policy(model):
        if tokenizer is not None:
            model.tokenizer = tokenizer
        if model.tokenizer is None:
            raise ValueError("model: this policy has no tokenizer; pass tokenizer=")
        return model
    if isinstance(model, str):
        return load_configured_policy(cfg)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a hub id or local path, a transformers model or a dlmrl policy, got "
                        f"{type(model).__name__}")
    if tokenizer is None:
        from transformers import AutoTokenizer

        path = getattr(getattr(model, "config", None), "_name_or_path", None)
        if not path:
            raise ValueError("model: a transformers model built in memory has no saved tokenizer; pass tokenizer=")
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=cfg.model.trust_remote_code)
    return kind_of(cfg.model.kind).wrap(model, tokenizer, cfg)


class Trainer:
    """Train a diffusion (or AR) policy on your prompts with your reward functions, as TRL's ``GRPOTrainer``.

    Args:
        model: a hub id, local folder or shipped name (``"tiny-sudoku"``, ``"tiny-sudoku-ar"``), loaded with the
            ``model`` section (its ``kind``, ``family``, ``dtype``, ...); a loaded ``transformers`` model (its
            tokenizer from ``tokenizer`` or the folder in its ``config._name_or_path``; ``model.kind`` says
            diffusion or AR); or a dlmrl policy (:class:`~dlmrl.models.policy.MaskedDiffusionPolicy`,
            :class:`~dlmrl.models.ar.AutoregressivePolicy`), trained in place.
        reward_funcs: a reward function or a list of them: callables ``f(prompts, completions, **columns) ->
            list[float | None]``, registry names (:data:`dlmrl.rewards.REWARDS`) or import strings
            ``module:function`` (:class:`~dlmrl.rewards.functions.RewardFunctions`).
        train_dataset: a ``datasets.Dataset`` (or a dict of columns) with a prompt column (``task.prompt_column``,
            default ``prompt``): plain text or chat messages; its other columns reach the reward functions.
        eval_dataset: the held-out prompts, same form; ``None``: no held-out evaluation (``eval.before``,
            ``eval.after`` off).
        eval_metric: ``f(prompts, completions, **columns) -> float`` over the whole held-out split, reported under
            its name as the primary metric; ``None``: the mean reward.
        config: a :class:`~dlmrl.config.Config` or a dict of overrides on the default recipe
            (:func:`trainer_config`).
        reward_weights: one weight per reward function (TRL's ``reward_weights``); ``None``: ``train.reward_weights``,
            else all 1.
        callbacks: objects with ``on_log(record)``, ``on_step_end(step, record)``, ``on_evaluate(metrics)``
            (any of them; :mod:`dlmrl.training.callbacks`).
        tokenizer: the tokenizer of a loaded ``transformers`` model (TRL's ``processing_class``).
    Attributes:
        config: the validated :class:`~dlmrl.config.Config`. policy: the policy (trained in place).
        task: the :class:`~dlmrl.data.dataset_task.DatasetTask`.
    Raises:
        ConfigError: a bad config key or value (naming it), before any model is loaded.
        ValueError: a dataset without the prompt column (naming it and the columns it has), a bad row, a reward
            function or weight refused, ``eval_metric`` or ``eval.eval_steps`` without an eval dataset, or
            ``eval.num_puzzles`` above its size; all before any model is loaded. After loading: chat-message
            prompts the tokenizer cannot render.
        TypeError: a model, dataset, reward function or callback of a type it cannot use.
        dlmrl.plugins.PluginError: an import string whose module or attribute cannot be found.
        dlmrl.rewards.functions.RewardFunctionError: a reward function whose signature cannot take a dataset's
            columns (naming the function and the column), before any model is loaded.
    Warns:
        UserWarning: before any model is loaded, when ``output_dir`` already holds a run (``train()`` then needs
            ``resume=True``), and when a block model would decode each block in one step (the config check).
    """

    def __init__(self, model, reward_funcs, train_dataset, eval_dataset=None, eval_metric: Callable | None = None,
                 config: Config | dict | None = None, reward_weights: Sequence[float] | None = None,
                 callbacks: Sequence | None = None, tokenizer=None):
        self.callbacks = Callbacks(callbacks)
        cfg = trainer_config(config, model)
        if cfg.train.reward_funcs:
            raise ConfigError("config key 'train.reward_funcs': the Python API takes its reward functions as "
                              "Trainer(reward_funcs=...)")
        if eval_dataset is None:
            if eval_metric is not None:
                raise ValueError("eval_metric: needs an eval_dataset to score")
            if cfg.eval.eval_steps:
                raise ConfigError("config key 'eval.eval_steps': evaluating every few steps needs an eval_dataset")
            cfg.eval.before = cfg.eval.after = False
        validate(cfg, data=False)
        try:
            DatasetTask.check_settings(task_options(cfg.task))  # (validate refused the keys it does not read)
        except ValueError as e:
            key, _, msg = str(e).partition(": ")
            raise ConfigError(f"config key {key!r}: {msg}") from None
        self.reward_functions = RewardFunctions(
            reward_funcs, cfg.train.reward_weights if reward_weights is None else reward_weights, "reward_funcs")
        column = cfg.task.prompt_column
        train_examples = DatasetTask.examples_of(train_dataset, "train", "train_dataset", column)
        test_examples = (DatasetTask.examples_of(eval_dataset, "test", "eval_dataset", column)
                         if eval_dataset is not None else [])
        for examples, what in ((train_examples, "train_dataset"), (test_examples, "eval_dataset")):
            if examples:  # (a column a reward function needs, missing: refused now, not at the first scoring)
                self.reward_functions.check_signatures(list(DatasetTask.columns_of(examples)), what)
        if eval_dataset is not None and cfg.eval.num_puzzles > len(test_examples):
            raise ConfigError(f"config key 'eval.num_puzzles': {cfg.eval.num_puzzles} examples asked, eval_dataset has "
                              f"{len(test_examples)} (0 = all of it)")
        self.config = cfg
        from dlmrl.training.run_folder import holds_run

        if holds_run(cfg.output_dir):  # (said before the model loads; train() refuses it unless resume=True)
            import warnings

            warnings.warn(f"config key 'output_dir': {cfg.output_dir} already holds a run, so trainer.train() will "
                          f"refuse to start another there; continue it with trainer.train(resume=True), or give "
                          f"the Trainer a new output_dir", UserWarning, stacklevel=2)
        # (everything above needs no weights: a mistake there costs no model load)
        from dlmrl.training.run_setup import canvas_token_id, check_policy

        self.policy = _policy_of(model, tokenizer, cfg)
        check_policy(cfg, self.policy)
        self.task = DatasetTask(self.policy.tokenizer, canvas_token_id(self.policy), cfg.sampling.gen_length,
                                train_examples, test_examples, reward_functions=self.reward_functions,
                                chat_template=cfg.task.chat_template, eval_metric=eval_metric)

    @property
    def model(self):
        """The ``transformers`` model being trained (TRL's ``trainer.model``)."""
        return self.policy.model

    @property
    def tokenizer(self):
        return self.policy.tokenizer

    def train(self, resume: bool = False, resume_from: str | Path | None = None, progress: bool = True) -> dict:
        """Run the training loop (:func:`dlmrl.training.trainer.train`) into ``config.output_dir``.

        Args:
            resume: continue the run in ``output_dir`` from its newest checkpoint (its saved ``config.yaml`` must
                match this trainer's config, as ``dlmrl train --resume`` requires).
            resume_from: a run folder (an earlier ``output_dir``) to continue; becomes ``output_dir`` (implies
                ``resume``).
            progress: show the progress bar.
        Returns:
            ``summary.json``'s content: ``eval_before``, ``eval_after`` (``None`` without an eval dataset), the
            steps, the final metrics, ``train_seconds``.
        Raises:
            ConfigError: ``output_dir`` holds a run and ``resume`` is off (also warned about by the constructor,
                before the model loads), or the saved settings differ.
            FileNotFoundError: ``resume`` with nothing to resume.
            dlmrl.rewards.functions.RewardFunctionError: a reward function returned the wrong number of values
                (checked on every call, naming it, the length got and expected).
        """
        from dlmrl.training.run_folder import holds_run
        from dlmrl.training.trainer import train

        if resume_from is not None:
            self.config.output_dir, resume = str(resume_from), True
        if not resume and holds_run(self.config.output_dir):  # (the command line's message names its flags)
            raise ConfigError(f"config key 'output_dir': {self.config.output_dir} already holds a run; continue it "
                              "with trainer.train(resume=True), or give the Trainer a new output_dir")
        return train(self.config, resume=resume, progress=progress, policy=self.policy, task=self.task,
                     callbacks=self.callbacks.callbacks)

    def evaluate(self) -> dict:
        """The held-out metrics of the current policy on ``eval_dataset`` (greedy, the ``eval`` section's
        settings): ``mean_reward``, each reward function's ``rewards/<name>/mean``, the ``eval_metric`` when given,
        ``primary_metric`` naming the headline one. Calls the callbacks' ``on_evaluate``.

        Raises:
            ValueError: the trainer has no eval dataset.
        """
        from dlmrl.training.run_setup import evaluate_config

        if not self.task.test_examples:
            raise ValueError("evaluate: this trainer has no eval_dataset")
        metrics = evaluate_config(self.config, self.policy, self.task)
        self.callbacks.on_evaluate(metrics)
        return metrics

    def save(self, path: str | Path) -> Path:
        """Write the policy's weights (a LoRA run: its adapter and a note of its base) and tokenizer with
        ``save_pretrained`` (safetensors) into ``path``, written to a temporary folder and renamed; the folder
        loads back with ``Trainer(str(path), ...)``, ``load_policy`` / ``load_ar_policy`` and ``dlmrl eval --model``,
        as the policy kind it was trained as (``config.json``'s ``dlmrl_kind``; a block model with its block size).
        It holds no run config for ``dlmrl eval`` (a ``final_model/`` does): this trainer's datasets and reward
        functions live in Python; ``dlmrl eval --model`` takes the task from its own config or overrides.
        Returns ``path``."""
        from accelerate.utils import extract_model_from_parallel

        from dlmrl.models.lora import save_final_model
        from dlmrl.training.checkpoint import atomic_dir

        path = Path(path)
        with atomic_dir(path) as tmp:  # (no run config: this trainer's data and rewards live in Python only)
            save_final_model(extract_model_from_parallel(self.policy.model), self.policy.tokenizer, tmp,
                             self.config.model, mask_token_id=getattr(self.policy, "mask_token_id", None))
        return path
