"""Every config in configs/ loads and validates, and ``dlmrl train --dry-run`` prints its plan (preset, estimator
and NFE, task, sampler, sizes, tracker, accelerate state) without loading a model, downloading a dataset or
contacting the hub; the LLaDA recipes carry the papers' values (GDPO arXiv 2510.08554, d1 / diffu-GRPO
arXiv 2504.12216); the accelerate configs are valid launch files."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dlmrl import cli
from dlmrl.config import Config, PretrainConfig, load_yaml, validate, validate_pretrain

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
TRAIN_CONFIGS = sorted(p for p in CONFIGS.glob("*.yaml") if not p.name.startswith("pretrain_"))
LLADA = sorted(CONFIGS.glob("llada_*.yaml"))
TASKS = ("gsm8k", "math", "countdown", "sudoku")


@pytest.fixture
def offline(monkeypatch):
    """Fail the test if anything reaches for the hub or a dataset."""
    import datasets
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError(f"--dry-run tried to load {args[:1]}")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets, "load_dataset", refuse)
    for cls in (transformers.AutoModel, transformers.AutoModelForCausalLM, transformers.AutoModelForMaskedLM,
                transformers.AutoTokenizer):
        monkeypatch.setattr(cls, "from_pretrained", refuse)


def dry_run(path: Path, tmp_path, capsys, *extra: str) -> dict:
    assert cli.main(["train", "--config", str(path), "--dry-run", "--output-dir", str(tmp_path / "run"), *extra]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"# dlmrl train --dry-run: {path} is valid")
    assert not (tmp_path / "run").exists()  # nothing written
    return yaml.safe_load(out)


def test_the_llada_recipes_exist():
    assert [p.stem for p in LLADA] == sorted(f"llada_{a}_{t}" for a in ("gdpo", "diffu_grpo") for t in TASKS)


@pytest.mark.parametrize("path", TRAIN_CONFIGS, ids=lambda p: p.stem)
def test_every_config_dry_runs_and_names_preset_estimator_and_nfe(path, tmp_path, capsys, offline):
    cfg = Config()
    load_yaml(cfg, path)
    validate(cfg)
    plan = dry_run(path, tmp_path, capsys)
    assert plan["algorithm"]["name"] == cfg.train.algorithm
    assert plan["estimator"]["nfe"] >= 1 and plan["estimator"]["name"]
    assert plan["sizes"]["completions_per_step"] == cfg.train.prompts_per_step * cfg.train.num_generations
    assert plan["accelerate"]["num_processes"] == 1 and plan["output"]["state"] == "new"


@pytest.mark.parametrize("path", LLADA, ids=lambda p: p.stem)
def test_llada_recipes_carry_the_papers_values(path, tmp_path, capsys, offline):
    algo, task = path.stem.removeprefix("llada_").rsplit("_", 1)
    plan = dry_run(path, tmp_path, capsys)
    model = plan["model"]
    assert model["name_or_path"] == "GSAI-ML/LLaDA-8B-Instruct" and model["family"] == "llada"
    assert model["trust_remote_code"] is True and model["dtype"] == "bfloat16" and model["source"].startswith("hub id")
    assert model["lora"] == {"r": 128, "alpha": 64, "dropout": 0.05, "target_modules": "q_proj,k_proj,v_proj"}
    s = plan["sampler"]
    assert (s["gen_length"], s["block_length"], s["steps"], s["temperature"]) == (256, 32, 128, 0.9)
    a, e, sizes = plan["algorithm"], plan["estimator"], plan["sizes"]
    assert (sizes["num_generations"], a["epsilon"], a["advantage"]) == (6, 0.5, "none")
    if algo == "gdpo":
        assert (e["name"], e["nfe"], e["num_nodes"], e["samples_per_node"]) == ("sdmc", 3, 3, 1)
        assert (a["ratio_level"], a["beta"], a["num_iterations"]) == ("sequence", 0.0, 12)
    else:
        assert (e["name"], e["nfe"], e["p_mask_prompt"]) == ("one_step", 1, 0.15)
        assert (a["ratio_level"], a["beta"]) == ("token", 0.04)
        assert a["num_iterations"] == (12 if task in ("gsm8k", "math") else 8)
    assert plan["task"]["name"] == task
    assert plan["task"]["primary_metric"] == ("cell_accuracy" if task == "sudoku" else "accuracy")
    cfg = Config()
    load_yaml(cfg, path)
    assert cfg.train.learning_rate == (3e-7 if algo == "gdpo" else 3e-6)


def test_the_sdar_recipe_carries_tracerls_values(tmp_path, capsys, offline):
    # Gen-Verse/dLLM-RL configs/rl_sdar.yaml (TraceRL, arXiv 2509.06949), re-stated here as the test's oracle
    plan = dry_run(CONFIGS / "sdar_tracerl_math.yaml", tmp_path, capsys)
    model, s, a, e = plan["model"], plan["sampler"], plan["algorithm"], plan["estimator"]
    assert (model["name_or_path"], model["family"], model["kind"], model["block_size"]) == (
        "JetLM/SDAR-1.7B-Chat", "sdar", "block", 4)
    assert model["trust_remote_code"] is True and model["lora"].startswith("off") and "cut into blocks" in (
        model["attention"])
    assert (s["gen_length"], s["blocks"], s["threshold"], s["temperature"]) == (2000, 500, 0.9, 1.0)
    assert (a["name"], a["epsilon"], a["beta"], a["num_iterations"]) == ("tracerl", 0.2, 0.01, 1)
    assert (e["name"], e["merge"], e["order"]) == ("trajectory", 1, "sampled")
    assert (plan["sizes"]["num_generations"], plan["sizes"]["completions_per_step"]) == (16, 64 * 16)
    cfg = Config()
    load_yaml(cfg, CONFIGS / "sdar_tracerl_math.yaml")
    assert (cfg.train.learning_rate, cfg.train.max_grad_norm, cfg.train.max_steps) == (1e-6, 1.0, 80)


def test_dry_run_reports_the_tracker_and_refuses_a_bad_config(tmp_path, capsys, offline):
    path = CONFIGS / "llada_gdpo_gsm8k.yaml"
    plan = dry_run(path, tmp_path, capsys, "report_to=tensorboard")
    assert plan["tracker"]["report_to"] == "tensorboard"
    assert cli.main(["train", "--config", str(path), "--dry-run", "sampling.block_length=48"]) == 2
    assert "sampling.block_length" in capsys.readouterr().err


def test_pretrain_configs_validate():
    for path in sorted(CONFIGS.glob("pretrain_*.yaml")):
        cfg = PretrainConfig()
        load_yaml(cfg, path)
        validate_pretrain(cfg)


@pytest.mark.parametrize("name", ["zero2", "fsdp"])
def test_accelerate_configs_are_valid_launch_files(name):
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    path = CONFIGS / "accelerate" / f"{name}.yaml"
    config = load_config_from_file(str(path))
    assert str(config.distributed_type).endswith("DEEPSPEED" if name == "zero2" else "FSDP")
    assert config.mixed_precision == "bf16" and config.num_processes == 8
    args = launch_command_parser().parse_args(["--config_file", str(path), "-m", "dlmrl.cli", "train", "--dry-run"])
    args, _, _ = _validate_launch_command(args)
    if name == "zero2":
        assert args.use_deepspeed and args.zero_stage == 2
    else:
        from accelerate.utils.launch import prepare_multi_gpu_env

        assert args.use_fsdp
        env = prepare_multi_gpu_env(args)
        assert env["FSDP_SHARDING_STRATEGY"] == "FULL_SHARD" and env["FSDP_USE_ORIG_PARAMS"] == "true"
        assert env["FSDP_TRANSFORMER_CLS_TO_WRAP"] == "LLaDALlamaBlock"


def test_dry_run_checks_the_split_for_the_processes_the_run_will_start(tmp_path, capsys, offline, monkeypatch):
    """Under ``accelerate launch --cpu --num_processes 3`` (which starts one process; ``dlmrl train`` starts the 3)
    the dry run must check the split as the run will, not report 1 process and "valid"."""
    from dlmrl.training import distributed

    path = CONFIGS / "gdpo_sudoku_tiny.yaml"
    monkeypatch.setattr(distributed, "requested_cpu_processes", lambda: 3)
    assert cli.main(["train", "--config", str(path), "--dry-run", "--output-dir", str(tmp_path / "r")]) == 2
    assert "64 prompts do not split over 3 processes" in capsys.readouterr().err
    plan = dry_run(path, tmp_path, capsys, "prompts_per_step=63")
    assert plan["accelerate"]["processes_the_run_trains_with"] == 3
    assert plan["sizes"]["completions_per_process"] == 63 * 8 // 3
    monkeypatch.setattr(distributed, "requested_cpu_processes", lambda: None)
    monkeypatch.setenv("WORLD_SIZE", "5")  # (a torchrun launch: the run checks WORLD_SIZE too)
    assert cli.main(["train", "--config", str(path), "--dry-run", "--output-dir", str(tmp_path / "r")]) == 2
    assert "do not split over 5 processes" in capsys.readouterr().err


def test_dry_run_with_resume_describes_the_run_it_continues(tmp_path, capsys, offline):
    """``--resume --dry-run`` names the run's own config.yaml and its checkpoint, and refuses what the run refuses
    (no checkpoint; settings other than the run's own)."""
    out = tmp_path / "run"
    assert cli.main(["train", "--dry-run", "--resume", "--output-dir", str(out)]) == 2
    assert "no checkpoint" in capsys.readouterr().err
    out.mkdir()
    (out / "config.yaml").write_text(Path("configs/tracerl_sudoku_tiny.yaml").read_text())
    cfg = Config()
    load_yaml(cfg, out / "config.yaml")
    cfg.output_dir = str(out)
    from dlmrl.config import save_yaml

    save_yaml(cfg, out / "config.yaml")
    (out / "checkpoints" / "step-2").mkdir(parents=True)
    assert cli.main(["train", "--dry-run", "--resume", "--output-dir", str(out)]) == 2  # (an empty folder: damaged)
    assert "step-2: no .safetensors weights" in capsys.readouterr().err
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(out / "checkpoints" / "step-2" / "model.safetensors"))  # (whole, as saved)
    assert cli.main(["train", "--dry-run", "--resume", "--output-dir", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"# dlmrl train --dry-run: {out / 'config.yaml'} is valid")
    assert yaml.safe_load(text)["output"]["state"] == f"resumes from {out / 'checkpoints' / 'step-2'}"
    assert yaml.safe_load(text)["algorithm"]["name"] == "tracerl"
    assert cli.main(["train", "--dry-run", "--resume", "--output-dir", str(out), "train.learning_rate=0.5"]) == 2
    assert "these differ" in capsys.readouterr().err
    # (train.max_steps may extend the run or end it sooner, not below the 2 steps of its checkpoint)
    assert cli.main(["train", "--dry-run", "--resume", "--output-dir", str(out), "train.max_steps=1"]) == 2
    assert "config key 'train.max_steps': --resume continues a run that has done 2 steps" in capsys.readouterr().err


def test_resume_with_another_config_file_is_refused(tmp_path, capsys, offline):
    """``--resume --config other.yaml`` continues with the run's own config.yaml: a file with other settings is
    refused (naming them) instead of ignored; the run's own file is accepted."""
    import torch
    from safetensors.torch import save_file

    from dlmrl.config import save_yaml

    out = tmp_path / "run"
    (out / "checkpoints" / "step-2").mkdir(parents=True)
    save_file({"w": torch.zeros(2)}, str(out / "checkpoints" / "step-2" / "model.safetensors"))  # (an intact one)
    cfg = Config()
    load_yaml(cfg, CONFIGS / "gdpo_sudoku_tiny.yaml")
    cfg.output_dir = str(out)
    save_yaml(cfg, out / "config.yaml")
    args = ["train", "--dry-run", "--resume", "--output-dir", str(out)]
    assert cli.main([*args, "--config", str(CONFIGS / "tracerl_sudoku_tiny.yaml")]) == 2
    assert "train.algorithm: 'gdpo' -> 'tracerl'" in capsys.readouterr().err
    assert cli.main([*args, "--config", str(out / "config.yaml")]) == 0
    capsys.readouterr()


REAL_MODEL_RECIPES = [*LLADA, CONFIGS / "sdar_tracerl_math.yaml", CONFIGS / "llada2_tracerl_math.yaml",
                      CONFIGS / "nemotron_diffusion_tracerl_math.yaml", CONFIGS / "nemotron_diffusion_ar_grpo_math.yaml",
                      CONFIGS / "lladamoe_gdpo_gsm8k.yaml", CONFIGS / "illada_gdpo_gsm8k.yaml"]
#: the hardware each real-model recipe is planned for: 8 GPUs of 80 GB training every parameter with FSDP2, and one
#: 80 GB GPU with LoRA (README, "Recipes on 8 x 80 GB and on one GPU")
HARDWARE = {"8 GPUs, full parameters, FSDP2": ("8", ["model.use_peft=false", "train.sharding=fsdp2"]),
            "1 GPU, LoRA": ("1", ["model.use_peft=true", "train.sharding=none"])}


@pytest.mark.parametrize("hardware", list(HARDWARE))
@pytest.mark.parametrize("path", REAL_MODEL_RECIPES, ids=lambda p: p.stem)
def test_every_real_model_recipe_fits_its_hardware_by_its_own_plan(path, hardware, tmp_path, capsys, offline):
    """The per-GPU memory plan of ``--dry-run --num-processes N`` fits the recipe's 80 GB ``train.memory_budget``
    (before, the SDAR recipe planned 181 GB per GPU on 8, 1,175 GB on one, and the others no bytes at all)."""
    processes, overrides = HARDWARE[hardware]
    plan = dry_run(path, tmp_path, capsys, "--num-processes", processes, *overrides)
    memory = plan["memory"]
    assert plan["accelerate"]["planned_processes"] == int(processes)
    assert memory["memory_budget"].endswith("fits"), memory
    peak_gb = float(memory["peak"].split(" GB")[0].replace(",", ""))
    assert peak_gb <= 80 * 0.9  # (a 10% margin: the plan's error against measured peaks, README "Memory plan")


def test_num_processes_goes_with_dry_run(capsys):
    assert cli.main(["train", "--num-processes", "8"]) == 2
    assert "goes with --dry-run" in capsys.readouterr().err


def test_the_config_check_plans_the_same_launch_as_dry_run(tmp_path, capsys, offline, recwarn):
    """With --num-processes the config check's budget warning plans that launch too (it warned about 301 GB on one
    process for the LLaDA2 recipe whose 8-process plan fits)."""
    dry_run(CONFIGS / "llada2_tracerl_math.yaml", tmp_path, capsys, "--num-processes", "8", "model.use_peft=false",
            "train.sharding=fsdp2")
    assert not [w for w in recwarn if "train.memory_budget" in str(w.message)]
    dry_run(CONFIGS / "llada2_tracerl_math.yaml", tmp_path, capsys, "--num-processes", "1", "model.use_peft=false")
    assert [w for w in recwarn if "train.memory_budget" in str(w.message)]
