"""The ``dlmrl`` command: ``train``, ``eval``, ``pretrain``, ``estimators``, ``list``.

``dlmrl train`` with no arguments runs the packaged recipe ``dlmrl/recipes/gdpo_sudoku_tiny.yaml``
(``configs/gdpo_sudoku_tiny.yaml`` is a link to it) on the shipped tiny model. ``--resume`` starts
from the run's own ``config.yaml``. Config errors are reported before any model is loaded.

User code reaches the command through imports (:mod:`dlmrl.plugins`): the ``dlmrl.plugins`` entry points are
loaded at start, ``--import MODULE`` (train, eval, list; repeatable) imports a module before the config is read,
and the current folder is on ``sys.path`` (last), so a ``my_rewards.py`` there is importable by
``--import my_rewards`` or an import string ``my_rewards:exact_match``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from dlmrl.config import (
    Config,
    ConfigError,
    PretrainConfig,
    apply_overrides,
    default_config_path,
    help_text,
    load_yaml,
    locate_error,
    use_the_algorithms_estimator,
    validate,
    validate_pretrain,
)
from dlmrl.kinds import kind_of
from dlmrl.listing import _REGISTRIES, _run_list, plain_text  # noqa: F401 (plain_text: re-exported)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dlmrl", description="Reinforcement learning for diffusion language models.")
    sub = p.add_subparsers(dest="command", required=True)
    fmt = argparse.RawDescriptionHelpFormatter
    for name, cls, desc in (
        ("train", Config, ("Fine-tune a policy with a group optimizer (train.algorithm; default: GDPO on the "
                           "tiny diffusion model). Without --config, runs the tiny Sudoku recipe.")),
        ("eval", Config, "Evaluate a checkpoint on the held-out split (greedy decoding)."),
        ("pretrain", PretrainConfig, ("SFT of a tiny default on Sudoku solutions (task=sudoku), multi-hop "
                                      "tool-use traces (task=multihop) or next-item recommendation "
                                      "(task=recommend): masked-diffusion (kind=diffusion) or next-token (kind=ar).")),
    ):
        sp = sub.add_parser(name, help=desc, description=desc, formatter_class=fmt,
                            epilog="config keys (set in YAML or as key=value; bare leaf names work when unique):\n"
                            + help_text(cls))
        sp.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
        sp.add_argument("--config", help="YAML config file")
        if name != "pretrain":
            _import_argument(sp)
        sp.add_argument("--output-dir", help="output folder (same as output_dir=...)" if name != "eval" else
                        "write the printed results there too, as eval.json")
        if name == "train":
            sp.add_argument("--resume", action="store_true", help="continue from the last checkpoint in the output folder")
            sp.add_argument("--no-progress", action="store_true", help="hide the progress bar")
            sp.add_argument("--dry-run", action="store_true",
                            help="validate the config, build everything that needs no weights (preset, estimator "
                                 "and NFE, task and data sources, sampler, batch sizes, tracker, accelerate state) "
                                 "and print the plan; loads no model, downloads nothing")
            sp.add_argument("--num-processes", type=int, default=None, metavar="N",
                            help="with --dry-run: plan for N processes (e.g. the 8 GPUs of the launch you will run "
                                 "elsewhere): batch split, per-process sizes and memory")
        if name == "eval":
            sp.add_argument("--model", help="checkpoint to evaluate (same as model.name_or_path=...)")
            sp.add_argument("--gen-lengths", type=_int_list, default=None, metavar="L1,L2,...",
                            help="evaluate at each generation length (e.g. 128,256,512: d1's), one JSON line per "
                                 "length; eval.steps scales with the length (steps per token kept)")
    _estimators_parser(sub)
    # (the names from the registry table itself: a registry added there is in the help too)
    sp = sub.add_parser("list", help=f"List a registry ({', '.join(_REGISTRIES)}).")
    sp.add_argument("registry", choices=sorted(_REGISTRIES))
    _import_argument(sp)
    return p


def _import_argument(sp) -> None:
    sp.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                    help="import MODULE first (repeatable), so the estimators, algorithms, rewards, tasks, "
                         "objective parts, model families and environments it registers are known (also: the "
                         "dlmrl.plugins entry points, loaded at start)")


def _load_user_code(args) -> None:
    """The ``dlmrl.plugins`` entry points, then each ``--import`` module (raises ``PluginError`` naming it)."""
    from dlmrl.plugins import import_modules, load_plugins

    if os.getcwd() not in sys.path:  # (as `python -m` has it, but last: installed packages keep their names)
        sys.path.append(os.getcwd())
    load_plugins()
    import_modules(getattr(args, "imports", None) or [])


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
            "PNG plots of MSE and gradient variance vs NFE. --kind uniform: the uniform-noise ELBO estimators "
            "(DiffusionGemma) on a tiny vocabulary, bias / std / MSE against the exact ELBO by enumeration.")
    sp = sub.add_parser("estimators", help="Compare ELBO estimators (the variance lab).", description=desc)
    sp.add_argument("--output-dir", required=True, help="folder for estimators.json, lab.json and the plots")
    sp.add_argument("--kind", choices=("diffusion", "uniform"), default=None,
                    help="which estimators: diffusion (the masked ones; the default) or uniform (the uniform-noise "
                         "ELBO estimators of model.kind uniform; the default for --model tiny-uniform or a "
                         "DiffusionGemma checkpoint)")
    sp.add_argument("--model", default=None,
                    help="model to study (default: the shipped tiny model; with --kind uniform, tiny-uniform: a tiny "
                         "random DiffusionGemma over 8 token ids, or a DiffusionGemma checkpoint with a tiny "
                         "vocabulary)")
    sp.add_argument("--family", default="auto", help="model family (default: auto-detect)")
    sp.add_argument("--trust-remote-code", action="store_true", help="allow the checkpoint's own modeling code")
    sp.add_argument("--lengths", type=_int_list, default=None,
                    help="maskable tokens per row L, comma-separated (default 8,16,64,256; --kind uniform: 2,3)")
    sp.add_argument("--rows", type=_int_list, default=None,
                    help="rows per length: one number or one per length (default: 8 for L < 16, 2 from L = 16; "
                         "--kind uniform: 4)")
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
                         "tokens), 500/8 repetitions, 1 direction and a smaller reference, overriding those options; "
                         "with --kind uniform: L = 2, 2 rows, budgets 2,3, 500 draws (about 10 s)")


#: the masked lab's options, refused with --kind uniform when set to anything but their defaults
_MASKED_LAB_ONLY = {"long_budgets": "--long-budgets", "model_repetitions": "--model-repetitions",
                    "directions": "--directions", "perturbation": "--perturbation", "family": "--family",
                    "trust_remote_code": "--trust-remote-code"}


def _lab_kind(args) -> str:
    """``--kind``, else ``uniform`` for ``--model tiny-uniform`` or a folder whose config.json is a DiffusionGemma's."""
    if args.kind is not None:
        return args.kind
    if args.model == "tiny-uniform":
        return "uniform"
    from dlmrl.models.loading import resolve_model_path

    config = Path(resolve_model_path(args.model or "tiny-sudoku")) / "config.json"
    if config.is_file():
        from dlmrl.models.diffusion_gemma import is_diffusion_gemma

        try:
            if is_diffusion_gemma(json.loads(config.read_text())):
                return "uniform"
        except (OSError, ValueError):
            pass  # (the loader reports an unreadable checkpoint)
    return "diffusion"


