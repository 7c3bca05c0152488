"""Reading a local data file as UTF-8 text, with an error that names the file, the byte and where it is.

Python's own ``UnicodeDecodeError`` names neither the file nor the line, and is a ``ValueError``: raised from a
data loader it reads like a bad config value. :func:`read_utf8` decodes the whole file up front instead.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["NotUTF8Error", "read_utf8"]


class NotUTF8Error(ValueError):
    """A data file that is not UTF-8 text; the message names the file, the byte offset, line and column of the first
    byte that cannot be decoded, and the encoding expected."""


def read_utf8(path: str | os.PathLike, label: str | None = None, *, strip_bom: bool = False) -> str:
    """The text of ``path`` decoded as UTF-8 (``utf-8-sig``, a leading byte-order mark dropped, when ``strip_bom``).

    Args:
        label: how messages name the file (default: the path).
    Raises:
        NotUTF8Error: ``"<label>: not UTF-8 text: byte 0xE9 at byte offset 15 (line 1, column 16) ..."``.
        OSError: the file cannot be read.
    """
    raw = Path(path).read_bytes()
    try:
        return raw.decode("utf-8-sig" if strip_bom else "utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1  # (1-based, in bytes)
        raise NotUTF8Error(f"{label or path}: not UTF-8 text: byte 0x{raw[e.start]:02X} at byte offset {e.start} "
                           f"(line {line}, column {column}) cannot be decoded ({e.reason}); data files are read as "
                           "UTF-8: save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8 IN > OUT)") from None
