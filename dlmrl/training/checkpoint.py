"""Atomic writes: a folder is written under a temporary name and renamed, so a crash never leaves half a checkpoint;
and the integrity check a resume runs first, for a checkpoint damaged after it was written (a disk that filled up,
a copy cut short)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import warnings
import zipfile
from contextlib import contextmanager
from pathlib import Path


def staging_dir(final: str | os.PathLike) -> Path:
    """The temporary folder :func:`atomic_dir` writes ``final`` in (beside it, hidden)."""
    final = Path(final).resolve()
    return final.parent / f".{final.name}.tmp"


@contextmanager
def atomic_dir(final: str | os.PathLike):
    """Yield a temporary folder beside ``final``; on success replace ``final`` with it.

    An existing ``final`` is moved aside first and removed only after the rename, so at every
    moment either the old or the new folder is complete.
    """
    final = Path(final).resolve()
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = staging_dir(final)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = final.parent / f".{final.name}.old"
    if final.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def write_json_atomic(path: str | os.PathLike, obj) -> None:
    """Write JSON to ``path`` through a temporary file and ``os.replace``; a non-finite number is written as ``null``
    (:func:`~dlmrl.training.finite.json_ready`), so the file is valid JSON."""
    from dlmrl.training.finite import json_ready

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(json_ready(obj), indent=2, sort_keys=False, allow_nan=False))
    os.replace(tmp, path)


def checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """The ``checkpoints/step-N`` folders, newest (largest N) first."""
    root = Path(output_dir) / "checkpoints"
    steps = [(int(p.name.split("-")[1]), p) for p in root.glob("step-*") if p.name.split("-")[1].isdigit()]
    return [p for _, p in sorted(steps, reverse=True)]


def latest_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The ``checkpoints/step-N`` folder with the largest N, or ``None``."""
    found = checkpoints(output_dir)
    return found[0] if found else None


class CheckpointError(OSError):
    """No intact checkpoint to resume from; the message names the damaged file and what is wrong with it."""


#: files ``torch.save`` writes (accelerate's optimizer, scheduler, RNG states and registered objects): zip archives
TORCH_SAVE_SUFFIXES = (".bin", ".pkl", ".pt", ".pth")


#: the folder of a sharded run's checkpoint (``train.sharding: fsdp2``) that holds model and optimizer as
#: ``torch.distributed.checkpoint`` files (``*.distcp`` shards and their ``.metadata`` index;
#: :func:`dlmrl.training.sharding.register_checkpointing`) instead of ``model.safetensors`` and ``optimizer.bin``
SHARDED_DIR = "sharded"


