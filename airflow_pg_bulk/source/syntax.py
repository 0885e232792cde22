"""How records end in a csv or text-format file, and the byte constants every reader of the
source shares.

:class:`RecordSyntax` is built once per load from its COPY options (:meth:`RecordSyntax.of`) and
passed down to everything that scans records (:mod:`.scanner`, :mod:`.boundaries`,
:mod:`.window`, :mod:`.header`, :mod:`.lines`, :mod:`.records`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_pg_bulk.plan.codes import CopyFormat

if TYPE_CHECKING:
    from airflow_pg_bulk.plan import CopyOptions

#: the first two bytes of a gzip stream
GZIP_MAGIC = b"\x1f\x8b"
#: a UTF-8 byte-order mark
UTF8_BOM = b"\xef\xbb\xbf"
#: the characters that make a path or a URL a glob
GLOB_CHARS = frozenset("*?[")


def one_byte(name: str, value: object) -> bytes:
    """``value`` (a one-character ASCII string or one byte) as one byte, for a quote, escape or
    delimiter named ``name`` in messages.

    :raises ValueError: not exactly one byte, or CR, LF or NUL."""
    if isinstance(value, str):
        if len(value) != 1 or not value.isascii():
            raise ValueError(f"{name} must be a single one-byte character, not {value!r}")
        value = value.encode("ascii")
    if not isinstance(value, (bytes, bytearray)) or len(value) != 1:
        raise ValueError(f"{name} must be exactly one byte, not {value!r}")
    value = bytes(value)
    if value in (b"\r", b"\n"):
        raise ValueError(f"{name} cannot be a newline or carriage return ({value!r})")
    if value == b"\0":
        raise ValueError(f"{name} cannot be a NUL byte")
    return value


@dataclass(frozen=True)
class RecordSyntax:
    """How records end: format ``'csv'`` or ``'text'``; quote/escape single bytes (csv only).

    ``quote`` and ``escape`` may also be given as one-character ASCII strings; they are stored as
    bytes. For ``format='text'`` they are validated but ignored.

    :raises ValueError: unknown format, or a quote/escape that is not exactly one byte or that is
        CR, LF or NUL.
    """

    format: CopyFormat = CopyFormat.CSV  # or its text, in any case: made the member
    quote: bytes = b'"'
    escape: bytes = b'"'

    def __post_init__(self) -> None:
        fmt = self.format.lower() if isinstance(self.format, str) else self.format
        try:
            known = CopyFormat(fmt)
        except (ValueError, TypeError):
            known = None
        if known is None or not known.delimited:
            raise ValueError(f"format must be 'csv' or 'text', not {self.format!r}")
        object.__setattr__(self, "format", known)
        object.__setattr__(self, "quote", one_byte("quote", self.quote))
        object.__setattr__(self, "escape", one_byte("escape", self.escape))

    @property
    def is_csv(self) -> bool:
        """True for the csv format."""
        return self.format.is_csv

    @classmethod
    def of(cls, copy: CopyOptions) -> RecordSyntax:
        """How records end in files read with these COPY options (csv quote and escape)."""
        if copy.format.is_csv:
            return cls(copy.format, copy.quote.encode(), copy.effective_escape.encode())
        return cls(copy.format)