def _check_output_dir(out: Path) -> bool:
    if out.exists() and not out.is_dir():
        print(f"dlmrl estimators: --output-dir {out} exists and is not a folder", file=sys.stderr)
        return False
    if out.is_dir() and any(out.iterdir()):  # (as dlmrl train: never write over an earlier study)
        print(f"dlmrl estimators: --output-dir {out} is not empty (it may hold an earlier study); choose a new "
              "folder or remove it", file=sys.stderr)
        return False
    return True


def _run_uniform_estimators(args) -> int:
    """``dlmrl estimators --kind uniform``: :func:`dlmrl.training.uniform_estimator_lab.run_uniform_estimator_lab`."""
    from dlmrl.estimators.analysis import LabConfig
    from dlmrl.estimators.uniform_lab import UniformLabConfig
    from dlmrl.training.uniform_estimator_lab import (
        DEFAULT_UNIFORM_LENGTHS,
        TINY_UNIFORM_MODEL,
        load_lab_model,
        run_uniform_estimator_lab,
    )

    d = LabConfig()
    defaults = {"long_budgets": d.long_budgets, "model_repetitions": d.model_repetitions,
                "directions": d.num_directions, "perturbation": d.perturbation, "family": "auto",
                "trust_remote_code": False}
    set_masked = [flag for key, flag in _MASKED_LAB_ONLY.items() if getattr(args, key) != defaults[key]]
    if set_masked:
        print(f"dlmrl estimators: {', '.join(set_masked)} applies to the masked lab only, not to --kind uniform",
              file=sys.stderr)
        return 2
    lengths, rows = args.lengths or DEFAULT_UNIFORM_LENGTHS, args.rows or (4,)
    cfg = UniformLabConfig(budgets=args.budgets, repetitions=args.repetitions, seed=args.seed)
    if args.quick:
        lengths, rows = (2,), args.rows or (2,)
        cfg.budgets, cfg.repetitions = (2, 3), 500
    if len(rows) not in (1, len(lengths)):
        print(f"dlmrl estimators: --rows has {len(rows)} values for {len(lengths)} lengths", file=sys.stderr)
        return 2
    if cfg.repetitions < 2:
        print("dlmrl estimators: --repetitions must be >= 2", file=sys.stderr)
        return 2
    out = Path(args.output_dir)
    if not _check_output_dir(out):
        return 2
    name = args.model or TINY_UNIFORM_MODEL
    try:
        model = load_lab_model(name, seed=args.seed)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"dlmrl estimators: cannot load model {name!r}: {e}", file=sys.stderr)
        return 2
    try:
        run_uniform_estimator_lab(out, model, lengths, rows[0] if len(rows) == 1 else rows, cfg)
    except ValueError as e:
        print(f"dlmrl estimators: {e}", file=sys.stderr)
        return 2
    return 0


