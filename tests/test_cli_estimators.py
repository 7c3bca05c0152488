"""``dlmrl estimators``: a small run end to end, and clear errors for bad inputs."""

from __future__ import annotations

import json

import pytest

from dlmrl.cli import main
from dlmrl.estimators.analysis import RECORD_FIELDS

SMALL = [
    "--lengths",
    "4,6",
    "--rows",
    "1",
    "--budgets",
    "2",
    "--long-budgets",
    "2",
    "--repetitions",
    "50",
    "--model-repetitions",
    "4",
    "--directions",
    "1",
]


def test_estimators_small_run(tmp_path, capsys):
    out = tmp_path / "lab"
    assert main(["estimators", "--output-dir", str(out), *SMALL]) == 0
    everything = json.loads((out / "estimators.json").read_text())
    records = [r for r in everything if r["estimator"] != "trajectory"]
    trajectory = [r for r in everything if r["estimator"] == "trajectory"]
    assert {r["length"] for r in records} == {4, 6} and {r["nfe"] for r in records} == {2}
    assert all(r["rows"] == 1 and r["repetitions"] == 50 and r["target"] == "exact" for r in records)
    assert sorted((r["length"], r["merge"]) for r in trajectory) == [(4, 1), (4, 2), (4, 4), (6, 1), (6, 2), (6, 4)]
    assert all(
        set(RECORD_FIELDS) - {"sampled_variance_t", "sampled_variance_mask"} <= set(r) for r in records
    )
    lab = json.loads((out / "lab.json").read_text())
    assert lab["lengths"] == [4, 6] and lab["rows"] == 1
    assert lab["config"]["budgets"] == [2] and lab["config"]["num_directions"] == 1
    for name in lab["files"]:
        assert (out / name).stat().st_size > 0
    printed = capsys.readouterr().out
    assert f"({len(everything)} records)" in printed and "| L | merge | NFE |" in printed


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--lengths", "4,6", "--rows", "1,2,3"], "--rows has 3 values for 2 lengths"),
        (
            ["--lengths", "4", "--repetitions", "1", "--rows", "1"],
            "--repetitions and --model-repetitions must be >= 2",
        ),
        (
            ["--lengths", "4", "--model-repetitions", "1", "--rows", "1"],
            "--repetitions and --model-repetitions must be >= 2",
        ),
        (["--lengths", "4", "--directions", "0", "--rows", "1"], "--directions >= 1"),
        (["--lengths", "4", "--perturbation", "0", "--rows", "1"], "--perturbation > 0"),
        (
            ["--lengths", "4", "--model", "/nonexistent/model", "--rows", "1"],
            "cannot load model '/nonexistent/model'",
        ),
        (["--lengths", "4", "--rows", "1000"], "ask for fewer rows"),
    ],
)
def test_estimators_bad_inputs_return_2(tmp_path, capsys, args, message):
    assert main(["estimators", "--output-dir", str(tmp_path / "lab"), *args]) == 2
    err = capsys.readouterr().err  # (model loading may also print a progress bar there)
    assert any(line.startswith("dlmrl estimators: ") and message in line for line in err.splitlines()), err
    assert not (tmp_path / "lab" / "estimators.json").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--lengths", "4,x"], "expected comma-separated integers, got '4,x'"),
        (["--lengths", "4,0"], "expected comma-separated integers >= 1"),
        (["--rows", "two"], "expected comma-separated integers"),
        (["--budgets", ""], "expected comma-separated integers >= 1"),
        (["--repetitions", "many"], "invalid int value: 'many'"),
        (["--lengths", "4", "stray=1"], "unrecognized arguments: stray=1"),
    ],
)
def test_estimators_unparsable_inputs_exit_2(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as e:
        main(["estimators", "--output-dir", str(tmp_path / "lab"), *args])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_estimators_lengths_without_rows(tmp_path, capsys):
    # a model that cannot load makes the run stop right after the argument checks
    assert (
        main(["estimators", "--output-dir", str(tmp_path), "--lengths", "8", "--model", "/nonexistent/model"])
        == 2
    )
    assert "cannot load model" in capsys.readouterr().err


def test_estimators_needs_an_output_dir(capsys):
    with pytest.raises(SystemExit) as e:
        main(["estimators", "--lengths", "4"])
    assert e.value.code == 2 and "--output-dir" in capsys.readouterr().err


@pytest.mark.slow
def test_estimators_quick(tmp_path):
    out = tmp_path / "quick"
    assert main(["estimators", "--output-dir", str(out), "--quick"]) == 0
    records = json.loads((out / "estimators.json").read_text())
    assert {r["length"] for r in records} == {8, 12, 32}
    assert {r["nfe"] for r in records if r["length"] <= 16} == {2, 3, 4}
    assert {r["nfe"] for r in records if r["length"] == 32} == {3, 4}
    assert all(r["target"].startswith("reference") for r in records if r["length"] == 32)
    checked = [r["check_max_abs_z"] for r in records if r["check_max_abs_z"] is not None]
    assert checked and max(checked) < 5
    lab = json.loads((out / "lab.json").read_text())
    assert len(lab["summary_table"].splitlines()) == 2 + 3 * 2  # L = 8, 12, 32 at NFE 3 and 4


@pytest.mark.parametrize("registry", ["algorithms", "estimators", "rewards", "tasks", "advantages", "clip_rules",
                                      "loss_types", "weightings"])
def test_dlmrl_list_prints_every_name_with_its_doc_line(registry, capsys):
    import importlib

    from dlmrl.cli import _REGISTRIES, main, plain_text

    assert main(["list", registry]) == 0
    lines = capsys.readouterr().out.splitlines()
    module, attr = _REGISTRIES[registry]
    reg = getattr(importlib.import_module(module), attr)
    # one entry per name: its first line starts with the name, continuation lines are indented
    starts = [i for i, line in enumerate(lines) if not line.startswith(" ")]
    assert [lines[i].split()[0] for i in starts] == reg.names()
    entries = [" ".join(" ".join(lines[a:b]).split()) for a, b in zip(starts, [*starts[1:], len(lines)])]
    for name, entry in zip(reg.names(), entries):
        assert entry.startswith(name + " ")
        assert " ".join(plain_text(reg.doc(name)).split()) in entry  # the whole first paragraph, wrapped
        assert "``" not in entry and ":func:" not in entry
    if registry == "algorithms":
        assert entries[reg.names().index("gdpo")].endswith("[block, diffusion]")  # (the model.kind values)
        assert entries[reg.names().index("tracerl")].endswith("[block, diffusion, uniform]")
        assert entries[reg.names().index("grpo")].endswith("[ar, block, diffusion, uniform]")


def test_dlmrl_list_survives_a_closed_pipe():
    import subprocess
    import sys

    proc = subprocess.run(f"{sys.executable} -m dlmrl.cli list algorithms | head -1", check=False, shell=True,
                          capture_output=True, text=True)
    assert proc.stdout.startswith("block_just_grpo") and "BrokenPipe" not in proc.stderr and "Traceback" not in proc.stderr


def test_dlmrl_eval_of_a_run_folder_uses_the_runs_own_config(tmp_path, capsys):
    """``dlmrl eval --model RUN/final_model`` evaluates an AR run as an AR policy (its config.yaml), without
    --config and whatever the default recipe's algorithm."""
    import json

    from dlmrl.cli import main

    run = tmp_path / "run"
    assert main(["train", "--config", "configs/grpo_sudoku_tiny_ar.yaml", "max_steps=1", "prompts_per_step=2",
                 "num_generations=2", "eval.before=false", "eval.after=false", "--output-dir", str(run),
                 "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["eval", "--model", str(run / "final_model"), "eval.num_puzzles=8"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["num_examples"] == 8
    assert result["max_new_tokens"] == 17  # (left-to-right decoding of the AR policy: 16 cells + EOS)


def test_estimators_refuses_a_folder_that_holds_files(tmp_path, capsys):
    out = tmp_path / "lab"
    out.mkdir()
    (out / "estimators.json").write_text("[]")
    assert main(["estimators", "--output-dir", str(out), *SMALL]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert (out / "estimators.json").read_text() == "[]"  # untouched


def test_estimators_kind_uniform_quick(tmp_path, capsys):
    """``--kind uniform``: the uniform-noise ELBO estimators on the tiny random DiffusionGemma, exact targets."""
    out = tmp_path / "uniform"
    assert main(["estimators", "--kind", "uniform", "--quick", "--output-dir", str(out)]) == 0
    records = json.loads((out / "estimators.json").read_text())
    assert {r["length"] for r in records} == {2} and {r["nfe"] for r in records} == {2, 3}
    assert {r["estimator"] for r in records} == {"uniform_double_mc", "uniform_sdmc", "uniform_flat_ce"}
    assert all(r["target"] == "exact" and r["repetitions"] == 500 for r in records)
    # the UDLM/Duo time draw t ~ U(0, 1] has infinite variance: null in JSON, flagged
    p1 = [r for r in records if r["estimator"] == "uniform_double_mc" and r["time_exponent"] == 1]
    assert p1 and all(r["infinite_variance"] and r["variance"] is None and r["mse"] is None for r in p1)
    lab = json.loads((out / "lab.json").read_text())
    assert lab["kind"] == "uniform" and lab["vocab_size"] == 8
    assert len(lab["summary_table"].splitlines()) == 2 + 2 * 7  # NFE 2 and 3, seven estimators each
    assert "| L | NFE | estimator | bias | std | MSE |" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kind", "uniform", "--directions", "3"], "--directions applies to the masked lab only"),
        (["--model", "tiny-uniform", "--family", "llada"], "--family applies to the masked lab only"),
        (["--kind", "uniform", "--lengths", "5", "--rows", "1"], "lengths: 5 is outside [1, canvas_length = 4]"),
        (["--kind", "uniform", "--lengths", "2,3", "--rows", "1,2,3"], "--rows has 3 values for 2 lengths"),
        (["--kind", "uniform", "--repetitions", "1"], "--repetitions must be >= 2"),
        (["--kind", "uniform", "--model", "/nonexistent/model"], "cannot load model '/nonexistent/model'"),
    ],
)
def test_estimators_kind_uniform_bad_inputs_return_2(tmp_path, capsys, args, message):
    assert main(["estimators", "--output-dir", str(tmp_path / "lab"), *args]) == 2
    err = capsys.readouterr().err
    assert any(line.startswith("dlmrl estimators: ") and message in line for line in err.splitlines()), err


def test_estimators_picks_the_uniform_lab_for_a_diffusion_gemma(tmp_path):
    from argparse import Namespace

    from dlmrl.cli import _lab_kind
    from dlmrl.models.uniform_policy import save_tiny_uniform_checkpoint

    folder = save_tiny_uniform_checkpoint(tmp_path / "dg")
    assert _lab_kind(Namespace(kind=None, model=str(folder))) == "uniform"
    assert _lab_kind(Namespace(kind=None, model="tiny-sudoku-uniform")) == "uniform"
    assert _lab_kind(Namespace(kind=None, model="tiny-uniform")) == "uniform"
    assert _lab_kind(Namespace(kind=None, model=None)) == "diffusion"
    assert _lab_kind(Namespace(kind=None, model="tiny-sudoku")) == "diffusion"
    assert _lab_kind(Namespace(kind="diffusion", model=str(folder))) == "diffusion"


def test_estimators_uniform_refuses_more_noise_states_than_it_enumerates(tmp_path, capsys):
    # the shipped Sudoku DiffusionGemma has 22 token ids: 22^3 = 10648 states per row at L = 3
    args = ["estimators", "--model", "tiny-sudoku-uniform", "--lengths", "3", "--rows", "1", "--budgets", "2",
            "--output-dir", str(tmp_path / "lab")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "dlmrl estimators: exact enumeration needs N^n = 22^3 = 10648 noise states" in err, err
