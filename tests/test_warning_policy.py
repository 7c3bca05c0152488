"""The command line's warning policy (dlmrl.warning_policy): library deprecations silenced, the rest shown once,
and the user's own -W / PYTHONWARNINGS settings left alone. Run in subprocesses: the policy changes the process's
warning filters, which pytest's own warning capture must not see."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = r"""
import warnings
from dlmrl.warning_policy import install
print("installed" if install() else "left alone")
# a library's deprecation notice, attributed to the library's module as warnings.warn does inside it
warnings.warn_explicit("pa.PyExtensionType is deprecated", FutureWarning, "pyarrow/lib.py", 10, module="pyarrow.lib")
warnings.warn_explicit("old kwarg", DeprecationWarning, "accelerate/state.py", 5, module="accelerate.state")
for step in range(3):  # the same warning from two call sites, three times each
    warnings.warn("reward function 'f' cannot score 1 of 3 rows", UserWarning)
    warnings.warn("reward function 'f' cannot score 1 of 3 rows", UserWarning)
warnings.warn_explicit("target module not found", UserWarning, "peft/tuners.py", 7, module="peft.tuners")
warnings.warn("this library API changes", FutureWarning)  # (raised in user code: kept)
"""


def run(env_extra: dict, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"} | env_extra
    return subprocess.run([sys.executable, *args, "-c", SCRIPT], capture_output=True, text=True, env=env,
                          timeout=120, check=True)


def test_library_deprecations_are_silenced_and_everything_else_is_shown_once():
    done = run({})
    assert done.stdout.strip() == "installed"
    err = done.stderr
    assert "PyExtensionType" not in err and "old kwarg" not in err
    assert err.count("cannot score 1 of 3 rows") == 1
    assert "target module not found" in err  # (a library's UserWarning may matter: kept)
    assert "this library API changes" in err
    assert "5 repeated warning(s) not shown again" in err


def test_the_users_own_warning_settings_win():
    for env, args in (({"PYTHONWARNINGS": "always"}, ()), ({}, ("-W", "always"))):
        done = run(env, *args)
        assert done.stdout.strip() == "left alone"
        assert done.stderr.count("cannot score 1 of 3 rows") == 6 and "PyExtensionType" in done.stderr


def test_the_cli_installs_it(tmp_path):
    """One training step on a dataset file with one unscorable row: the row's warning (checked at validation, and
    again when the task loads its data at set-up; three times without the policy) is printed once."""
    data = tmp_path / "m.jsonl"
    data.write_text('{"problem": "1+1", "answer": ""}\n{"problem": "2+2", "answer": "4"}\n')
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    done = subprocess.run([sys.executable, "-m", "dlmrl.cli", "train", "task.name=dataset", f"task.train_file={data}",
                           "task.prompt_column=problem", "train.reward_funcs=[math]", "eval.before=false",
                           "eval.after=false", f"output_dir={tmp_path / 'run'}", "max_steps=1", "prompts_per_step=2",
                           "num_generations=2", "sampling.gen_length=16", "--no-progress"],
                          check=False, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("cannot score 1 of 2 rows") == 1, done.stderr