def _run_estimators(args) -> int:
    from dlmrl.estimators.analysis import LabConfig
    from dlmrl.models.loading import load_policy
    from dlmrl.training.estimator_lab import default_rows, run_estimator_lab

    if _lab_kind(args) == "uniform":
        return _run_uniform_estimators(args)
    args.model = args.model or "tiny-sudoku"
    args.lengths = args.lengths or (8, 16, 64, 256)
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
    if not _check_output_dir(out):
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


def _eval_run_config(args) -> Path | None:
    """``dlmrl eval --model RUN/final_model`` without ``--config``: the run's own config (its policy kind, task and
    evaluation settings): the copy the model folder holds (``dlmrl_config.yaml``, so a moved folder keeps it), else
    the ``config.yaml`` of the run folder it sits in."""
    from dlmrl.training.run_folder import RUN_CONFIG

    if args.command != "eval" or args.config or not getattr(args, "model", None):
        return None
    for saved in (Path(args.model) / RUN_CONFIG, Path(args.model).parent / "config.yaml"):
        if saved.is_file():
            return saved
    return None


def _build(args, cls):
    """The validated config of ``args``, and (train, eval) its :class:`~dlmrl.config.RunSpec` (else ``None``)."""
    cfg = cls()
    saved = _resume_config(args) if getattr(args, "resume", False) else _eval_run_config(args)
    source = saved or args.config or default_config_path()
    args.config_source = str(source)  # (errors and --dry-run name it)
    if cls is Config:
        load_yaml(cfg, source, chosen=False if saved is not None else None)  # (a saved config: the run's, in full)
        if saved is not None and args.config and getattr(args, "resume", False):
            _check_resume_config(args, saved)
    elif args.config:
        load_yaml(cfg, args.config)
    apply_overrides(cfg, args.overrides)
    if args.output_dir:
        cfg.output_dir = args.output_dir
    if getattr(args, "model", None):
        cfg.model.name_or_path = args.model
    if cls is not Config:
        validate_pretrain(cfg)
        return cfg, None
    if source == default_config_path():  # (before validating: estimator.options are the algorithm's estimator's)
        use_the_algorithms_estimator(cfg, args.overrides)
    return cfg, validate(cfg, for_training=args.command == "train")  # (eval trains nothing: any algorithm will do)


def _check_resume_config(args, saved: Path) -> None:
    """``--resume --config FILE``: the run continues with its own ``config.yaml``; refuse a FILE whose settings
    differ from it rather than ignore it silently."""
    from dlmrl.training.run_folder import check_same_config

    given = Config()
    load_yaml(given, args.config)
    apply_overrides(given, args.overrides)
    given.output_dir = str(saved.parent)
    check_same_config(given, saved)


