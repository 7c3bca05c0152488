"""Reading a local data file as UTF-8 text, with an error that names the file, the byte and where it is.

Python's own ``UnicodeDecodeError`` names neither the file nor the line, and is a ``ValueError``: raised from a
data loader it reads like a bad config value. :func:`read_utf8` decodes the whole file up front instead.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["NotUTF8Error", "read_utf8", "utf16_problem"]


class NotUTF8Error(ValueError):
    """A data file that is not UTF-8 text; the message names the file, the byte offset, line and column of the first
    byte that cannot be decoded, and the encoding expected."""


def utf16_problem(raw: bytes) -> str | None:
    """How ``raw`` shows it is UTF-16 text, or ``None``: a UTF-16 byte-order mark (``FF FE`` little-endian, ``FE FF``
    big-endian: Windows editors' "Unicode"), or, without one, a NUL byte in every other position of its start
    (ASCII text in UTF-16), which UTF-8 decodes without an error into text full of NULs."""
    if raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
        order = "little" if raw[:2] == b"\xff\xfe" else "big"
        return f"its first two bytes are the UTF-16 {order}-endian byte-order mark 0x{raw[0]:02X} 0x{raw[1]:02X}"
    head = raw[:64]
    head = head[: len(head) - len(head) % 2]
    if len(head) >= 4:
        even, odd = head[0::2], head[1::2]
        if (not odd.strip(b"\0") and b"\0" not in even) or (not even.strip(b"\0") and b"\0" not in odd):
            return "no byte-order mark, but every other byte of its start is 0"
    return None


def read_utf8(path: str | os.PathLike, label: str | None = None, *, strip_bom: bool = False) -> str:
    """The text of ``path`` decoded as UTF-8 (``utf-8-sig``, a leading byte-order mark dropped, when ``strip_bom``).

    Args:
        label: how messages name the file (default: the path).
    Raises:
        NotUTF8Error: ``"<label>: not UTF-8 text: byte 0xE9 at byte offset 15 (line 1, column 16) ..."``; for a
            UTF-16 file (:func:`utf16_problem`) ``"<label>: UTF-16 text (...); save it as UTF-8 ..."``.
        OSError: the file cannot be read.
    """
    raw = Path(path).read_bytes()
    utf16 = utf16_problem(raw)
    if utf16 is not None:  # (checked first: the byte advice below would suggest latin-1)
        raise NotUTF8Error(f"{label or path}: UTF-16 text ({utf16}); data files are read as UTF-8: save it as UTF-8 "
                           "(e.g. iconv -f utf-16 -t utf-8 IN > OUT)")
    try:
        return raw.decode("utf-8-sig" if strip_bom else "utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1  # (1-based, in bytes)
        raise NotUTF8Error(f"{label or path}: not UTF-8 text: byte 0x{raw[e.start]:02X} at byte offset {e.start} "
                           f"(line {line}, column {column}) cannot be decoded ({e.reason}); data files are read as "
                           "UTF-8: save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8 IN > OUT)") from None
