"""Behaviour snapshot of every shipped config: ``--dry-run`` plans and 2 training steps, before/after a refactor.

Written for issue 34 ("Policy kinds as objects"), whose closing condition is: for every config in ``configs/``,
the ``--dry-run`` output before and after the refactor is identical apart from listed, justified lines, and 2
training steps' logged metrics are equal for a fixed seed. It drives only the ``dlmrl`` command line of a
checkout (never its internals, which are what a refactor moves), so one script serves both sides.

How to run it (from any folder; the venv's python has torch, transformers, accelerate and PyYAML)::

    # before: a worktree of the pre-refactor commit
    git worktree add /work/before <commit>
    .venv/bin/python scripts/behaviour_snapshot.py snapshot --source /work/before --out /work/snapshots/before
    # after: the refactored checkout
    .venv/bin/python scripts/behaviour_snapshot.py snapshot --source . --out /work/snapshots/after
    .venv/bin/python scripts/behaviour_snapshot.py compare /work/snapshots/before /work/snapshots/after \\
        --allow-dry-run-lines scripts/behaviour_snapshot_allow.txt

``snapshot --configs NAME ...`` (file stems or names) limits a snapshot to some configs, ``compare --configs``
the comparison; ``--no-train`` records the dry runs only; ``--steps`` (2) and ``--timeout`` (600 s per command)
set the run length and the limit. At e02313e a full snapshot (59 configs: 54 dry runs, 49 short runs, 10 hub
recipes skipped) takes about 12 minutes on 2 CPU cores.

What a snapshot runs, per ``SOURCE/configs/*.yaml`` (not ``configs/accelerate/``), one command at a time, each
as ``python -c "import sys; from dlmrl.cli import main; sys.exit(main())" ARGS`` with ``cwd=SOURCE`` (relative
config paths resolve as a user's would) and ``PYTHONPATH=SOURCE`` (so ``import dlmrl`` is the checkout's, not
the editable install's: checked before anything runs, and recorded as ``dlmrl_file`` in ``summary.json``):

- train configs (every name but ``pretrain_*``): ``train --config configs/X.yaml --dry-run``: exit code, stdout
  and stderr (kept apart: the interleaving of two pipes is not the program's behaviour). Then
  ``train --config configs/X.yaml --no-progress train.max_steps=2 output_dir=RUN``, RUN a fresh temporary
  folder, everything else the config's (its seed, its held-out evaluation before and after training: the
  default 256 examples cost seconds on the tiny models, and they exercise the evaluation path of each policy
  kind). Recorded: every line of ``RUN/metrics.jsonl``, ``RUN/summary.json`` (eval_before/eval_after, totals),
  ``RUN/config.yaml`` (the resolved config the run saved, as text) and the SHA-256 of each
  ``RUN/final_model/*.safetensors`` (the trained weights, bit for bit).
- ``pretrain_*`` configs: ``dlmrl pretrain`` has no ``--dry-run`` at commit e02313e (its ``--help`` is read
  and the dry run is recorded as ``not offered``; a checkout whose ``pretrain --help`` offers ``--dry-run``
  gets it run). Then ``pretrain --config configs/X.yaml steps=2 output_dir=RUN/out``: its
  ``pretrain_summary.json`` (final loss and the held-out evaluation; pretraining writes no per-step log),
  ``pretrain_config.yaml`` as text and the weights' SHA-256.
- Hub recipes are not trained: a config whose ``model.name_or_path`` (read from the YAML with PyYAML) holds a
  ``/`` and is no existing path under SOURCE names a hub model (LLaDA, SDAR, LLaDA2), which cannot load
  offline; the record says ``skipped: hub model NAME``. Their dry runs are recorded (they load no model).

Normalisations (the only edits to what a command printed or wrote):

- the checkout's absolute path (as given and resolved) -> ``<SRC>`` (dry-run lines name the shipped models'
  folders, e.g. ``<SRC>/dlmrl/assets/tiny_sudoku/config.json``); the run's temporary folder -> ``<RUN>``.
- wall-clock fields are dropped from metrics and summaries, at any depth: a key equal to ``seconds``, starting
  with ``seconds_`` or ending with ``_seconds``, or containing ``per_second``, ``throughput`` or ``timestamp``.
  At e02313e these are metrics.jsonl's ``seconds_rollout``, ``seconds_scoring_old``, ``seconds_update``,
  ``seconds_scoring``, ``seconds_optimizer``, ``seconds_step`` (also inside summary.json's
  ``final_metrics``), summary.json's and pretrain_summary.json's ``train_seconds`` and the multihop/recommend
  pretraining's ``seconds_total``. Each record lists the keys it dropped (``dropped_keys``). Every other value
  is kept as written (JSON floats round-trip exactly).

Environment of every command (the same on both sides, so the numerics match whatever else the machine runs):
``OMP_NUM_THREADS=1``, ``MKL_NUM_THREADS=1`` (one thread: the same summation order in every reduction),
``PYTHONHASHSEED=0`` (set and dict-of-str iteration order), ``CUDA_VISIBLE_DEVICES=`` (CPU),
``HF_HUB_OFFLINE=1``, ``TRANSFORMERS_OFFLINE=1``, ``HF_DATASETS_OFFLINE=1`` (fail fast instead of waiting on
a network), ``PYTHONPATH=SOURCE``; inherited launcher variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``, ``ACCELERATE_*``) are removed. Run both snapshots on the same machine and
venv: the summary records python, torch and transformers versions, and ``compare`` warns when they differ.

Known caveat: the dry run prints ``output.state`` of the config's ``output_dir`` relative to SOURCE
(``new``, or ``holds a run`` when ``SOURCE/runs/...`` exists); the snapshot lists the config output folders
that existed (``existing_output_dirs`` in summary.json) so such a diff is explained, not hidden.

``compare BEFORE AFTER`` prints, per config, ``identical`` or what differs: the dry run's exit code and a
unified diff of its stdout/stderr (and of the saved run config), the training status and exit code, each
metric that differs as (key, step, before, after), summary values by dotted path, weight hashes; and the
configs present in only one snapshot. Metrics compare exactly (same type, same value; NaN equals NaN). It exits
0 only when nothing differs but dry-run/saved-config lines matched by ``--allow-dry-run-lines FILE``: one
Python regex per line (``re.search`` on the line's text), each preceded by ``#`` comment lines justifying it;
a regex without a justification is refused.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLI = "import sys; from dlmrl.cli import main; sys.exit(main())"
PROBE = ("import json, sys, dlmrl, torch, transformers; print(json.dumps({'dlmrl_file': dlmrl.__file__, "
         "'python': sys.version.split()[0], 'torch': torch.__version__, 'transformers': transformers.__version__, "
         "'torch_num_threads': torch.get_num_threads()}))")
FIXED_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "CUDA_VISIBLE_DEVICES": "",
             "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
REMOVED_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
TIMING_KEY = re.compile(r"^seconds$|^seconds_|_seconds$|per_second|throughput|timestamp")
TAIL_LINES = 40


# ----------------------------------------------------------------------------------------------------- running


def command_env(source: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in REMOVED_ENV and not k.startswith("ACCELERATE_")}
    env.update(FIXED_ENV)
    env["PYTHONPATH"] = str(source)
    return env


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> dict:
    """Run ``cmd``; its exit code, stdout and stderr (text), seconds; on timeout its process group is killed."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # (its own session: the command and any children it started)
        out, err = proc.communicate()
        timed_out = True
    return {"rc": proc.returncode, "stdout": out, "stderr": err, "timed_out": timed_out,
            "seconds": round(time.monotonic() - start, 2)}


