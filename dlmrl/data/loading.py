"""Records from the hub or local files through ``datasets.load_dataset``, with locations for error messages.

A *source* is a hub dataset name (``openai/gsm8k``), a local folder ``load_dataset`` understands, or a local
file whose extension picks the builder: ``.json``/``.jsonl`` → ``json`` (JSON lines, or one JSON array),
``.csv`` → ``csv`` (every column read as text, so ``"0123"`` keeps its zero), ``.parquet``/``.pq`` →
``parquet``. A file always forms the split ``train`` of its builder; ``split`` may still slice it
(``train[:-500]``).

Every record has a location (:meth:`Records.where`) that error messages start with: ``<file> line N``
for JSON lines and CSV files (the line the record starts on, 1-based, header and blank lines counted),
``<file> record N`` for a JSON array or Parquet file (1-based), and
``<name> [subset] split <split> row N`` (0-based, as ``dataset[N]``) for the hub or a folder.
:class:`DataError` messages name the location and the field.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlmrl.data.text_files import NotUTF8Error, read_utf8

__all__ = ["BUILDERS", "DataError", "Records", "field_error", "is_local_file", "load_records"]

BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}


class DataError(ValueError):
    """A data source or record is invalid; the message names the file (or dataset), the line or row and the
    field."""


def field_error(where: str, field: str, problem: str) -> DataError:
    """``DataError("<where>: field '<field>': <problem>")``."""
    return DataError(f"{where}: field {field!r}: {problem}")


def is_local_file(source: str) -> bool:
    """Whether ``source`` names a local file (an existing one, or a path ending in a known data extension)."""
    p = Path(source)
    return p.is_file() or (p.suffix.lower() in BUILDERS and not p.is_dir())


@dataclass
class Records:
    """Rows of a source as column lists, and where each row came from.

    Attributes:
        source: the file path or dataset name.
        columns: column name → list of values (one per row).
        locations: one label per row (``"<file> line 7"``).
    """

    source: str
    columns: dict[str, list]
    locations: list[str]

    def __len__(self) -> int:
        return len(self.locations)

    def where(self, i: int) -> str:
        return self.locations[i]

    def rows(self, fields: Sequence[str]):
        """Yield ``(location, {field: value})`` per row; a missing column gives ``None`` values."""
        n = len(self)
        cols = [(f, self.columns.get(f, [None] * n)) for f in fields]
        for i in range(n):
            yield self.locations[i], {f: col[i] for f, col in cols}


def _jsonl_lines(path: Path) -> list[int] | None:
    """Line numbers of the records of a JSON-lines file, or None for a JSON array / single document.

    Raises:
        DataError: naming the first line that is not valid JSON.
    """
    text = _utf8(path)
    if text.startswith("\ufeff"):
        raise DataError(f"{path} line 1: the file starts with a UTF-8 byte-order mark, which the JSON reader "
                        "refuses; save it as UTF-8 without BOM")
    if not text.strip():
        raise DataError(f"{path}: empty file (no records)")
    if text.lstrip().startswith("["):
        try:
            json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{path} line {e.lineno}: invalid JSON: {e.msg}") from None
        return None
    lines = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path} line {n}: invalid JSON: {e.msg}") from None
        if not isinstance(value, dict):
            raise DataError(f"{path} line {n}: expected a JSON object, got {type(value).__name__}")
        lines.append(n)
    return lines


def _utf8(path: Path, strip_bom: bool = False) -> str:
    """The file's text (:func:`~dlmrl.data.text_files.read_utf8`); a file that is not UTF-8 is a :class:`DataError`
    naming it, the byte offset and line, and the encoding expected."""
    try:
        return read_utf8(path, strip_bom=strip_bom)
    except NotUTF8Error as e:
        raise DataError(str(e)) from None


def _csv_lines(path: Path) -> tuple[list[str], list[int]]:
    """The header and the line each record starts on (blank lines skipped, quoted newlines followed). A UTF-8
    byte-order mark (spreadsheet exports write one) is read past, as the CSV builder is told to."""
    with io.StringIO(_utf8(path, strip_bom=True), newline="") as f:
        reader = csv.reader(f)
        try:
            header = next(reader)
        except StopIteration:
            raise DataError(f"{path}: empty CSV file (expected a header line)") from None
        starts, prev = [], reader.line_num
        for row in reader:
            if row and not (len(row) == 1 and not row[0].strip()):  # (pandas skips blank lines)
                starts.append(prev + 1)
            prev = reader.line_num
    return header, starts


def _slice(split: str, n: int) -> range:
    """The rows of ``train[...]``-style slicing applied to ``n`` rows (datasets' own rules)."""
    import datasets

    try:
        (absolute,) = datasets.ReadInstruction.from_spec(split).to_absolute({"train": n})
    except (ValueError, AssertionError) as e:
        raise DataError(f"split {split!r} is not one slice of 'train' ({e})") from None
    return range(absolute.from_ or 0, n if absolute.to is None else absolute.to)


def load_records(source: str, split: str = "train", subset: str | None = None, cache_dir: str | None = None,
                 num_proc: int | None = None) -> Records:
    """Load a source (module docstring) with ``datasets.load_dataset``.

    Args:
        source: hub name, local folder or local file.
        split: split name, with optional slicing (``train[:90%]``); for a file, a slice of ``train``.
        subset: the dataset configuration (``main`` for GSM8K); not used for local files.
        cache_dir: ``datasets`` cache folder (default: ``datasets``' own).
        num_proc: processes ``load_dataset`` uses to prepare the data.

    Raises:
        DataError: a missing file, an unsupported extension, a file that cannot be parsed (naming the line
            for JSON lines), a split that does not exist, or a hub dataset that cannot be loaded.
    """
    import datasets

    kwargs: dict[str, Any] = {"cache_dir": cache_dir, "num_proc": num_proc}
    if is_local_file(source):
        path = Path(source)
        if not path.is_file():
            raise DataError(f"{source}: file does not exist")
        builder = BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise DataError(f"{source}: unsupported file type {path.suffix!r}; use one of {', '.join(BUILDERS)}")
        if not split.startswith("train"):
            raise DataError(f"{source}: a data file holds one split, 'train' (optionally sliced, e.g. "
                            f"'train[:-500]'); got split {split!r}")
        if builder == "json":
            lines = _jsonl_lines(path)
            label = (lambda i: f"{source} line {lines[i]}") if lines is not None else (
                lambda i: f"{source} record {i + 1}")
        elif builder == "csv":
            header, lines = _csv_lines(path)
            kwargs["features"] = datasets.Features({c: datasets.Value("string") for c in header})
            kwargs["encoding"] = "utf-8-sig"  # (a byte-order mark would otherwise stick to the first column's name)
            label = lambda i: f"{source} line {lines[i]}"
        else:
            lines = None
            label = lambda i: f"{source} record {i + 1}"
        quiet = not datasets.utils.are_progress_bars_disabled()  # (no bars for a small local file)
        if quiet:
            datasets.utils.disable_progress_bars()
        try:
            ds = datasets.load_dataset(builder, data_files=str(path), split="train", **kwargs)
        except Exception as e:  # noqa: BLE001 (datasets wraps any parser error in DatasetGenerationError)
            cause = e.__cause__ or e
            raise DataError(f"{source}: cannot be read as {builder}: {type(cause).__name__}: {cause}") from None
        finally:
            if quiet:
                datasets.utils.enable_progress_bars()
        if lines is not None and len(lines) != len(ds):  # (our line count disagrees with the parser's)
            label = lambda i: f"{source} record {i + 1}"
        rows = _slice(split, len(ds)) if split != "train" else range(len(ds))
        if len(rows) != len(ds):
            ds = ds.select(rows)
        locations = [label(i) for i in rows]
    else:
        if not Path(source).exists() and source.startswith((".", "/", "~")):
            raise DataError(f"{source}: no such file or folder")
        if Path(source).is_dir():  # (a local folder's text files: one that is not UTF-8 named with its byte offset)
            for path in sorted(p for p in Path(source).rglob("*") if p.suffix.lower() in (".json", ".jsonl", ".csv")):
                _utf8(path)
        try:
            ds = datasets.load_dataset(source, subset, split=split, **kwargs)
            columns = ds.to_dict()
        except Exception as e:  # noqa: BLE001 (hub, network and builder errors alike become a DataError)
            raise DataError(f"{source}{f' [{subset}]' if subset else ''} split {split!r} cannot be loaded: "
                            f"{type(e).__name__}: {e}") from None
        name = f"{source}{f' [{subset}]' if subset else ''} split {split!r}"
        locations = [f"{name} row {i}" for i in range(len(ds))]
        return Records(source, columns, locations)
    return Records(source, ds.to_dict(), locations)
