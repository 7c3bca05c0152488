"""The ``dlmrl`` command: ``train``, ``eval``, ``pretrain``, ``estimators``, ``list``.

``dlmrl train`` with no arguments runs the packaged recipe ``dlmrl/recipes/gdpo_sudoku_tiny.yaml``
(``configs/gdpo_sudoku_tiny.yaml`` is a link to it) on the shipped tiny model. ``--resume`` starts
from the run's own ``config.yaml``. Config errors are reported before any model is loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from importlib import resources
from pathlib import Path

from dlmrl.config import (
    Config,
    ConfigError,
    PretrainConfig,
    apply_overrides,
    help_text,
    load_yaml,
    locate_error,
    validate,
    validate_pretrain,
)

DEFAULT_TRAIN_CONFIG = "gdpo_sudoku_tiny.yaml"


def default_config_path(name: str = DEFAULT_TRAIN_CONFIG) -> Path:
    """The packaged recipe ``dlmrl/recipes/<name>``."""
    return Path(str(resources.files("dlmrl") / "recipes" / name))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dlmrl", description="Reinforcement learning for diffusion language models.")
    sub = p.add_subparsers(dest="command", required=True)
    fmt = argparse.RawDescriptionHelpFormatter
    for name, cls, desc in (
        ("train", Config, ("Fine-tune a policy with a group optimizer (train.algorithm; default: GDPO on the "
                           "tiny diffusion model). Without --config, runs the tiny Sudoku recipe.")),
        ("eval", Config, "Evaluate a checkpoint on the held-out split (greedy decoding)."),
        ("pretrain", PretrainConfig, ("SFT of a tiny default on Sudoku solutions: masked-diffusion "
                                      "(kind=diffusion) or next-token (kind=ar).")),
    ):
        sp = sub.add_parser(name, help=desc, description=desc, formatter_class=fmt,
                            epilog="config keys (set in YAML or as key=value; bare leaf names work when unique):\n"
                            + help_text(cls))
        sp.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
        sp.add_argument("--config", help="YAML config file")
        sp.add_argument("--output-dir", help="output folder (same as output_dir=...)")
        if name == "train":
            sp.add_argument("--resume", action="store_true", help="continue from the last checkpoint in the output folder")
            sp.add_argument("--no-progress", action="store_true", help="hide the progress bar")
        if name == "eval":
            sp.add_argument("--model", help="checkpoint to evaluate (same as model.name_or_path=...)")
    _estimators_parser(sub)
    sp = sub.add_parser("list", help="List a registry (algorithms, estimators, rewards, tasks, advantages).")
    sp.add_argument("registry", choices=sorted(_REGISTRIES))
    return p


_REGISTRIES = {
    "algorithms": ("dlmrl.objectives.presets", "ALGORITHMS"),
    "estimators": ("dlmrl.estimators", "ESTIMATORS"),
    "rewards": ("dlmrl.rewards", "REWARDS"),
    "tasks": ("dlmrl.data", "TASKS"),
    "advantages": ("dlmrl.objectives.advantage_registry", "ADVANTAGES"),
}


def _run_list(name: str) -> int:
    """Print each registered name with the first line of its docstring."""
    import importlib
    import shutil
    import textwrap
    import warnings

    module, attr = _REGISTRIES[name]
    registry = getattr(importlib.import_module(module), attr)
    width = max(map(len, registry.names()), default=0)
    columns = max(shutil.get_terminal_size((100, 24)).columns, width + 40)
    lines = []
    for key in registry.names():
        text = registry.doc(key)
        if name == "algorithms":  # which policy kinds the preset runs on
            with warnings.catch_warnings():  # (some presets warn about their own documented choices)
                warnings.simplefilter("ignore")
                text += f" [{', '.join(registry.get(key)().policies)}]"
        lines += textwrap.wrap(text, columns - 1, initial_indent=f"{key:<{width}}  ",
                               subsequent_indent=" " * (width + 2), break_on_hyphens=False) or [key]
    try:
        print("\n".join(lines))
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. `dlmrl list algorithms | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, got {text!r}")
    return values


def _estimators_parser(sub) -> None:
    from dlmrl.estimators.analysis import LabConfig

    d = LabConfig()
    desc = ("The variance lab: bias, variance, MSE (against the exact ELBO, or a high-budget reference for "
            "long canvases), gradient variance and shared-plan ELBO-difference variance of every estimator "
            "at each budget, on Sudoku completions the model samples. Writes estimators.json, lab.json and "
            "PNG plots of MSE and gradient variance vs NFE.")
    sp = sub.add_parser("estimators", help="Compare ELBO estimators (the variance lab).", description=desc)
    sp.add_argument("--output-dir", required=True, help="folder for estimators.json, lab.json and the plots")
    sp.add_argument("--model", default="tiny-sudoku", help="model to study (default: the shipped tiny model)")
    sp.add_argument("--family", default="auto", help="model family (default: auto-detect)")
    sp.add_argument("--trust-remote-code", action="store_true", help="allow the checkpoint's own modeling code")
    sp.add_argument("--lengths", type=_int_list, default=(8, 16, 64, 256),
                    help="maskable tokens per row L, comma-separated (default 8,16,64,256)")
    sp.add_argument("--rows", type=_int_list, default=None,
                    help="rows per length: one number or one per length (default: 8 for L < 16, 2 from L = 16)")
    sp.add_argument("--budgets", type=_int_list, default=d.budgets,
                    help="NFE budgets where exact tables exist (L <= 16), default 1,2,3,4,8")
    sp.add_argument("--long-budgets", type=_int_list, default=d.long_budgets,
                    help="NFE budgets for longer canvases (scored by the model; default 3,4)")
    sp.add_argument("--repetitions", type=int, default=d.repetitions,
                    help=f"independent plans per estimator checked by table lookup (default {d.repetitions})")
    sp.add_argument("--model-repetitions", type=int, default=d.model_repetitions,
                    help=f"independent plans per estimator scored by the model (default {d.model_repetitions})")
    sp.add_argument("--directions", type=int, default=d.num_directions,
                    help=f"random parameter directions for the gradient variance (default {d.num_directions})")
    sp.add_argument("--perturbation", type=float, default=d.perturbation,
                    help=f"relative size of the nearby policy's parameter noise (default {d.perturbation})")
    sp.add_argument("--seed", type=int, default=d.seed, help="seed for puzzles, samples and masks")
    sp.add_argument("--quick", action="store_true",
                    help="a fast, noisy look (under a minute): sets L = 8,12,32, budgets 2,3,4 (3,4 beyond 16 "
                         "tokens), 500/8 repetitions, 1 direction and a smaller reference, overriding those options")


def _run_estimators(args) -> int:
    from dlmrl.estimators.analysis import LabConfig
    from dlmrl.models.loading import load_policy
    from dlmrl.training.estimator_lab import default_rows, run_estimator_lab

    lengths, rows = args.lengths, args.rows or tuple(default_rows(n) for n in args.lengths)
    cfg = LabConfig(budgets=args.budgets, long_budgets=args.long_budgets, repetitions=args.repetitions,
                    model_repetitions=args.model_repetitions, num_directions=args.directions,
                    perturbation=args.perturbation, seed=args.seed)
    if args.quick:
        lengths, rows = (8, 12, 32), args.rows or (4, 2, 2)
        cfg.budgets, cfg.long_budgets, cfg.repetitions, cfg.model_repetitions = (2, 3, 4), (3, 4), 500, 8
        cfg.num_directions, cfg.reference_nfe, cfg.reference_repeats = 1, 64, 4
    if len(rows) not in (1, len(lengths)):
        print(f"dlmrl estimators: --rows has {len(rows)} values for {len(lengths)} lengths", file=sys.stderr)
        return 2
    if min(cfg.repetitions, cfg.model_repetitions) < 2 or cfg.num_directions < 1 or cfg.perturbation <= 0:
        print("dlmrl estimators: --repetitions and --model-repetitions must be >= 2, --directions >= 1 and "
              "--perturbation > 0", file=sys.stderr)
        return 2
    out = Path(args.output_dir)
    if out.exists() and not out.is_dir():
        print(f"dlmrl estimators: --output-dir {out} exists and is not a folder", file=sys.stderr)
        return 2
    try:
        policy = load_policy(args.model, args.family, args.trust_remote_code)
    except (OSError, ValueError, KeyError) as e:
        print(f"dlmrl estimators: cannot load model {args.model!r}: {e}", file=sys.stderr)
        return 2
    try:
        run_estimator_lab(args.output_dir, policy, lengths, rows[0] if len(rows) == 1 else rows, cfg)
    except ValueError as e:
        print(f"dlmrl estimators: {e}", file=sys.stderr)
        return 2
    return 0


def _resume_config(args) -> Path | None:
    """The saved ``config.yaml`` of the run that ``--resume`` continues, if there is one."""
    out = args.output_dir or next((o.split("=", 1)[1] for o in args.overrides if o.startswith("output_dir=")),
                                  None)
    if out is None:
        cfg = Config()
        load_yaml(cfg, args.config or default_config_path())
        out = cfg.output_dir
    saved = Path(out) / "config.yaml"
    return saved if saved.exists() else None


def _build(args, cls):
    cfg = cls()
    saved = _resume_config(args) if getattr(args, "resume", False) else None
    if cls is Config:
        load_yaml(cfg, saved or args.config or default_config_path())
    elif args.config:
        load_yaml(cfg, args.config)
    apply_overrides(cfg, args.overrides)
    if args.output_dir:
        cfg.output_dir = args.output_dir
    if getattr(args, "model", None):
        cfg.model.name_or_path = args.model
    (validate if cls is Config else validate_pretrain)(cfg)
    return cfg


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    # key=value overrides may come after flags too (argparse's subparsers stop at the first flag).
    args, extra = parser.parse_known_args(argv)
    if args.command == "list":
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return _run_list(args.registry)
    if args.command == "estimators":
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return _run_estimators(args)
    stray = [x for x in extra if x.startswith("-") or "=" not in x]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    args.overrides = list(args.overrides) + extra
    try:
        cfg = _build(args, PretrainConfig if args.command == "pretrain" else Config)
    except ConfigError as e:
        e = locate_error(e, args.config)
        print(f"dlmrl {args.command}: config error: {e}", file=sys.stderr)
        return 2
    if args.command == "train":
        from dlmrl.training.trainer import train

        try:
            summary = train(cfg, resume=args.resume, progress=not args.no_progress)
        except KeyboardInterrupt:
            return 130
        except (FileNotFoundError, ConfigError) as e:
            print(f"dlmrl train: {e}", file=sys.stderr)
            return 2
        before, after = summary.get("eval_before"), summary.get("eval_after")
        if before and after:
            print(f"eval_before.cell_accuracy = {before['cell_accuracy']:.4f}")
            print(f"eval_after.cell_accuracy  = {after['cell_accuracy']:.4f}")
        print(f"wrote {Path(cfg.output_dir) / 'summary.json'}")
    elif args.command == "eval":
        from dlmrl.training.trainer import build_task, evaluate_config, load_configured_policy

        try:
            policy = load_configured_policy(cfg)
        except ConfigError as e:
            print(f"dlmrl eval: {e}", file=sys.stderr)
            return 2
        print(json.dumps(evaluate_config(cfg, policy, build_task(cfg, policy)), indent=2))
    else:
        from dlmrl.training.pretrain import pretrain
        from dlmrl.training.pretrain_ar import pretrain_ar

        try:
            print(json.dumps((pretrain_ar if cfg.kind == "ar" else pretrain)(cfg), indent=2))
        except ConfigError as e:
            print(f"dlmrl pretrain: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