def normaliser(source: Path, run_dir: Path | None = None):
    subs = []
    if run_dir is not None:  # (first: a temporary folder could sit under the source)
        subs += [(str(run_dir.resolve()), "<RUN>"), (str(run_dir), "<RUN>")]
    subs += [(str(source.resolve()), "<SRC>"), (str(source.absolute()), "<SRC>")]
    subs = sorted(set(subs), key=lambda s: -len(s[0]))

    def norm(text: str) -> str:
        for old, new in subs:
            text = text.replace(old, new)
        return text
    return norm


def drop_timing(obj, dropped: set[str]):
    """``obj`` without wall-clock keys (:data:`TIMING_KEY`), at any depth; their names go into ``dropped``."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if isinstance(k, str) and TIMING_KEY.search(k):
                dropped.add(k)
            else:
                out[k] = drop_timing(v, dropped)
        return out
    if isinstance(obj, list):
        return [drop_timing(v, dropped) for v in obj]
    return obj


def hub_model(source: Path, config: Path) -> str | None:
    """The config's ``model.name_or_path`` when it names a hub model (a ``/`` and no such local path), else None."""
    import yaml

    try:
        data = yaml.safe_load(config.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None  # (the dry run reports a broken file; training is attempted and fails on its own)
    model = data.get("model") if isinstance(data, dict) else None
    name = model.get("name_or_path") if isinstance(model, dict) else None
    if not isinstance(name, str) or "/" not in name:
        return None
    path = Path(name) if Path(name).is_absolute() else source / name
    return None if path.exists() else name


def output_dir_of(config: Path) -> str | None:
    import yaml

    try:
        data = yaml.safe_load(config.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    out = data.get("output_dir") if isinstance(data, dict) else None
    return out if isinstance(out, str) else None


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tail(text: str, norm) -> list[str]:
    return norm(text).splitlines()[-TAIL_LINES:]


def status_of(result: dict) -> str:
    return "timeout" if result["timed_out"] else ("ok" if result["rc"] == 0 else "failed")


# ---------------------------------------------------------------------------------------------------- snapshot


def dry_run(python: str, source: Path, rel: str, pretrain: bool, pretrain_dry_run: bool, env, timeout) -> dict:
    if pretrain and not pretrain_dry_run:
        return {"status": "not offered", "reason": "`dlmrl pretrain --help` lists no --dry-run"}
    args = ["pretrain" if pretrain else "train", "--config", rel, "--dry-run"]
    r = run([python, "-c", CLI, *args], source, env, timeout)
    norm = normaliser(source)
    return {"status": status_of(r), "command": ["dlmrl", *args], "rc": r["rc"], "seconds": r["seconds"],
            "stdout": norm(r["stdout"]).splitlines(), "stderr": norm(r["stderr"]).splitlines()}


def train_run(python: str, source: Path, rel: str, pretrain: bool, steps: int, env, timeout, keep: bool) -> dict:
    hub = hub_model(source, source / rel)
    if hub is not None:
        return {"status": "skipped", "reason": f"skipped: hub model {hub} (cannot load offline)"}
    tmp = Path(tempfile.mkdtemp(prefix="dlmrl_snapshot_"))
    run_dir = tmp / "out"  # (pretrain refuses to replace a folder it did not write: a fresh name)
    norm = normaliser(source, run_dir)
    if pretrain:
        args = ["pretrain", "--config", rel, f"steps={steps}", f"output_dir={run_dir}"]
    else:
        args = ["train", "--config", rel, "--no-progress", f"train.max_steps={steps}", f"output_dir={run_dir}"]
    try:
        r = run([python, "-c", CLI, *args], source, env, timeout)
        rec = {"status": status_of(r), "command": ["dlmrl", *[norm(a) for a in args]], "rc": r["rc"],
               "seconds": r["seconds"]}
        dropped: set[str] = set()
        metrics_file = run_dir / "metrics.jsonl"
        if metrics_file.exists():
            rec["metrics"] = [drop_timing(json.loads(line), dropped)
                              for line in metrics_file.read_text().splitlines() if line.strip()]
        elif not pretrain:
            rec["metrics"] = None
        summary = run_dir / ("pretrain_summary.json" if pretrain else "summary.json")
        rec["summary"] = drop_timing(json.loads(summary.read_text()), dropped) if summary.exists() else None
        saved = run_dir / ("pretrain_config.yaml" if pretrain else "config.yaml")
        rec["saved_config"] = norm(saved.read_text()).splitlines() if saved.exists() else None
        weights_dir = run_dir if pretrain else run_dir / "final_model"
        rec["weights_sha256"] = {p.name: sha256(p) for p in sorted(weights_dir.glob("*.safetensors"))}
        rec["dropped_keys"] = sorted(dropped)
        if rec["status"] != "ok":
            rec["stdout_tail"], rec["stderr_tail"] = tail(r["stdout"], norm), tail(r["stderr"], norm)
        return rec
    finally:
        if keep:
            print(f"  kept {run_dir}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def select_configs(names: list[str] | None, available: list[str]) -> list[str]:
    if not names:
        return available
    wanted = {Path(n).name.removesuffix(".yaml") for n in names}
    unknown = wanted - set(available)
    if unknown:
        raise SystemExit(f"behaviour_snapshot: no such config(s): {', '.join(sorted(unknown))}")
    return [c for c in available if c in wanted]


def git_state(source: Path) -> dict:
    def git(*a):
        r = subprocess.run(["git", "-C", str(source), *a], capture_output=True, text=True, check=False)
        return r.stdout.strip() if r.returncode == 0 else None
    status = git("status", "--porcelain")
    return {"commit": git("rev-parse", "HEAD"), "dirty": status.splitlines() if status else []}


def snapshot(args) -> int:
    source = Path(args.source).absolute()
    if not (source / "dlmrl" / "cli.py").is_file():
        raise SystemExit(f"behaviour_snapshot: {source} is not a dlmrl checkout (no dlmrl/cli.py)")
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"behaviour_snapshot: --out {out} is not empty; choose a new folder")
    env = command_env(source)
    probe = run([args.python, "-c", PROBE], source, env, 120)
    if probe["rc"] != 0:
        raise SystemExit(f"behaviour_snapshot: cannot import dlmrl from {source}:\n{probe['stderr']}")
    meta = json.loads(probe["stdout"].strip().splitlines()[-1])
    if not Path(meta["dlmrl_file"]).resolve().is_relative_to(source.resolve()):
        raise SystemExit(f"behaviour_snapshot: `import dlmrl` resolved to {meta['dlmrl_file']}, not under {source}")
    help_run = run([args.python, "-c", CLI, "pretrain", "--help"], source, env, 120)
    pretrain_dry_run = "--dry-run" in help_run["stdout"]
    available = sorted(p.stem for p in (source / "configs").glob("*.yaml"))
    configs = select_configs(args.configs, available)
    existing = {}
    for name in configs:
        od = output_dir_of(source / "configs" / f"{name}.yaml")
        if od and (source / od).exists():
            existing[name] = od
    (out / "configs").mkdir(parents=True, exist_ok=True)
    started = time.time()
    summary = {"source": str(source), "git": git_state(source), "python_executable": args.python,
               **meta, "env": FIXED_ENV, "steps": args.steps, "timeout_s": args.timeout,
               "pretrain_dry_run_offered": pretrain_dry_run, "existing_output_dirs": existing,
               "started": time.strftime("%Y-%m-%d %H:%M:%S"), "configs": {}}
    for i, name in enumerate(configs, 1):
        rel = f"configs/{name}.yaml"
        pretrain = name.startswith("pretrain_")
        t0 = time.monotonic()
        rec = {"config": rel, "command": "pretrain" if pretrain else "train"}
        rec["dry_run"] = dry_run(args.python, source, rel, pretrain, pretrain_dry_run, env, args.timeout)
        rec["train"] = ({"status": "not run", "reason": "--no-train"} if args.no_train else
                        train_run(args.python, source, rel, pretrain, args.steps, env, args.timeout, args.keep_runs))
        (out / "configs" / f"{name}.json").write_text(json.dumps(rec, indent=1, allow_nan=True) + "\n")
        secs = round(time.monotonic() - t0, 1)
        summary["configs"][name] = {"dry_run": rec["dry_run"]["status"], "train": rec["train"]["status"],
                                    "reason": rec["train"].get("reason"), "seconds": secs}
        print(f"[{i}/{len(configs)}] {name}: dry-run {rec['dry_run']['status']}, train {rec['train']['status']}"
              f" ({secs} s)", flush=True)
    summary["seconds_total"] = round(time.time() - started, 1)
    counts: dict[str, dict[str, int]] = {"dry_run": {}, "train": {}}
    for entry in summary["configs"].values():
        for part, tally in counts.items():
            tally[entry[part]] = tally.get(entry[part], 0) + 1
    summary["counts"] = counts
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"snapshot of {len(configs)} configs in {summary['seconds_total']} s: {json.dumps(counts)}; wrote {out}")
    return 0


# ----------------------------------------------------------------------------------------------------- compare


def load_allowlist(path: str | None) -> list[re.Pattern]:
    """Regexes of ``path``: each non-comment line, which must follow at least one ``#`` justification line."""
    if not path:
        return []
    patterns, justified = [], False
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            justified = False  # (a justification belongs to the regex right under it)
            continue
        if line.lstrip().startswith("#"):
            justified = True
            continue
        if not justified:
            raise SystemExit(f"behaviour_snapshot: {path}:{n}: regex {line!r} has no '#' justification line above it")
        try:
            patterns.append(re.compile(line))
        except re.error as e:
            raise SystemExit(f"behaviour_snapshot: {path}:{n}: bad regex {line!r}: {e}") from None
    return patterns


def text_diff(label: str, before: list[str] | None, after: list[str] | None, allow: list[re.Pattern]):
    """(diff lines, whether every changed line is allowed) of two line lists."""
    before, after = before or [], after or []
    if before == after:
        return [], True
    diff = list(difflib.unified_diff(before, after, f"before/{label}", f"after/{label}", n=1, lineterm=""))
    changed = [d[1:] for d in diff if d[:1] in "+-" and not d.startswith(("+++", "---"))]
    return diff, all(any(p.search(line) for p in allow) for line in changed)


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


MISSING = "<absent>"


def flatten(obj, prefix: str = "") -> dict:
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out or {prefix: {}}
    if isinstance(obj, list):
        out = {}
        for i, v in enumerate(obj):
            out.update(flatten(v, f"{prefix}[{i}]"))
        return out or {prefix: []}
    return {prefix: obj}


def value_diffs(before, after) -> list[tuple[str, object, object]]:
    fb, fa = flatten(before), flatten(after)
    return [(k, fb.get(k, MISSING), fa.get(k, MISSING)) for k in sorted(set(fb) | set(fa))
            if not same(fb.get(k, MISSING), fa.get(k, MISSING))]


def metric_diffs(before: list | None, after: list | None) -> list[str]:
    if before is None or after is None:
        if before is after:
            return []
        side = {True: "absent", False: "present"}
        return [f"metrics.jsonl: before {side[before is None]}, after {side[after is None]}"]
    out = []
    if len(before) != len(after):
        out.append(f"metrics.jsonl: {len(before)} lines before, {len(after)} after")
    for i, (b, a) in enumerate(zip(before, after)):
        step = b.get("step", f"line {i + 1}") if isinstance(b, dict) else f"line {i + 1}"
        for key, vb, va in value_diffs(b, a):
            out.append(f"metric {key!r} step {step}: before {vb!r} after {va!r}")
    return out


def compare_config(b: dict, a: dict, allow: list[re.Pattern]) -> tuple[list[str], list[str]]:
    """(failures, allowed differences) between two config records."""
    fail, allowed = [], []
    db, da = b["dry_run"], a["dry_run"]
    for key in ("status", "rc"):
        if not same(db.get(key), da.get(key)):
            fail.append(f"dry-run {key}: before {db.get(key)!r} after {da.get(key)!r}")
    for stream in ("stdout", "stderr"):
        diff, ok = text_diff(f"dry-run {stream}", db.get(stream), da.get(stream), allow)
        (allowed if ok else fail).extend(diff)
    tb, ta = b["train"], a["train"]
    for key in ("status", "rc", "reason"):
        if not same(tb.get(key), ta.get(key)):
            fail.append(f"train {key}: before {tb.get(key)!r} after {ta.get(key)!r}")
    fail += metric_diffs(tb.get("metrics"), ta.get("metrics"))
    fail += [f"summary {k}: before {vb!r} after {va!r}" for k, vb, va in value_diffs(tb.get("summary"),
                                                                                     ta.get("summary"))]
    if tb.get("weights_sha256") != ta.get("weights_sha256"):
        fail.append(f"weights: before {tb.get('weights_sha256')} after {ta.get('weights_sha256')}")
    diff, ok = text_diff("saved config", tb.get("saved_config"), ta.get("saved_config"), allow)
    (allowed if ok else fail).extend(diff)
    if tb.get("dropped_keys") != ta.get("dropped_keys"):  # (timing keys: reported, never a failure)
        allowed.append(f"note: timing keys dropped before {tb.get('dropped_keys')} after {ta.get('dropped_keys')}")
    return fail, allowed


def compare(args) -> int:
    allow = load_allowlist(args.allow_dry_run_lines)
    dirs = [Path(args.before), Path(args.after)]
    summaries = []
    for d in dirs:
        if not (d / "summary.json").is_file():
            raise SystemExit(f"behaviour_snapshot: {d} holds no summary.json (not a snapshot, or unfinished)")
        summaries.append(json.loads((d / "summary.json").read_text()))
    for key in ("python", "torch", "transformers", "torch_num_threads", "env", "steps", "python_executable"):
        if summaries[0].get(key) != summaries[1].get(key):
            print(f"WARNING: {key} differs: before {summaries[0].get(key)!r} after {summaries[1].get(key)!r}")
    names = [sorted(p.stem for p in (d / "configs").glob("*.json")) for d in dirs]
    union = sorted(set(names[0]) | set(names[1]))
    if args.configs:
        union = [n for n in union if n in {Path(c).name.removesuffix(".yaml") for c in args.configs}]
    bad = 0
    for name in union:
        if name not in names[0] or name not in names[1]:
            print(f"{name}: only in {'before' if name in names[0] else 'after'}")
            bad += 1
            continue
        rb, ra = (json.loads((d / "configs" / f"{name}.json").read_text()) for d in dirs)
        fail, allowed = compare_config(rb, ra, allow)
        if not fail and not allowed:
            print(f"{name}: identical (dry-run {ra['dry_run']['status']}, train {ra['train']['status']})")
            continue
        print(f"{name}: {'DIFFERS' if fail else 'identical apart from allowed lines'}")
        for line in fail:
            print(f"    {line}")
        for line in allowed:
            print(f"    (allowed) {line}")
        bad += bool(fail)
    print(f"{len(union)} configs compared, {bad} with differences")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("snapshot", help="record the dry runs and short training runs of a checkout")
    s.add_argument("--source", required=True, help="the dlmrl checkout (its configs/ and dlmrl/)")
    s.add_argument("--out", required=True, help="new or empty folder for the snapshot")
    s.add_argument("--configs", nargs="+", help="only these configs (stems or file names)")
    s.add_argument("--steps", type=int, default=2, help="training steps per run (default 2)")
    s.add_argument("--timeout", type=float, default=600, help="seconds per command before it is killed (600)")
    s.add_argument("--python", default=sys.executable, help="interpreter to run the CLI with (default: this one)")
    s.add_argument("--no-train", action="store_true", help="record the dry runs only")
    s.add_argument("--keep-runs", action="store_true", help="keep the temporary run folders (for debugging)")
    c = sub.add_parser("compare", help="compare two snapshots; exit 0 only if they match")
    c.add_argument("before")
    c.add_argument("after")
    c.add_argument("--allow-dry-run-lines", metavar="FILE", help="regexes of dry-run/saved-config lines allowed to differ")
    c.add_argument("--configs", nargs="+", help="only these configs")
    args = p.parse_args(argv)
    return snapshot(args) if args.command == "snapshot" else compare(args)


if __name__ == "__main__":
    sys.exit(main())
