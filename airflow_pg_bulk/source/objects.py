"""Object-storage sources: ``s3://bucket/prefix/*.csv.gz`` and any other URL an fsspec
filesystem serves: through Airflow's :class:`~airflow.sdk.ObjectStoragePath` when a connection
is named, through fsspec alone (no Airflow import) when credentials come from the environment.

A URL is listed by prepare (globs over prefixes, ``**`` allowed) and each object becomes one
whole piece that records the object's size and ETag; the COPY task that owns it opens it again,
checks both, and streams it straight into COPY in chunks (decompressing a gzip object on the
way): nothing is written to disk and memory stays at about :data:`BLOCK_SIZE` per object. A big
uncompressed object is cut into byte ranges (:mod:`.window`): prepare reads a
window at each split point (:func:`open_seekable`) and each COPY task reads only its range.

Credentials: ``conn_id`` names an Airflow connection (``aws`` for ``s3://``; its extra
``endpoint_url`` points at an S3-compatible store); without one, the filesystem reads the
standard environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``,
...). ``s3://`` needs the amazon provider with s3fs (``pip install airflow-pg-bulk[s3]``), other
schemes their own fsspec package.

Failures say which URL: a missing bucket or object, or one that cannot be read with the
credentials given, is refused before anything loads; an object that changed since prepare
listed it (size or ETag) fails its partition (terminal: the plan's bytes are gone); a read
that fails part-way is transient: the partition's transaction rolls back and a retry reads the
object again. No message carries a secret (:func:`scrub`).
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import re
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any
from urllib.parse import urlsplit

from airflow_pg_bulk.errors import BadDataError, LoadRefusedError, TransientLoadError
from airflow_pg_bulk.source.syntax import GLOB_CHARS

log = logging.getLogger(__name__)

BLOCK_SIZE = 8 << 20  # bytes per range request while streaming an object into COPY
HEADER_BLOCK = 64 << 10  # bytes per range request while prepare reads a header
LIST_THREADS = 8  # objects whose first bytes prepare reads at once
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_SECRET_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AZURE_STORAGE_KEY")
_ENV_PREFIXES = ("AWS_", "GOOGLE_", "AZURE_", "AIRFLOW_CONN_")
_EXTRA_FOR = dict.fromkeys(("s3", "s3a", "s3n"), "airflow-pg-bulk[s3]")


class SourceChangedError(LoadRefusedError):
    """An object changed between prepare and its COPY: loading it would mix two versions."""


def scheme_of(text: str) -> str | None:
    """The URL scheme of ``text`` (lower case), or None for a plain path."""
    match = _SCHEME.match(text)
    return match.group(1).lower() if match else None


def is_url(text: str) -> bool:
    """Whether ``text`` names an object in storage (a URL whose scheme is not ``file``)."""
    scheme = scheme_of(text)
    return scheme is not None and scheme != "file"


def local_path(text: str) -> str:
    """A ``file://`` URL as the local path it names (other text unchanged): such a source is a
    local file, loaded (and split) as any path is."""
    if scheme_of(text) == "file":
        return text[len("file://") :] or "/"
    return text


def scrub(text: str) -> str:
    """``text`` with any secret this process holds in its environment replaced by ``***``."""
    for name in _SECRET_VARIABLES:
        secret = os.environ.get(name)
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


@dataclass(frozen=True)
class _Located:
    """An object URL resolved to its filesystem: ``key`` is its path there (``bucket/key``)."""

    fs: Any
    key: str
    scheme: str
    conn_id: str | None


_FILESYSTEMS: dict[tuple[str, str | None, str], Any] = {}


def _environment() -> str:
    """A digest of the environment variables a filesystem may take credentials from, so that
    a process whose environment changes gets a filesystem that reads the new one."""
    names = sorted(n for n in os.environ if n.startswith(_ENV_PREFIXES))
    text = "\0".join(f"{n}={os.environ[n]}" for n in names)
    return hashlib.sha256(text.encode()).hexdigest()


def _path(url: str, conn_id: str | None) -> _Located:
    """Where ``url`` lives: parsed by Airflow's ObjectStoragePath (which also takes a
    connection id written in the URL, ``s3://conn@bucket/key``), the filesystem made by
    Airflow's ``get_fs`` for the scheme and connection. A scheme without a filesystem names
    what to install.

    Filesystems are kept per scheme, connection and credential environment (Airflow's own
    store cache keeps the first one a process made, whatever its environment is now).

    Without a connection (the command line, a load given only the standard environment), the
    URL goes to fsspec directly: importing Airflow for its ObjectStoragePath costs 4-5 s of a
    CLI load before anything is listed, and without a connection it adds nothing."""
    if conn_id is None and not _names_a_connection(url):
        return _plain_path(url)
    try:
        from airflow.sdk import ObjectStoragePath
        from airflow.sdk.io import get_fs
    except ImportError as exc:  # pragma: no cover - Airflow is a dependency
        raise LoadRefusedError(f"source {url}: object storage needs apache-airflow") from exc
    scheme = scheme_of(url) or ""
    try:
        parsed = ObjectStoragePath(url, conn_id=conn_id)
        conn_id = parsed.conn_id
        cache_key = (parsed.protocol, conn_id, _environment())
        fs = _FILESYSTEMS.get(cache_key)
        if fs is None:
            fs = _FILESYSTEMS[cache_key] = get_fs(parsed.protocol, conn_id)
    except ImportError as exc:
        raise _needs_package(url, scheme, exc) from None
    except PermissionError as exc:
        raise _access_denied(url, conn_id, exc) from None
    except Exception as exc:  # an unknown protocol, a missing connection, a bad connection extra
        raise LoadRefusedError(
            f"source {url}: cannot open its filesystem ({type(exc).__name__}: "
            f"{scrub(str(exc))}){_install_hint(scheme)}"
        ) from None
    return _Located(fs, parsed.path, scheme, conn_id)


def _needs_package(url: str, scheme: str, exc: ImportError) -> LoadRefusedError:
    extra = _EXTRA_FOR.get(scheme, f"the fsspec package for {scheme}://")
    return LoadRefusedError(f"source {url}: reading {scheme}:// needs {extra} ({scrub(str(exc))})")


def _names_a_connection(url: str) -> bool:
    """Whether ``url`` carries an Airflow connection id (``s3://conn@bucket/key``)."""
    rest = url.split("://", 1)[-1]
    return "@" in rest.split("/", 1)[0]


def _plain_path(url: str) -> _Located:
    """``url`` on the fsspec filesystem of its scheme, credentials from the environment."""
    scheme = scheme_of(url) or ""
    try:
        import fsspec

        cache_key = (scheme, None, _environment())
        fs = _FILESYSTEMS.get(cache_key)
        if fs is None:
            # fsspec keeps one instance per arguments, whatever the environment is now
            fs = _FILESYSTEMS[cache_key] = fsspec.filesystem(scheme, skip_instance_cache=True)
        key = fsspec.core.strip_protocol(url)  # bucket/key for s3
    except ImportError as exc:
        raise _needs_package(url, scheme, exc) from None
    except ValueError as exc:  # fsspec: an unknown protocol
        raise LoadRefusedError(
            f"source {url}: cannot open its filesystem ({scrub(str(exc))}){_install_hint(scheme)}"
        ) from None
    return _Located(fs, key, scheme, None)


def _install_hint(scheme: str) -> str:
    extra = _EXTRA_FOR.get(scheme)
    return f"; for {scheme}:// install {extra}" if extra else ""


def _access_denied(url: str, conn_id: str | None, exc: BaseException) -> LoadRefusedError:
    where = (
        f"the connection {conn_id!r}"
        if conn_id
        else "the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, ...)"
    )
    return LoadRefusedError(
        f"source {url}: access denied ({scrub(str(exc)) or type(exc).__name__}); check the "
        f"credentials and endpoint of {where} (source_conn_id)"
    )


#: botocore's errors for an endpoint that does not answer (by name: botocore is optional)
_UNREACHABLE = {"EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError"}


def _unreachable(exc: BaseException) -> bool:
    return any(cls.__name__ in _UNREACHABLE for cls in type(exc).__mro__)


def _no_endpoint(url: str, conn_id: str | None, exc: BaseException) -> TransientLoadError:
    endpoint = (getattr(exc, "kwargs", None) or {}).get("endpoint_url")
    where = (
        f"the endpoint_url in the extra of the connection {conn_id!r} (source_conn_id)"
        if conn_id
        else "AWS_ENDPOINT_URL in the environment (unset: the provider's public endpoint)"
    )
    parts = urlsplit(str(endpoint)) if endpoint else None
    at = f" at {parts.scheme}://{parts.netloc.rpartition('@')[2]}" if parts else ""
    return TransientLoadError(
        f"source {url}: cannot reach the object store{at} "
        f"({scrub(str(exc))}); check {where}, and that the store is up and reachable "
        "from here. Nothing was loaded"
    )


def _url(scheme: str, name: str) -> str:
    return f"{scheme}://{name.lstrip('/')}"


def etag_of(info: dict[str, Any]) -> str | None:
    """What identifies an object's version in an fsspec ``info`` dict: S3's ``ETag``, GCS's
    and Azure's ``etag``/``md5Hash``; None where the filesystem gives none."""
    for key in ("ETag", "etag", "md5Hash", "version_id", "VersionId"):
        value = info.get(key)
        if value:
            return str(value).strip('"')
    return None


def list_objects(url: str, conn_id: str | None) -> list[tuple[str, int, str | None, str | None]]:
    """``(url, size, etag, conn_id)`` of the objects ``url`` names (a glob: every match, by
    name); ``conn_id`` is the one given, or the one written in the URL.

    :raises LoadRefusedError: the bucket or object does not exist, the glob matches nothing,
        the URL is a prefix rather than an object, or access is denied."""
    where = _path(url, conn_id)
    fs, key, conn_id = where.fs, where.key, where.conn_id
    try:
        if GLOB_CHARS & set(key):
            found = fs.glob(key, detail=True)
            files = {n: i for n, i in sorted(found.items()) if i.get("type") != "directory"}
            if not files:
                _refuse_missing_bucket(fs, url, key)
                raise LoadRefusedError(f"source pattern {url!r} matched no objects")
        else:
            info = fs.info(key)
            if info.get("type") == "directory":
                raise LoadRefusedError(
                    f"source {url!r} is a prefix (a directory), not an object; give a glob "
                    f"such as {url.rstrip('/')}/*.csv"
                )
            files = {info.get("name", key): info}
    except FileNotFoundError:
        _refuse_missing_bucket(fs, url, key)
        raise LoadRefusedError(f"source {url!r}: the object does not exist") from None
    except PermissionError as exc:
        raise _access_denied(url, conn_id, exc) from None
    except LoadRefusedError:
        raise
    except OSError as exc:
        raise LoadRefusedError(
            f"source {url}: cannot list it ({type(exc).__name__}: {scrub(str(exc))})"
        ) from None
    except Exception as exc:
        if not _unreachable(exc):
            raise
        raise _no_endpoint(url, conn_id, exc) from None
    return [
        (_url(where.scheme, name), int(info["size"]), etag_of(info), conn_id)
        for name, info in files.items()
    ]


def _refuse_missing_bucket(fs: Any, url: str, key: str) -> None:
    bucket = key.split("/", 1)[0]
    try:
        exists = fs.exists(bucket)
    except Exception:  # access denied, or anything else: this only improves the message
        return
    if not exists:
        raise LoadRefusedError(f"source {url!r}: the bucket {bucket!r} does not exist")


def first_bytes(urls: list[tuple[str, str | None]]) -> dict[str, bytes]:
    """The first two bytes of each ``(url, conn_id)`` (gzip is told by its magic number), read
    in parallel."""

    def head(entry: tuple[str, str | None]) -> bytes:
        url, conn_id = entry
        where = _path(url, conn_id)
        try:
            return where.fs.cat_file(where.key, start=0, end=2)
        except PermissionError as exc:
            raise _access_denied(url, conn_id, exc) from None
        except FileNotFoundError:
            raise LoadRefusedError(f"source {url!r}: the object does not exist") from None

    with ThreadPoolExecutor(max_workers=min(LIST_THREADS, max(1, len(urls)))) as pool:
        return dict(zip((url for url, _ in urls), pool.map(head, urls), strict=True))


class _Counting:
    """A reader that counts the (compressed) bytes read through it."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self.count += len(data)
        return data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False


def open_header(url: str, conn_id: str | None, compression: str | None) -> IO[bytes]:
    """The object opened for prepare to read its first record (small range requests)."""
    where = _path(url, conn_id)
    try:
        raw = where.fs.open(where.key, "rb", block_size=HEADER_BLOCK, cache_type="readahead")
    except PermissionError as exc:
        raise _access_denied(url, conn_id, exc) from None
    except FileNotFoundError:
        raise LoadRefusedError(f"source {url!r}: the object does not exist") from None
    return gzip.GzipFile(fileobj=raw, mode="rb") if compression == "gzip" else raw


def open_seekable(url: str, conn_id: str | None, block_size: int = HEADER_BLOCK) -> IO[bytes]:
    """The (uncompressed) object opened for reads at any offset: each read is a range request
    of what it asks for (no read-ahead), as prepare reads a window at each split point and a
    repair reads a range exactly."""
    where = _path(url, conn_id)
    try:
        return where.fs.open(where.key, "rb", block_size=block_size, cache_type="none")
    except PermissionError as exc:
        raise _access_denied(url, conn_id, exc) from None
    except FileNotFoundError:
        raise LoadRefusedError(f"source {url!r}: the object does not exist") from None


def content_chunks(
    url: str,
    conn_id: str | None,
    compression: str | None,
    size: int | None,
    etag: str | None,
    chunk_size: int,
    start: int = 0,
    end: int | None = None,
) -> Iterator[bytes]:
    """The object's whole (decompressed) content, header included, in chunks; or, for an
    uncompressed object split into ranges, the bytes ``[start, end)`` only.

    Before the first byte, the object's size and ETag are checked against what prepare listed
    (``size``, ``etag``); on S3 every range request is conditional on that ETag; after the last
    byte, the bytes read are checked against the size and the object is looked up again. Any
    difference raises :class:`SourceChangedError`."""
    with _read_errors(url, conn_id, etag):
        where = _path(url, conn_id)
        fs, key = where.fs, where.key
        fs.invalidate_cache(key)
        before = fs.info(key)
        _check_unchanged(url, before, size, etag)
        mb = int(before["size"]) / 1e6
        if end is None:
            log.info("Reading %s (%.1f MB%s)", url, mb, ", gzip" if compression else "")
        else:
            log.info(
                "Reading %s bytes %d-%d (%.1f MB of %.1f MB)",
                url,
                start,
                end,
                (end - start) / 1e6,
                mb,
            )
        # a range is read in BLOCK_SIZE range requests of its own bytes (none past its end)
        cache = "readahead" if end is None else "none"
        with fs.open(key, "rb", block_size=BLOCK_SIZE, cache_type=cache) as raw:
            details = getattr(raw, "details", None)
            if isinstance(details, dict):
                _check_unchanged(url, details, size, etag)
            counting = _Counting(raw)
            if end is not None:
                raw.seek(start)
                yield from _range_chunks(counting, end - start, chunk_size)
            else:
                reader: Any = (
                    gzip.GzipFile(fileobj=counting, mode="rb")
                    if compression == "gzip"
                    else counting
                )
                while chunk := reader.read(chunk_size):
                    yield chunk
        if end is not None and counting.count != end - start:
            raise SourceChangedError(
                f"source {url} changed while it was read: {counting.count} bytes read from "
                f"offset {start} where the range holds {end - start}; nothing of this COPY stream "
                "was committed. Run the load again (prepare lists the objects anew)"
            )
        if end is None and size is not None and counting.count + start != size:
            raise SourceChangedError(
                f"source {url} changed while it was read: {counting.count} bytes read where "
                f"prepare listed {size}; nothing of this COPY stream was committed. Run the load "
                "again (prepare lists the objects anew)"
            )
        fs.invalidate_cache(key)
        _check_unchanged(url, fs.info(key), size, etag)


@contextmanager
def open_checked(
    url: str,
    conn_id: str | None,
    size: int | None,
    etag: str | None,
    block_size: int | None = None,
) -> Iterator[IO[bytes]]:
    """The object opened for random access (range requests of ``block_size``), as a Parquet
    reader needs it; checked as :func:`content_chunks` checks it: size and ETag against what
    prepare listed before the first read, every S3 range request conditional on the ETag,
    and looked up again when the caller is done. Failures are translated the same way.
    ``block_size``: default :data:`BLOCK_SIZE`."""
    with _read_errors(url, conn_id, etag):
        where = _path(url, conn_id)
        fs, key = where.fs, where.key
        fs.invalidate_cache(key)
        _check_unchanged(url, fs.info(key), size, etag)
        block = block_size or BLOCK_SIZE
        with fs.open(key, "rb", block_size=block, cache_type="readahead") as raw:
            details = getattr(raw, "details", None)
            if isinstance(details, dict):
                _check_unchanged(url, details, size, etag)
            yield raw
        fs.invalidate_cache(key)
        _check_unchanged(url, fs.info(key), size, etag)


@contextmanager
def _read_errors(url: str, conn_id: str | None, etag: str | None) -> Iterator[None]:
    """Reading an object in a COPY task: a deleted or replaced object is
    :class:`SourceChangedError`, refused credentials a refusal, a damaged gzip stream bad
    data, any other I/O failure transient (a retry reads it again)."""
    try:
        yield
    except (SourceChangedError, LoadRefusedError):
        raise
    except FileNotFoundError:
        raise SourceChangedError(
            f"source {url} was deleted after prepare listed it; nothing of this COPY stream was "
            "committed. Run the load again (prepare lists the objects anew)"
        ) from None
    except PermissionError as exc:
        raise _access_denied(url, conn_id, exc) from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise _damaged(url, exc) from None
    except OSError as exc:
        if _expired(exc):
            raise SourceChangedError(
                f"source {url} was replaced while it was read (its ETag no longer matches "
                f"{etag}); nothing of this COPY stream was committed. Run the load again "
                "(prepare lists the objects anew)"
            ) from None
        raise TransientLoadError(
            f"reading {url} failed ({type(exc).__name__}: {scrub(str(exc))}); nothing of this "
            "COPY stream was committed and a retry reads the object again"
        ) from None


def _range_chunks(raw: _Counting, length: int, chunk_size: int) -> Iterator[bytes]:
    """``length`` bytes from ``raw``'s position, in range requests of at most BLOCK_SIZE,
    handed out in chunks of at most ``chunk_size``."""
    left = length
    while left > 0:
        block = raw.read(min(BLOCK_SIZE, left))
        if not block:
            return
        left -= len(block)
        for k in range(0, len(block), chunk_size):
            yield block[k : k + chunk_size]


def _damaged(url: str, exc: BaseException) -> Exception:
    return BadDataError(
        f"{url}: the gzip stream is damaged or truncated ({exc}); nothing of this load reached "
        "the target",
        path=url,
    )


def _expired(exc: OSError) -> bool:
    """s3fs's FileExpired: a range request's ``If-Match`` on the ETag failed."""
    return type(exc).__name__ == "FileExpired" or "pre-conditions" in str(exc)


def _check_unchanged(url: str, info: dict[str, Any], size: int | None, etag: str | None) -> None:
    now_size, now_etag = int(info.get("size", -1)), etag_of(info)
    changes = []
    if size is not None and now_size != size:
        changes.append(f"size {size} -> {now_size} bytes")
    if etag is not None and now_etag is not None and now_etag != etag:
        changes.append(f"ETag {etag} -> {now_etag}")
    if changes:
        raise SourceChangedError(
            f"source {url} changed after prepare listed it ({', '.join(changes)}): loading it "
            "now would mix two versions of the source; nothing of this COPY stream was committed. "
            "Run the load again (prepare lists the objects anew)"
        )


def lineage_name(url: str) -> tuple[str, str]:
    """OpenLineage's (namespace, name) of an object: ``s3://bucket`` and the key."""
    scheme = scheme_of(url) or "file"
    rest = url.split("://", 1)[1]
    bucket, _, key = rest.partition("/")
    return f"{scheme}://{bucket}", key
