"""PostgreSQL's encoding names and the Python codec that reads each: the one table.

Used to decide whether a file can be split by byte search (:func:`can_split`), to decode
header names, transcoded pieces and rejected lines (:func:`python_codec`). Names are matched
the way PostgreSQL matches them (case and punctuation ignored); Python spellings are accepted.
"""

from __future__ import annotations

import codecs

# PostgreSQL's encoding aliases (encnames.c), keyed by the name with everything but letters and
# digits removed and lower-cased, plus the usual Python codec spellings.
_PG_ALIASES: dict[str, str] = {
    "abc": "WIN1258",
    "alt": "WIN866",
    "big5": "BIG5",
    "euccn": "EUC_CN",
    "eucjis2004": "EUC_JIS_2004",
    "eucjp": "EUC_JP",
    "euckr": "EUC_KR",
    "euctw": "EUC_TW",
    "gb18030": "GB18030",
    "gbk": "GBK",
    "iso88591": "LATIN1",
    "iso88592": "LATIN2",
    "iso88593": "LATIN3",
    "iso88594": "LATIN4",
    "iso88595": "ISO_8859_5",
    "iso88596": "ISO_8859_6",
    "iso88597": "ISO_8859_7",
    "iso88598": "ISO_8859_8",
    "iso88599": "LATIN5",
    "iso885910": "LATIN6",
    "iso885913": "LATIN7",
    "iso885914": "LATIN8",
    "iso885915": "LATIN9",
    "iso885916": "LATIN10",
    "johab": "JOHAB",
    "koi8": "KOI8R",
    "koi8r": "KOI8R",
    "koi8u": "KOI8U",
    "mskanji": "SJIS",
    "muleinternal": "MULE_INTERNAL",
    "shiftjis": "SJIS",
    "shiftjis2004": "SHIFT_JIS_2004",
    "sjis": "SJIS",
    "sqlascii": "SQL_ASCII",
    "tcvn": "WIN1258",
    "tcvn5712": "WIN1258",
    "uhc": "UHC",
    "unicode": "UTF8",
    "utf8": "UTF8",
    "vscii": "WIN1258",
    "win": "WIN1251",
    "win866": "WIN866",
    "win874": "WIN874",
    "win932": "SJIS",
    "win936": "GBK",
    "win949": "UHC",
    "win950": "BIG5",
    "windows866": "WIN866",
    "windows874": "WIN874",
    "windows932": "SJIS",
    "windows936": "GBK",
    "windows949": "UHC",
    "windows950": "BIG5",
    # Python codec names and aliases that PostgreSQL does not spell the same way.
    "ascii": "SQL_ASCII",
    "usascii": "SQL_ASCII",
    "utf8sig": "UTF8",
    "latin": "LATIN1",
    "cp866": "WIN866",
    "cp874": "WIN874",
    "cp932": "SJIS",
    "ms932": "SJIS",
    "cp936": "GBK",
    "ms936": "GBK",
    "cp949": "UHC",
    "ms949": "UHC",
    "cp950": "BIG5",
    "ms950": "BIG5",
    "cp1361": "JOHAB",
    "big5hkscs": "BIG5",
    "hkscs": "BIG5",
    "gb2312": "EUC_CN",
    "eucjisx0213": "EUC_JIS_2004",
    "shiftjisx0213": "SHIFT_JIS_2004",
    "sjis2004": "SHIFT_JIS_2004",
}
for _n in range(1, 11):
    _PG_ALIASES[f"latin{_n}"] = f"LATIN{_n}"
for _n in range(1250, 1259):
    _PG_ALIASES[f"win{_n}"] = f"WIN{_n}"
    _PG_ALIASES[f"windows{_n}"] = f"WIN{_n}"
    _PG_ALIASES[f"cp{_n}"] = f"WIN{_n}"
del _n

# PostgreSQL's client-only encodings: a byte < 0x80 can be the 2nd byte of a character.
_CLIENT_ONLY = frozenset({"BIG5", "GB18030", "GBK", "JOHAB", "SHIFT_JIS_2004", "SJIS", "UHC"})

_PY_CODECS: dict[str, str] = {
    "SQL_ASCII": "utf-8",
    "UTF8": "utf-8",
    "LATIN1": "iso8859-1",
    "LATIN2": "iso8859-2",
    "LATIN3": "iso8859-3",
    "LATIN4": "iso8859-4",
    "LATIN5": "iso8859-9",
    "LATIN6": "iso8859-10",
    "LATIN7": "iso8859-13",
    "LATIN8": "iso8859-14",
    "LATIN9": "iso8859-15",
    "LATIN10": "iso8859-16",
    "ISO_8859_5": "iso8859-5",
    "ISO_8859_6": "iso8859-6",
    "ISO_8859_7": "iso8859-7",
    "ISO_8859_8": "iso8859-8",
    "WIN866": "cp866",
    "WIN874": "cp874",
    "KOI8R": "koi8-r",
    "KOI8U": "koi8-u",
    "EUC_JP": "euc_jp",
    "EUC_CN": "gb2312",
    "EUC_KR": "euc_kr",
    "EUC_JIS_2004": "euc_jis_2004",
    "SJIS": "cp932",
    "SHIFT_JIS_2004": "shift_jis_2004",
    "BIG5": "cp950",
    "GBK": "gbk",
    "GB18030": "gb18030",
    "UHC": "cp949",
    "JOHAB": "johab",
}
_PY_CODECS.update({f"WIN{n}": f"cp{n}" for n in range(1250, 1259)})


def _clean_name(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isascii() and ch.isalnum())


def pg_name(encoding: str) -> str | None:
    """PostgreSQL's canonical name for an encoding name (PostgreSQL or Python spelling)."""
    found = _PG_ALIASES.get(_clean_name(encoding))
    if found is None:
        try:
            python_name = codecs.lookup(encoding).name
        except LookupError:
            return None
        found = _PG_ALIASES.get(_clean_name(python_name))
    return found


def can_split(encoding: str) -> bool:
    """Whether files in ``encoding`` can be split by byte search for ASCII quote/newline bytes.

    False for PostgreSQL's client-only encodings (SJIS, SHIFT_JIS_2004, BIG5, GBK, GB18030, UHC,
    JOHAB), whose multi-byte characters may contain bytes that look like ASCII quotes or
    backslashes, and for names that are not recognised. Names are matched the way PostgreSQL
    matches them (case and punctuation are ignored) and Python spellings are accepted too
    (``'utf-8'``, ``'latin-1'``, ``'cp1252'``, ``'shift_jis'``...).
    """
    pg = pg_name(encoding)
    return pg is not None and pg not in _CLIENT_ONLY


def python_codec(encoding: str) -> str:
    """Python's codec for a PostgreSQL (or Python) encoding name.

    ``SQL_ASCII`` reads as UTF-8: with a SQL_ASCII client encoding the server does no
    conversion, so the bytes mean what they mean in the database's encoding (UTF-8 nearly
    always). :raises ValueError: no codec for the name."""
    pg = pg_name(encoding)
    if pg is not None and pg in _PY_CODECS:
        return _PY_CODECS[pg]
    try:
        return codecs.lookup(encoding).name
    except LookupError:
        raise ValueError(f"no Python codec for encoding {encoding!r}") from None


def python_encoding(pg_encoding: str) -> str:
    """Python's codec for a PostgreSQL encoding name (:func:`python_codec`); a name without one
    is returned as is."""
    try:
        return python_codec(pg_encoding)
    except ValueError:
        return pg_encoding