def _dry_run(cfg: Config, spec, config_file: str | None, resume: bool = False, processes: int | None = None) -> int:
    """``dlmrl train --dry-run``: print the plan of a validated config and its :class:`~dlmrl.config.RunSpec`
    (:mod:`dlmrl.training.plan`); with ``--resume``, of the run it would continue (its saved ``config.yaml``); with
    ``processes`` (``--num-processes``), for that many processes."""
    from dlmrl.training.plan import build_plan, format_plan

    if processes is not None and processes < 1:
        print(f"dlmrl train --dry-run: --num-processes must be >= 1, got {processes}", file=sys.stderr)
        return 2
    try:
        plan = build_plan(cfg, resume=resume, spec=spec, processes=processes)
    except (ConfigError, ValueError, OSError) as e:
        print(f"dlmrl train --dry-run: {e}", file=sys.stderr)
        return 2
    if plan["accelerate"].get("process_index", 0) != 0:  # (under accelerate launch: the main process prints)
        return 0
    source = config_file or default_config_path()
    print(f"# dlmrl train --dry-run: {source} is valid; no model was loaded and nothing was downloaded.")
    print(format_plan(plan), end="")
    if "error" in plan["accelerate"]:
        print(f"dlmrl train --dry-run: accelerate cannot set up the processes: {plan['accelerate']['error']}",
              file=sys.stderr)
        return 2
    return 0


def eval_length_configs(cfg: Config, lengths: tuple[int, ...]) -> list[Config]:
    """One validated config per generation length: ``sampling.gen_length = L`` and ``eval.steps`` scaled by
    ``L / sampling.gen_length`` (the recipe's steps per token, e.g. d1's L/2).

    Raises:
        ConfigError: a task whose canvas length is fixed (Sudoku infill/full), a length whose steps are not an
            integer, or a length the sampler settings do not fit (e.g. not a multiple of ``block_length``).
    """
    import copy

    if cfg.task.name == "sudoku" and cfg.task.answer_mode != "text":
        raise ConfigError(f"--gen-lengths: sudoku with answer_mode {cfg.task.answer_mode!r} has a fixed 16-cell "
                          "canvas; generation lengths apply to the text tasks and answer_mode text")
    out = []
    for length in lengths:
        c = copy.deepcopy(cfg)
        c.sampling.gen_length = length
        steps = cfg.eval.steps * length / cfg.sampling.gen_length
        if cfg.eval.preset != "none":  # (the preset's steps at each length: dlmrl.evaluation.presets)
            from dlmrl.evaluation.presets import PRESETS

            problem = kind_of(cfg.model.kind).eval_preset_problem(PRESETS[cfg.eval.preset], length)
            if problem:
                raise ConfigError(f"--gen-lengths {length}: eval.preset {cfg.eval.preset!r}: {problem}")
            out.append(_validated_length(c, length))
            continue
        if kind_of(cfg.model.kind).denoises and steps != int(steps):
            raise ConfigError(f"--gen-lengths {length}: eval.steps {cfg.eval.steps} at gen_length "
                              f"{cfg.sampling.gen_length} gives {steps:g} steps at {length}; choose lengths or "
                              "eval.steps that scale to whole steps")
        c.eval.steps = max(1, int(steps))
        out.append(_validated_length(c, length))
    return out


def _validated_length(c: Config, length: int) -> Config:
    try:
        validate(c)
    except ConfigError as e:
        raise ConfigError(f"--gen-lengths {length}: {e}") from None
    return c