#: the file a checkpoint lists its files and their sizes in, written last (:func:`write_manifest`)
MANIFEST = "dlmrl_checkpoint.json"


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes, hex (``sha256sum``'s), read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(folder: str | os.PathLike) -> None:
    """List every file of a just-saved checkpoint folder with its size in bytes and its SHA-256 (:data:`MANIFEST`),
    so that a file later deleted, cut short or overwritten is found by :func:`damaged_file` whatever its format
    (hashing reads the checkpoint once: about a second per GB)."""
    folder = Path(folder)
    paths = [p for p in sorted(folder.rglob("*")) if p.is_file()]
    names = [p.relative_to(folder).as_posix() for p in paths]
    write_json_atomic(folder / MANIFEST, {"files": {n: p.stat().st_size for n, p in zip(names, paths)},
                                          "sha256": {n: file_sha256(p) for n, p in zip(names, paths)}})


def damaged_file(folder: str | os.PathLike) -> str | None:
    """What is wrong with a checkpoint folder, or ``None`` when every weights and state file in it is whole.

    Every file the checkpoint lists in its :data:`MANIFEST` is there at the size it was saved with and with the
    SHA-256 it was saved with (content damaged in place, at the same size; checkpoints written before the list, or
    the checksums, existed skip these); and, a check that reads headers only, a ``.safetensors`` file
    must be as long as its header says (8-byte little-endian header size, JSON header, then the byte ranges its
    ``data_offsets`` name; see the safetensors format, huggingface/safetensors ``README.md``); a ``torch.save``
    file (:data:`TORCH_SAVE_SUFFIXES`) must be a zip archive whose central directory, written last, is there and
    whose members fit in the file. A truncated file fails either check.

    Returns:
        ``"<file>: <problem>"`` for the first damaged file, ``"<folder>: ..."`` for a folder with no
        ``.safetensors`` weights at all (nor, a sharded run's, ``sharded/.metadata``); ``None`` when intact.
    """
    folder = Path(folder)
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    sharded = folder / SHARDED_DIR / ".metadata"  # (a sharded run: its weights are torch.distributed.checkpoint files)
    if not any(p.suffix == ".safetensors" for p in files) and not sharded.is_file():
        return f"{folder}: no .safetensors weights (nor {SHARDED_DIR}/.metadata of a sharded run) in the checkpoint"
    for path in files:
        problem = None
        if path.suffix == ".safetensors":
            problem = _safetensors_problem(path)
        elif path.suffix in TORCH_SAVE_SUFFIXES:
            problem = _torch_save_problem(path)
        if problem:
            return f"{path}: {problem}"
    return _manifest_problem(folder)


def _manifest_problem(folder: Path) -> str | None:
    """A file the checkpoint was saved with that is gone, has another size or another SHA-256 (``None`` without a
    manifest)."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return None
    try:
        manifest_data = json.loads(manifest.read_text())
        listed = manifest_data["files"]
    except (ValueError, KeyError, TypeError):
        return f"{manifest}: damaged file list"
    for name, size in listed.items():
        path = folder / name
        if not path.is_file():
            return f"{path}: missing (the checkpoint was saved with it)"
        if path.stat().st_size != size:
            return f"{path}: {path.stat().st_size} bytes, saved with {size} (truncated or overwritten)"
    for name, saved in (manifest_data.get("sha256") or {}).items():
        now = file_sha256(folder / name)
        if now != saved:
            return (f"{folder / name}: its contents changed since it was saved (SHA-256 {now[:12]}..., saved with "
                    f"{saved[:12]}...)")
    return None


def _safetensors_problem(path: Path) -> str | None:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"truncated safetensors file ({size} bytes, shorter than its 8-byte header size)"
        (n,) = struct.unpack("<Q", head)
        if 8 + n > size:
            return f"truncated safetensors file ({size} bytes; its header alone needs {8 + n})"
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return "not a safetensors file (its header is not JSON)"
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)
            and "data_offsets" in v]
    need = 8 + n + max(ends, default=0)
    if size < need:
        return f"truncated safetensors file ({size} bytes; its header names tensors up to byte {need})"
    return None


def _torch_save_problem(path: Path) -> str | None:
    try:
        with zipfile.ZipFile(path) as z:
            size = path.stat().st_size
            for info in z.infolist():
                if info.header_offset + info.compress_size > size:
                    return f"truncated torch.save archive (member {info.filename} runs past the end)"
    except zipfile.BadZipFile as e:
        return f"truncated or damaged torch.save archive ({e})"
    return None


def resumable_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The newest intact ``checkpoints/step-N`` folder (:func:`damaged_file`), or ``None`` when there are none.

    A damaged newer checkpoint is passed over with a warning naming it, its damaged file and the checkpoint used
    instead (the run then redoes the steps after that one; the same seeds give the same steps).

    Raises:
        CheckpointError: every checkpoint is damaged; naming each one's damaged file, one line each.
    Warns:
        UserWarning: for each damaged checkpoint passed over.
    """
    root = Path(output_dir) / "checkpoints"
    damaged = []
    for path in checkpoints(output_dir):
        problem = damaged_file(path)
        if problem is None:
            for old, why in damaged:
                warnings.warn(f"--resume: checkpoint {old} is damaged ({why}); resuming from the previous intact "
                              f"checkpoint {path} instead", UserWarning, stacklevel=2)
            return path
        damaged.append((path, problem))
    if damaged:
        # every damaged checkpoint with its own reason, one line each: an older one may be damaged differently
        # (a different file, or one that is easier to restore)
        older = "".join(f"\n  {path} ({why})" for path, why in damaged[1:])
        raise CheckpointError(f"--resume: no intact checkpoint under {root}: the newest, {damaged[0][0]}, is damaged "
                              f"({damaged[0][1]})" + (f", and so {'is' if len(damaged) == 2 else 'are'} the "
                                                      f"{len(damaged) - 1} older:{older}\n" if older else "; ")
                              + "restore the damaged files or start a new run in another --output-dir")
    return None
