"""A database source's URL: held in this process only (:func:`hold`, :func:`hold_connection`,
:func:`held_url`), named in the plan and the log with its password masked (:func:`masked`);
a PostgreSQL URL read as SQLAlchemy reads it without importing SQLAlchemy."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, quote, quote_plus, unquote

from airflow_pg_bulk.db import driver
from airflow_pg_bulk.errors import LoadRefusedError

# name (masked URL or Airflow connection id) -> the URL itself, in this process only
_HELD: dict[str, str] = {}


def hold(url: str) -> str:
    """Keep ``url`` in this process for the COPY streams; return the name the plan carries
    (the URL with its password masked)."""
    name = masked(url)
    _HELD[name] = url
    return name


def hold_connection(conn_id: str, url: str) -> None:
    """Keep the URL an Airflow connection resolved to (in the operator's task), under its id."""
    _HELD[conn_id] = url


def masked(url: str) -> str:
    """``url`` with its password masked, as it may be logged and put in the plan (as
    SQLAlchemy renders it; a PostgreSQL URL without importing SQLAlchemy: :func:`_pg_url`)."""
    parts = _pg_url(url)
    if parts is not None:
        return _render(parts, hide_password=True)
    import sqlalchemy.engine

    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:
        raise LoadRefusedError(
            "source_url must be a URL such as postgresql://user@host/db or sqlite:///path.db "
            f"(the URL given could not be read: {driver.redact(url, url)!r}); nothing was changed"
        ) from None


def held_url(name: str) -> str:
    url = _HELD.get(name)
    if url is None:
        raise LoadRefusedError(
            f"the source database {name!r} is not known to this process: give source_url to "
            "this process, or, under Airflow, source_conn_id (its URL is resolved in each task)"
        )
    return url


def is_postgres(url: str) -> bool:
    """The URL names a PostgreSQL database (``postgresql://``, ``postgres://``,
    ``postgresql+psycopg://``, ...): read by COPY."""
    return _pg_url(url) is not None


def libpq_url(url: str) -> str:
    """A SQLAlchemy PostgreSQL URL as libpq reads it (the ``+driver`` part dropped)."""
    parts = _pg_url(url)
    assert parts is not None, "a PostgreSQL URL"
    return _render({**parts, "name": "postgresql"}, hide_password=False)


#: a SQLAlchemy URL's parts, as ``sqlalchemy.engine.url._parse_url`` reads them (its pattern)
_URL = re.compile(
    r"""
        (?P<name>[\w\+]+)://
        (?:
            (?P<username>[^:/]*)
            (?::(?P<password>[^@]*))?
        @)?
        (?:
            (?:
                \[(?P<ipv6host>[^/\?]+)\] |
                (?P<ipv4host>[^/:\?]+)
            )?
            (?::(?P<port>[^/\?]*))?
        )?
        (?:/(?P<database>[^\?]*))?
        (?:\?(?P<query>.*))?
    """,
    re.X,
)


def _pg_url(url: str) -> dict[str, Any] | None:
    """A PostgreSQL URL's parts read as SQLAlchemy reads them (``make_url``), without importing
    SQLAlchemy (0.12 s, which the PostgreSQL path needs for nothing else); None for a URL of
    another database, or not a URL."""
    found = _URL.match(url)
    if found is None or found["name"].split("+")[0] not in ("postgresql", "postgres"):
        return None
    parts: dict[str, Any] = found.groupdict()
    for key in ("username", "password", "database"):
        if parts[key] is not None:
            parts[key] = unquote(parts[key])
    parts["host"] = parts.pop("ipv4host") or parts.pop("ipv6host")
    parts.pop("ipv6host", None)
    query: dict[str, list[str]] = {}
    for key, value in parse_qsl(parts["query"] or ""):
        query.setdefault(key, []).append(value)
    parts["query"] = query
    return parts


def _render(parts: dict[str, Any], hide_password: bool) -> str:
    """:func:`_pg_url`'s parts as SQLAlchemy's ``URL.render_as_string`` writes them."""
    text = parts["name"] + "://"
    if parts["username"] is not None:
        text += quote(parts["username"], safe=" +")
        if parts["password"] is not None:
            text += ":" + ("***" if hide_password else quote(parts["password"], safe=" +"))
        text += "@"
    host = parts["host"]
    if host is not None:
        text += f"[{host}]" if ":" in host else host
    if parts["port"]:
        text += ":" + str(int(parts["port"]))
    if parts["database"] is not None:
        text += "/" + quote(parts["database"], safe=" +/")
    if parts["query"]:
        text += "?" + "&".join(
            f"{quote_plus(key)}={quote_plus(value)}"
            for key in sorted(parts["query"])
            for value in parts["query"][key]
        )
    return text