def eval_lengths(cfg: Config, lengths: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """The generation lengths ``dlmrl eval`` runs: ``--gen-lengths``, else the ``eval.preset``'s (d1: 128, 256,
    512), else ``None`` (the config's one length)."""
    if lengths:
        return lengths
    from dlmrl.evaluation.presets import PRESETS

    preset = PRESETS.get(cfg.eval.preset)
    return preset.gen_lengths if preset is not None else None


def best_of_lengths(results: list[dict]) -> dict:
    """The summary line of a multi-length ``dlmrl eval``: the best primary metric over the lengths (and its
    length), their mean, and each length's value, with the protocol and the records' protocol hashes."""
    metric = results[0]["primary_metric"]
    values = {r["record"]["sampling"]["gen_length"]: r[metric] for r in results}
    best = max(values, key=lambda k: values[k])
    return {"best_of_lengths": {"metric": metric, "value": values[best], "gen_length": best,
                                "mean": sum(values.values()) / len(values), "per_length": values,
                                "protocol": results[0]["protocol"],
                                "protocol_hashes": [r["record"]["protocol_hash"] for r in results]}}


def _run_eval(cfg: Config, lengths: tuple[int, ...] | None, out_dir: Path | None = None) -> int:
    """``dlmrl eval``: the task's metrics as JSON, each with its ``record`` (protocol, sampling settings, model,
    versions, dtype, device, hashes). Several lengths (``--gen-lengths`` or the ``eval.preset``'s): one JSON line
    per length, then one ``best_of_lengths`` line. With ``--output-dir``, the same is also written to
    ``<output-dir>/eval.json`` (a list of those objects)."""
    from dlmrl.evaluation.heldout import check_held_out_size
    from dlmrl.training.finite import json_ready
    from dlmrl.training.run_setup import build_task, evaluate_config, load_configured_policy

    def dumps(obj, **kw) -> str:  # (a non-finite metric prints as null: the output stays valid JSON)
        return json.dumps(json_ready(obj), allow_nan=False, **kw)

    try:
        lengths = eval_lengths(cfg, lengths)
        configs = eval_length_configs(cfg, lengths) if lengths else [cfg]
        policy = load_configured_policy(cfg)
        task = build_task(cfg, policy)
        check_held_out_size(task, cfg.eval.num_puzzles)  # (hub data: its size is known only once loaded)
    except ConfigError as e:
        print(f"dlmrl eval: {e}", file=sys.stderr)
        return 2
    results, printed = [], []
    for c in configs:
        task.gen_length = c.sampling.gen_length if lengths else task.gen_length  # (one task, its data loaded once)
        result = evaluate_config(c, policy, task)
        results.append(result)
        if lengths:
            steps = result["record"]["sampling"]["steps"]
            printed.append({"gen_length": c.sampling.gen_length, "steps": steps, **result})
            print(dumps(printed[-1]), flush=True)
        else:
            printed.append(result)
            print(dumps(result, indent=2))
    if lengths and len(results) > 1:
        printed.append(best_of_lengths(results))
        print(dumps(printed[-1]), flush=True)
    if out_dir is not None:
        from dlmrl.training.checkpoint import write_json_atomic

        out_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out_dir / "eval.json", printed)
        print(f"wrote {out_dir / 'eval.json'}", file=sys.stderr)
    return 0


def _report_failure(message: str | None) -> None:
    """Print a failed command's ``message`` on stderr in one write (several processes printing at once do not
    interleave their lines), and under ``accelerate launch`` the note on the launcher's own traceback
    (:func:`~dlmrl.training.distributed.launcher_note`)."""
    from dlmrl.training.distributed import launcher_note

    note = launcher_note()
    text = "".join(f"{line}\n" for line in (message, note) if line)
    if text:
        sys.stderr.write(text)
        sys.stderr.flush()


def _format_warning(message, category, filename, lineno, line=None) -> str:
    """Warnings on the command line as one plain line (no source path and line of the library)."""
    return f"dlmrl: {category.__name__}: {message}\n"


