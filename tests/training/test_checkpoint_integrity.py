"""A damaged checkpoint on --resume: the newest intact one is used with a warning naming both, or the run stops
with a message naming the damaged file (never a bare safetensors or zip error)."""

from __future__ import annotations

import json
import os
import re
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file

from dlmrl.config import Config, apply_overrides
from dlmrl.training.checkpoint import CheckpointError, damaged_file, resumable_checkpoint
from dlmrl.training.trainer import train
from tests.helpers import crash_then_resume, save_tiny_checkpoint


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("base"))


def small_config(base, out, **extra) -> Config:
    cfg = Config()
    overrides = {"model.name_or_path": str(base), "output_dir": str(out), "max_steps": 3, "prompts_per_step": 2,
                 "num_generations": 3, "sampling.steps": 4, "save_steps": 1, "learning_rate": 1e-3,
                 "warmup_steps": 0, "eval.before": False, "eval.after": False, **extra}
    apply_overrides(cfg, [f"{k}={v}" for k, v in overrides.items()])
    return cfg


def truncate(path, keep: float = 0.5) -> None:
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(int(size * keep))


def test_damaged_file_reads_headers_of_safetensors_and_torch_save_files(tmp_path):
    folder = tmp_path / "step-1"
    folder.mkdir()
    assert "no .safetensors weights" in damaged_file(folder)
    save_file({"w": torch.arange(64, dtype=torch.float32)}, str(folder / "model.safetensors"))
    torch.save({"state": torch.ones(256)}, folder / "optimizer.bin")
    assert damaged_file(folder) is None
    truncate(folder / "optimizer.bin", 0.9)
    assert "optimizer.bin: truncated or damaged torch.save archive" in damaged_file(folder)
    torch.save({"state": torch.ones(256)}, folder / "optimizer.bin")
    with open(folder / "model.safetensors", "r+b") as f:  # one byte short of the last tensor
        f.truncate(os.path.getsize(folder / "model.safetensors") - 1)
    assert "model.safetensors: truncated safetensors file" in damaged_file(folder)
    truncate(folder / "model.safetensors", 0.0)
    assert "shorter than its 8-byte header size" in damaged_file(folder)


