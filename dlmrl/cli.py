"""The ``dlmrl`` command: ``train``, ``eval``, ``pretrain``.

``dlmrl train`` with no arguments runs the packaged recipe ``dlmrl/recipes/gdpo_sudoku_tiny.yaml``
(``configs/gdpo_sudoku_tiny.yaml`` is a link to it) on the shipped tiny model. ``--resume`` starts
from the run's own ``config.yaml``. Config errors are reported before any model is loaded.
"""

from __future__ import annotations

import argparse
import json
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
        ("train", Config, "Fine-tune a diffusion LM with GDPO. Without --config, runs the tiny Sudoku recipe."),
        ("eval", Config, "Evaluate a checkpoint on the held-out split (greedy decoding)."),
        ("pretrain", PretrainConfig, "Masked-diffusion SFT of the tiny default on Sudoku solutions."),
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
    return p


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

        try:
            print(json.dumps(pretrain(cfg), indent=2))
        except ConfigError as e:
            print(f"dlmrl pretrain: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