def main(argv: list[str] | None = None) -> int:
    import warnings

    from dlmrl.warning_policy import install as install_warning_policy

    warnings.formatwarning = _format_warning
    install_warning_policy()  # (library deprecations silenced, every other warning shown once)
    parser = _parser()
    # key=value overrides may come after flags too (argparse's subparsers stop at the first flag).
    args, extra = parser.parse_known_args(argv)
    from dlmrl.plugins import PluginError

    try:
        _load_user_code(args)
    except PluginError as e:
        print(f"dlmrl {args.command}: {e}", file=sys.stderr)
        return 2
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
    from dlmrl.training.memory_config import planned_processes

    try:
        planned = getattr(args, "num_processes", None) if getattr(args, "dry_run", False) else None
        with planned_processes(planned):  # (--dry-run --num-processes N: the config check plans for N too)
            cfg, spec = _build(args, PretrainConfig if args.command == "pretrain" else Config)
    except ConfigError as e:
        e = locate_error(e, getattr(args, "config_source", args.config), args.overrides)
        _report_failure(f"dlmrl {args.command}: config error: {e}")
        return 2
    if args.command == "train" and args.dry_run:
        return _dry_run(cfg, spec, args.config_source, resume=args.resume, processes=args.num_processes)
    if args.command == "train" and args.num_processes is not None:
        print("dlmrl train: --num-processes plans a launch and goes with --dry-run; to train on N processes, start "
              "them with accelerate launch --num_processes N (README, Multi-process and multi-GPU)", file=sys.stderr)
        return 2
    if args.command == "train":
        from dlmrl.training.distributed import (
            RELAUNCHED,
            check_process_split,
            check_sharding_backend,
            cpu_relaunch_command,
            requested_cpu_processes,
        )

        cpu_processes = requested_cpu_processes()
        if cpu_processes:  # `accelerate launch --cpu --num_processes N` without mpirun started this process alone
            from dlmrl.training.checkpoint import CheckpointError
            from dlmrl.training.run_folder import check_run_folder

            try:  # (what the processes would refuse, refused here once: no error printed N times over a traceback)
                check_process_split(cfg, cpu_processes, spec.preset)
                check_sharding_backend()
                check_run_folder(cfg, args.resume)
            except (ConfigError, FileNotFoundError, CheckpointError) as e:
                _report_failure(f"dlmrl train: {e}")
                return 2
            import subprocess

            print(f"dlmrl train: accelerate launch --cpu starts one process unless it runs mpirun; starting the "
                  f"{cpu_processes} CPU processes with torch.distributed.run", file=sys.stderr, flush=True)
            child = subprocess.Popen(cpu_relaunch_command(argv if argv is not None else sys.argv[1:], cpu_processes),
                                     env={**os.environ, RELAUNCHED: "1"})
            try:
                code = child.wait()
            except KeyboardInterrupt:  # (Ctrl-C reached the processes too: wait while they save, rather than kill)
                try:
                    child.wait()
                except KeyboardInterrupt:  # (a second Ctrl-C: stop now)
                    child.kill()
                return 130
            if code not in (0, 130):
                _report_failure(None)  # (the processes printed their messages; the launcher's note)
            return code
        from dlmrl.data.loading import DataError
        from dlmrl.envs.tools.simulator import ToolAnswerError
        from dlmrl.rewards.functions import RewardFunctionError
        from dlmrl.training.checkpoint import CheckpointError
        from dlmrl.training.finite import NonFiniteError
        from dlmrl.training.trainer import train

        try:
            if args.no_progress:  # (also transformers' loading/saving bars)
                from transformers.utils import logging as hf_logging

                hf_logging.disable_progress_bar()
            train(cfg, resume=args.resume, progress=not args.no_progress)
        except KeyboardInterrupt:
            return 130
        except (FileNotFoundError, ConfigError, RewardFunctionError, CheckpointError, DataError,
                NonFiniteError, ToolAnswerError) as e:
            _report_failure(f"dlmrl train: {e}")
            return 2
        if os.environ.get("RANK", "0") != "0":  # (several processes: the main one reports)
            return 0
        # (the trainer has printed the held-out metric before and after: dlmrl.training.trainer.train)
        print(f"wrote {Path(cfg.output_dir) / 'summary.json'}")
    elif args.command == "eval":
        return _run_eval(cfg, args.gen_lengths, Path(args.output_dir) if args.output_dir else None)
    else:
        from dlmrl.pretraining.ar import pretrain_ar
        from dlmrl.pretraining.loop import pretrain

        try:
            if cfg.task == "multihop":
                from dlmrl.pretraining.multihop import pretrain_multihop

                run = pretrain_multihop
            elif cfg.task == "recommend":
                from dlmrl.pretraining.recommend import pretrain_recommend

                run = pretrain_recommend
            else:
                from dlmrl.pretraining.block import pretrain_block
                from dlmrl.pretraining.uniform import pretrain_uniform

                run = {"ar": pretrain_ar, "block": pretrain_block, "uniform": pretrain_uniform}.get(cfg.kind, pretrain)
            print(json.dumps(run(cfg), indent=2))
        except ConfigError as e:
            print(f"dlmrl pretrain: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