def test_resume_passes_over_a_truncated_checkpoint_and_matches_the_uninterrupted_run(base, tmp_path, monkeypatch):
    full = tmp_path / "full"
    train(small_config(base, full), progress=False)

    crashed = tmp_path / "crashed"
    newest = crashed / "checkpoints" / "step-2"
    with pytest.warns(UserWarning, match=r"checkpoint .*step-2 is damaged \(.*model\.safetensors: truncated "
                                         r"safetensors file.*\); resuming from the previous intact checkpoint "
                                         r".*step-1"):
        crash_then_resume(monkeypatch, lambda resume: train(small_config(base, crashed), resume=resume,
                                                            progress=False),
                          2, after_crash=lambda: truncate(newest / "model.safetensors"))
    a, b = load_file(str(full / "final_model" / "model.safetensors")), load_file(
        str(crashed / "final_model" / "model.safetensors"))
    for k in a:  # (steps 2 and 3 redone from step 1's state: the same operations in the same order)
        assert torch.equal(a[k], b[k]), k
    steps = [json.loads(x)["step"] for x in (crashed / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


def test_resume_with_every_checkpoint_damaged_names_the_file(base, tmp_path, monkeypatch):
    from dlmrl.cli import main

    out = tmp_path / "run"

    def damage_all():
        for step in ("step-1", "step-2"):
            truncate(out / "checkpoints" / step / "optimizer.bin")

    with pytest.raises(CheckpointError, match=r"no intact checkpoint .*step-2, is damaged \(.*step-2.optimizer\.bin"
                                              r": truncated or damaged torch.save archive"):
        crash_then_resume(monkeypatch, lambda resume: train(small_config(base, out), resume=resume, progress=False),
                          2, after_crash=damage_all)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["train", "--resume", "--output-dir", str(out), "--no-progress"]) == 2
    assert resumable_checkpoint(tmp_path / "empty") is None  # (no checkpoints at all: not an error here)


@pytest.mark.parametrize("name", ["optimizer.bin", "random_states_0.pkl", "custom_checkpoint_0.pkl"])
def test_a_file_missing_from_the_newest_checkpoint_is_damage_too(name, base, tmp_path, monkeypatch):
    """Every checkpoint lists its files and sizes when saved: a deleted file (which no header check can see, and
    which accelerate would load past or fail on with a bare error) sends the resume to the previous checkpoint."""
    out = tmp_path / "run"
    with pytest.warns(UserWarning, match=rf"step-2 is damaged \(.*step-2.{re.escape(name)}: missing \(the checkpoint "
                                         r"was saved with it\)\); resuming from .*step-1"):
        crash_then_resume(monkeypatch, lambda resume: train(small_config(base, out), resume=resume, progress=False),
                          2, after_crash=lambda: (out / "checkpoints" / "step-2" / name).unlink())
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


def test_every_damaged_checkpoint_is_named_with_its_own_reason(tmp_path):
    """With every checkpoint damaged, each is listed on a line of its own with its damaged file (only the newest
    was named in full: an older one may be damaged differently, or be the one worth restoring)."""
    for step, content in (("step-1", b"\x00" * 3), ("step-2", b""), ("step-3", b"")):
        folder = tmp_path / "checkpoints" / step
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(content)
    with pytest.raises(CheckpointError) as err:
        resumable_checkpoint(tmp_path)
    lines = str(err.value).splitlines()
    assert re.search(r"the newest, .*step-3, is damaged \(.*step-3.model\.safetensors: truncated safetensors file "
                     r"\(0 bytes.*and so are the 2 older:$", lines[0]), lines[0]
    assert re.fullmatch(r"  .*step-2 \(.*step-2.model\.safetensors: truncated safetensors file \(0 bytes.*\)", lines[1])
    assert re.fullmatch(r"  .*step-1 \(.*step-1.model\.safetensors: truncated safetensors file \(3 bytes.*\)", lines[2])
    assert lines[3].startswith("restore the damaged files")


def overwrite_tail(path, nbytes: int) -> None:
    """Overwrite the last ``nbytes`` of a file in place with 0xFF bytes (float32 NaNs), keeping its size."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(size - nbytes)
        f.write(b"\xff" * nbytes)


def test_weights_damaged_in_place_at_the_same_size_are_found_by_their_checksum(base, tmp_path, monkeypatch):
    """Overwriting the end of the newest model.safetensors keeps its size and header (on main the resume loaded
    NaN weights and ran on with reward 0, exit 0): its SHA-256 no longer matches the one saved, so the resume
    passes over it as over a truncated file, and the run ends as the uninterrupted one."""
    full = tmp_path / "full"
    train(small_config(base, full), progress=False)
    out = tmp_path / "run"
    weights = out / "checkpoints" / "step-2" / "model.safetensors"
    with pytest.warns(UserWarning, match=r"step-2 is damaged \(.*model\.safetensors: its contents changed since it "
                                         r"was saved \(SHA-256 .*\); resuming from .*step-1"):
        crash_then_resume(monkeypatch, lambda resume: train(small_config(base, out), resume=resume, progress=False),
                          2, after_crash=lambda: overwrite_tail(weights, min(200_000, weights.stat().st_size // 2)))
    a, b = load_file(str(full / "final_model" / "model.safetensors")), load_file(
        str(out / "final_model" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_manifest_records_each_files_sha256(tmp_path):
    import hashlib

    from dlmrl.training.checkpoint import MANIFEST, write_manifest

    (tmp_path / "model.safetensors").write_bytes(b"abc")
    write_manifest(tmp_path)
    listed = json.loads((tmp_path / MANIFEST).read_text())
    assert listed["sha256"] == {"model.safetensors": hashlib.sha256(b"abc").hexdigest()}
    assert listed["files"] == {"model.safetensors": 3}
