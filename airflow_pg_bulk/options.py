"""The one declaration of every load option: name, type, default, a one-line doc and the modes
it applies to.

Everything that takes load options derives from :data:`OPTIONS`:

- ``PgBulkPrepareOperator``, ``pg_bulk_load`` and ``runner.load`` take the options as keywords
  (``**options``); :func:`with_load_options` gives each of them a signature that names every
  option, keyword-only with its default (what ``help()``, IDEs and Airflow's ``default_args``
  read), and writes their ``:param:`` lines into its docstring;
- :class:`airflow_pg_bulk.option_types.LoadOptions`, the ``TypedDict`` that type checkers read
  (``**options: Unpack[LoadOptions]``), is generated from it (:func:`typed_dict_source`,
  written by ``python -m airflow_pg_bulk.options``; a test checks it is current);
- the request dataclasses (:mod:`airflow_pg_bulk.plan.request`) read their defaults from it;
- the command line's flags are generated from it (:func:`add_cli_flags`);
- the README's parameter table is generated from it (:func:`markdown_table`) and checked.

Add a new option here first, then run ``python -m airflow_pg_bulk.options`` (it rewrites
``option_types.py`` and prints the README table to paste). Nothing here imports Airflow or
touches a database.
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # argparse is the command line's: imported there, not at DAG-parse time
    import argparse

MODES: tuple[str, ...] = ("replace", "append", "upsert", "replace_partitions")
MODE_HELP: dict[str, str] = {
    "replace": "the target ends up with exactly the loaded rows (the rows it holds are removed)",
    "append": "the loaded rows are added to the rows the target holds",
    "upsert": "a loaded row replaces the target's row with the same key, the others are added",
    "replace_partitions": "on a partitioned target, each table partition that receives a loaded "
    "row ends up with exactly its loaded rows; the other table partitions are not touched",
}
ON_DUPLICATE_KEY: tuple[str, ...] = ("last", "fail")  # plan.codes.OnDuplicateKey
STRATEGIES: tuple[str, ...] = ("auto", "in_place", "rebuild")  # plan.codes.RowStrategy
ON_ERROR: tuple[str, ...] = ("fail", "reject")  # plan.codes.OnError
FORMATS: tuple[str, ...] = ("csv", "text", "parquet")  # plan.codes.CopyFormat
DEFAULT_PARTITION_BYTES = 64 << 20  # see docs/tuning.md: how the default was measured
TAB_SPELLINGS: tuple[str, ...] = ("\t", "\\t", "\\\\t", "tab", "TAB")


class _Required:
    """The default of an option that has none: it must be given."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


def mode_required_message(spell: Callable[[str], str] = lambda m: f"mode={m!r}") -> str:
    """What a load without ``mode`` says: each mode and what it does to the target.

    :param spell: how a mode is written where the message is read (``--mode replace``).
    """
    choices = ", or ".join(f"{spell(name)}: {what}" for name, what in MODE_HELP.items())
    return f"a mode is required (there is no default); nothing was changed. Choose {choices}."


@dataclass(frozen=True)
class LoadOption:
    """One load option.

    :param name: the keyword (``lock_timeout``); the CLI flag is ``--lock-timeout``.
    :param type: ``str``, ``int`` or ``bool``; ``columns`` is a list of ``str``.
    :param default: the value used when the option is not given (or ``None``: computed, see
        ``default_doc``); :data:`REQUIRED` when it must be given.
    :param doc: one line: what the option does.
    :param default_doc: the default in words, for the docs and ``--help``.
    :param group: where it lands in the request: ``copy`` (CopyOptions), ``settings``
        (Settings), ``errors`` (ErrorPolicy) or ``request`` (LoadRequest itself).
    :param choices: the allowed values, if they are a closed set.
    :param modes: the modes the option applies to.
    :param templated: a template field of ``PgBulkPrepareOperator`` (rendered by Airflow, then
        checked by :func:`checked` when the task runs); every option is, unless declared
        otherwise.
    :param is_list: a list of strings (comma-separated on the command line).
    """

    name: str
    type: type
    default: Any
    doc: str
    default_doc: str
    group: str
    choices: tuple[str, ...] | None = None
    modes: tuple[str, ...] = MODES
    templated: bool = True
    is_list: bool = False

    @property
    def flag(self) -> str:
        """The command-line flag, ``--lock-timeout``."""
        return "--" + self.name.replace("_", "-")

    @property
    def required(self) -> bool:
        """The option has no default and must be given."""
        return self.default is REQUIRED


OPTIONS: tuple[LoadOption, ...] = (
    LoadOption(
        "mode", str, REQUIRED,
        "`replace`: the target ends up with exactly the loaded rows; `append`: the loaded rows "
        "are added to the target's rows; `upsert`: a loaded row replaces the loaded columns of "
        "the target's row with the same `key`, the others are added; `replace_partitions` (a "
        "partitioned target): each table partition that receives rows ends up with exactly "
        "them, the others are not touched (see Modes and their guarantees, Partitioned targets)",
        "none: must be given", "request", choices=MODES,
    ),
    LoadOption(
        "source_conn_id", str, None,
        "Airflow connection that object-storage URLs in `source` (`s3://bucket/prefix/*.csv.gz`) "
        "are read with: an `aws` connection for `s3://`, its extra `endpoint_url` for an "
        "S3-compatible store; every COPY task reads its own objects with it. With `query` or "
        "`source_table`: the source database's connection (any whose hook is a DB-API hook; "
        "each task resolves it, only its id travels through XCom)",
        "none: the standard environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, "
        "`AWS_ENDPOINT_URL`, …)",
        "request",
    ),
    LoadOption(
        "source_url", str, None,
        "a database as the source, in place of files: a SQLAlchemy or libpq URL "
        "(`postgresql://user@host/db` streams `COPY (query) TO STDOUT` into the load, bytes "
        "not rows; `sqlite:///path.db` and other SQLAlchemy URLs stream rows from a "
        "server-side cursor); with `query` or `source_table`. Its password is never logged "
        "nor put in the plan. Not templated: under Airflow give `source_conn_id` instead",
        "none: the source is files", "request", templated=False,
    ),
    LoadOption(
        "query", str, None,
        "with a database source: the SELECT whose rows are loaded; its column names are "
        "matched to the target's by name (`SELECT a AS b` renames); templated, so "
        "`WHERE updated_at >= '{{ data_interval_start }}'` loads one data interval",
        "none", "request",
    ),
    LoadOption(
        "source_table", str, None,
        "with a database source: a table (`schema.table` or `table`) whose rows are all "
        "loaded, in place of `query`",
        "none", "request",
    ),
    LoadOption(
        "split_by", str, None,
        "with a database source: a column (integer, date or timestamp) cut at its quantiles "
        "into `partitions` ranges of about equal row counts, a skewed key too (a PostgreSQL "
        "table's ANALYZE histogram where it covers every row, else `ntile` over the key), "
        "one COPY stream each (rows with a NULL key go to the first); each range is its own "
        "statement on the source. `ctid` for a PostgreSQL `source_table` (14+): ranges of "
        "equal numbers of its blocks, each read by a TID range scan, no key read or sorted",
        "none: one COPY stream", "request",
    ),
    LoadOption(
        "create_target", bool, False,
        "with a database source or Parquet files: when the target table does not exist, "
        "create it from the source's columns: a PostgreSQL source's exact types "
        "(`format_type`: numeric precision, arrays, json, timestamptz; an enum becomes `text`, "
        "its type not being on the target), another database's `source_table` types mapped "
        "through SQLAlchemy, the first Parquet file's Arrow types; NOT NULL and the primary key "
        "where the source has them; nothing else (no default, index or other constraint). An "
        "existing target is never altered. The table stays (empty) if the load then fails",
        "`False`: the target must exist", "request",
    ),
    LoadOption(
        "format", str, "csv",
        "`csv`, `text` (PostgreSQL's text format) or `parquet` (columns matched to the table's "
        "by name, row groups split over COPY streams; needs `airflow-pg-bulk[parquet]`)",
        "`csv`", "copy", choices=FORMATS,
    ),
    LoadOption(
        "header", bool, False,
        "every file starts with a header line; columns are matched to the table by name "
        "(exact, then case-insensitive), in any order; all files must have the same header",
        "`False`", "copy",
    ),
    LoadOption("delimiter", str, None, "field delimiter, one byte", "`,` (csv), tab (text)",
               "copy"),
    LoadOption("null", str, None, "the NULL marker", "unquoted empty (csv), `\\N` (text)", "copy"),
    LoadOption("quote", str, '"', "csv quote character", '`"`', "copy"),
    LoadOption("escape", str, None, "csv escape character inside quotes", "the quote", "copy"),
    LoadOption(
        "encoding", str, "UTF8",
        "the files' encoding, PostgreSQL's name (`LATIN1`, `WIN1252`, …); splitting one file "
        "needs an ASCII-compatible encoding",
        "`UTF8`", "copy",
    ),
    LoadOption(
        "partitions", int, None,
        "number of COPY streams the input is cut into (one mapped COPY task each under "
        "Airflow); not the target's table partitions",
        "by size: one per `partition_size`, at most 16", "request",
    ),
    LoadOption(
        "partition_size", int, DEFAULT_PARTITION_BYTES,
        "input bytes per COPY stream when `partitions` is not given (not a table partition's "
        "size)",
        "67108864 (64 MiB)",
        "request",
    ),
    LoadOption(
        "columns", str, None,
        "target columns the fields fill, in file order, for files without a header",
        "all non-generated", "request", is_list=True,
    ),
    LoadOption(
        "key", str, None,
        "the columns that identify a row: exactly the columns of the target's primary key or "
        "of one of its unique constraints or unique indexes (any order)",
        "the primary key", "request", modes=("upsert",), is_list=True,
    ),
    LoadOption(
        "on_duplicate_key", str, "last",
        "a key loaded more than once: `last`: the row latest in source order wins (files in "
        "the order given, each glob's matches by name; lines in file order); `fail`: the load "
        "fails naming the key, the target untouched",
        "`last`", "request", choices=ON_DUPLICATE_KEY, modes=("upsert",),
    ),
    LoadOption(
        "strategy", str, "auto",
        "how the rows reach the target: `in_place` (INSERT into it); `rebuild` (a new table "
        "= its rows + the loaded rows, indexed, then swapped in as a replace does; needs a "
        "replace's privileges); `auto`: the cheaper by the cost model in docs/design.md, in "
        "place when a rebuild is not possible (said in the log)",
        "`auto`", "request", choices=STRATEGIES, modes=("append", "upsert"),
    ),
    LoadOption(
        "staging_logged", bool, None,
        "staging persistence: a logged (true) or unlogged (false) staging table; see "
        "docs/tuning.md for the measurement behind the defaults",
        "`True` for replace and replace_partitions, `False` for append and upsert", "request",
    ),
    LoadOption(
        "lock_timeout", str, "30s",
        "longest wait for any lock a step takes: the target's in finalize, and the load's own "
        "tables in prepare, finalize and cleanup",
        "`30s`", "settings",
    ),
    LoadOption(
        "abandoned_after", str, "1d",
        "how long a load into the same target may go without a sign of life (no session, no "
        "COPY committed since) before the next load's prepare drops the tables it left: a crashed "
        "load's staging; those of a finalized load are dropped at once; a PostgreSQL interval "
        "(see A failed cleanup, and leftover staging)",
        "`1d`", "settings",
    ),
    LoadOption(
        "maintenance_work_mem", str, "512MB",
        "memory for index builds and constraint validation in finalize", "`512MB`", "settings",
    ),
    LoadOption(
        "index_workers", int, None,
        "parallel maintenance workers of each index build in finalize "
        "(`max_parallel_maintenance_workers`), raising or lowering the server's setting; never "
        "more than the builds at once leave of the server's `max_parallel_workers`; `0`: none",
        "the server's `max_parallel_maintenance_workers` (see docs/tuning.md, \"finalize on "
        "several cores\")", "settings",
    ),
    LoadOption(
        "synchronous_commit", str, "off",
        "`synchronous_commit` of the COPY sessions; with `off` a crash can lose only COPY "
        "streams whose commit was not yet flushed, which the ledger check then reports — never "
        "a silent partial load",
        "`off`", "settings",
    ),
    LoadOption(
        "analyze", bool, True,
        "ANALYZE the new rows: a replace, rebuild or table partition swap before they become "
        "visible; an in-place append or upsert after its commit, when it changed at least a "
        "tenth of the target's rows (smaller batches are left to autovacuum)",
        "`True`", "settings",
    ),
    LoadOption(
        "allow_older_run", bool, False,
        "let this run replace rows that a run with a later data interval of the same DAG task "
        "loaded (a deliberate reload of the past); otherwise such a run fails, naming the newer "
        "load and changing nothing (see Runs that overlap). Under Airflow only: the command "
        "line and `load()` have no data interval",
        "`False`", "settings", modes=("replace", "replace_partitions", "upsert"),
    ),
    LoadOption(
        "history_keep", int, 1000,
        "loads kept per target in the load history `pgbulk_loads`; older ones are deleted after "
        "each finalize into the target (the newest load of each DAG task and table partition "
        "always stays: the ordering of runs needs it)",
        "`1000`", "settings",
    ),
    LoadOption(
        "on_error", str, "fail",
        "`fail`: the first bad row fails the load, naming file, line, column and value; "
        "`reject`: rows PostgreSQL cannot parse or convert go to `reject_table` and the rest load",
        "`fail`", "errors", choices=ON_ERROR,
    ),
    LoadOption(
        "max_rejects", int, 0,
        "with `reject`: the most rejected rows the whole load may have; past it the load fails "
        "and nothing reaches the target; rejected rows are kept in `reject_table` either way",
        "`0`", "errors",
    ),
    LoadOption(
        "reject_table", str, None,
        "`schema.table` for rejected rows, created if missing: `load_id, target, source_file, "
        "line, raw_line, error, rejected_at`; kept after the load",
        "`pgbulk_rejects` in the target's schema", "errors",
    ),
)  # fmt: skip

BY_NAME: dict[str, LoadOption] = {opt.name: opt for opt in OPTIONS}
NAMES: tuple[str, ...] = tuple(BY_NAME)


def default(name: str) -> Any:
    """The declared default of option ``name`` (what the plan's dataclass fields default to)."""
    return BY_NAME[name].default


def in_group(group: str) -> tuple[str, ...]:
    """The names of the options of one group (``copy``, ``settings``, ``errors``, ``request``)."""
    return tuple(opt.name for opt in OPTIONS if opt.group == group)


def pick(values: Mapping[str, Any], exclude: Iterable[str] = ()) -> dict[str, Any]:
    """The load options among ``values`` (for example an ``__init__``'s ``locals()``)."""
    skip = set(exclude)
    return {name: values[name] for name in NAMES if name in values and name not in skip}


def changed(values: Mapping[str, Any], exclude: Iterable[str] = ()) -> dict[str, Any]:
    """The load options among ``values`` that differ from their declared defaults (so that
    whole ``settings=``/``copy=``/``errors=`` objects keep their own fields)."""
    return {k: v for k, v in pick(values, exclude).items() if v != BY_NAME[k].default}


# --- values rendered at run time ----------------------------------------------------------


def templated_names() -> tuple[str, ...]:
    """The options that are template fields of ``PgBulkPrepareOperator``."""
    return tuple(opt.name for opt in OPTIONS if opt.templated)


def _given(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def as_text(name: str, value: Any) -> str:
    """``value`` if it is a text, else a ``TypeError`` naming ``name`` and what was given."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a text, not {_given(value)}")
    return value


def as_names(name: str, value: Any) -> tuple[str, ...] | None:
    """Names given as a list of texts, or as one text: comma-separated (``"id, v"``), or a
    list as a template renders one (``"['id', 'v']"``); an empty text is not given (None)."""
    import ast

    if isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        if text[0] in "[(":
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                raise ValueError(
                    f"{name} must be a list of column names or one text of comma-separated "
                    f"names, not {_given(value)}"
                ) from None
        else:
            return tuple(part.strip() for part in text.split(",") if part.strip())
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise TypeError(
            f"{name} must be a list of column names or one text of comma-separated names, "
            f"not {_given(value)}"
        )
    return tuple(value)


def as_bool(name: str, value: Any) -> bool | None:
    """A boolean, or the text ``true``/``false`` in any case (what a template renders from a
    boolean); an empty text is not given (None); anything else a ``TypeError``."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        word = value.strip().lower()
        if word in ("true", "false"):
            return word == "true"
        if not word:
            return None
    raise TypeError(f"{name} must be true or false, not {_given(value)}")


def as_whole_number(name: str, value: Any) -> int | None:
    """An int, or a text of one (what a template renders); an empty text is not given (None);
    anything else (a bool, ``3.5``, ``'many'``) a ``TypeError``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        text = value.strip().replace("_", "")
        if not text:
            return None
        try:
            return int(text)
        except ValueError:
            pass
    raise TypeError(f"{name} must be a whole number, not {_given(value)}")


def checked(name: str, value: Any) -> Any:
    """The value of option ``name`` as a load takes it, from what Airflow rendered (a text,
    unless the DAG renders native objects): typed as declared, else a ``TypeError`` or
    ``ValueError`` that names the option and what was given. None is not given (the default
    applies)."""
    opt = BY_NAME[name]
    if value is None:
        return None
    if opt.is_list:
        return as_names(name, value)
    if opt.type is bool:
        return as_bool(name, value)
    if opt.type is int:
        number = as_whole_number(name, value)
        if number is not None and number < _MINIMUM.get(name, 0):
            raise ValueError(f"{name} must be {_MINIMUM.get(name, 0)} or more, not {number}")
        return number
    if opt.type is not str:  # another type (a float …): itself, or its text converted
        if isinstance(value, opt.type):
            return value
        try:
            return opt.type(as_text(name, value).strip())
        except (TypeError, ValueError):
            raise TypeError(f"{name} must be a {opt.type.__name__}, not {_given(value)}") from None
    text = as_text(name, value)
    if opt.choices and text not in opt.choices:
        if name == "mode" and not text:
            return text  # the request says which modes there are and what each does
        allowed = ", ".join(repr(c) for c in opt.choices)
        raise ValueError(f"{name} must be one of {allowed}, not {_given(value)}")
    return text


# --- the command line -------------------------------------------------------------------


def parse_delimiter(text: str) -> str:
    """A delimiter as typed in a shell: ``'\\t'`` (backslash, t), ``'\\\\t'``, ``tab`` or a real
    tab mean a tab; anything else is taken as is."""
    return "\t" if text in TAB_SPELLINGS else text


def whole_number_parser(minimum: int) -> Callable[[str], int]:
    """An ``argparse`` type: a whole number (``_`` allowed between digits) of ``minimum`` or
    more, else an ``ArgumentTypeError`` saying what is needed."""
    import argparse

    def parse(text: str) -> int:
        try:
            value = int(text.replace("_", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(f"a whole number is needed, not {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{minimum} or more is needed, not {value}")
        return value

    return parse


def _column_list(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


_MINIMUM = {
    "partitions": 1,
    "partition_size": 1,
    "max_rejects": 0,
    "index_workers": 0,
    "history_keep": 1,
}


def _cli_help(opt: LoadOption) -> str:
    text = opt.doc.replace("`", "")
    if opt.name == "delimiter":
        text += " (a tab: '\\t', tab or $'\\t')"
    if opt.is_list:
        text += " (comma-separated)"
    default = "none, must be given" if opt.required else opt.default_doc.replace("`", "")
    return f"{text} (default: {default})".replace("%", "%%")


def add_cli_flags(parser: argparse.ArgumentParser) -> None:
    """Add one flag per load option to ``parser``. Every flag defaults to ``None`` (not given:
    the declared default applies); booleans are ``--x/--no-x``."""
    import argparse

    for opt in OPTIONS:
        kwargs: dict[str, Any] = {"default": None, "help": _cli_help(opt), "dest": opt.name}
        if opt.type is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif opt.choices:
            kwargs["choices"] = opt.choices
        elif opt.type is int:
            kwargs["type"] = whole_number_parser(_MINIMUM.get(opt.name, 0))
            kwargs["metavar"] = "N"
        elif opt.is_list:
            kwargs["type"] = _column_list
            kwargs["metavar"] = "A,B,..."
        elif opt.name == "delimiter":
            kwargs["type"] = parse_delimiter
        parser.add_argument(opt.flag, **kwargs)


# --- documentation ------------------------------------------------------------------------


def markdown_table() -> str:
    """The README's table of load options, one row per option."""
    lines = ["| parameter | default | modes | meaning |", "|---|---|---|---|"]
    for opt in OPTIONS:
        default = "— (required)" if opt.required else opt.default_doc
        meaning = opt.doc + (". Templated." if opt.templated else "")
        lines.append(f"| `{opt.name}` | {default} | {', '.join(opt.modes)} | {meaning} |")
    return "\n".join(lines)


def param_doc(opt: LoadOption) -> str:
    """The ``:param:`` text of an option for a docstring (without the ``:param x:`` prefix)."""
    text = (
        opt.doc.replace("`", "``")
        + "; default "
        + ("none: it must be given" if opt.required else opt.default_doc.replace("`", "``"))
    )
    return text + "." + (" (templated)" if opt.templated else "")


def param_docstring(indent: str = "    ") -> str:
    """The ``:param:`` lines of every option, wrapped, to paste into a docstring."""
    out = []
    for opt in OPTIONS:
        out.append(
            textwrap.fill(
                f":param {opt.name}: {param_doc(opt)}",
                width=96,
                initial_indent=indent,
                subsequent_indent=indent + "    ",
                break_on_hyphens=False,
            )
        )
    return "\n".join(out)


# --- signatures: every option written once -------------------------------------------------

F = TypeVar("F", bound=Callable[..., Any])
#: The line of a docstring that :func:`with_load_options` replaces with the options' ``:param:``
#: lines (at its indentation).
DOC_MARKER = ":load options:"


def _annotation(opt: LoadOption) -> str:
    base = "Sequence[str]" if opt.is_list else opt.type.__name__
    return base if opt.default not in (None, REQUIRED) else f"{base} | None"


def keyword_parameters() -> list[inspect.Parameter]:
    """One keyword-only parameter per option, in declaration order, with its declared default
    (``None`` for a required one: its absence is refused with the modes explained)."""
    return [
        inspect.Parameter(
            opt.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=None if opt.required else opt.default,
            annotation=_annotation(opt),
        )
        for opt in OPTIONS
    ]


def with_load_options(func: F) -> F:
    """Decorator of a function that takes the load options in its ``**`` parameter: its
    signature (``__signature__``, what ``inspect``, ``help()`` and Airflow's ``default_args``
    read) names every option before that parameter, and the line :data:`DOC_MARKER` of its
    docstring, if it has one, becomes the options' ``:param:`` lines. Returns ``func`` itself
    (Airflow's operator metaclass wraps ``__init__`` after this ran, reading the signature)."""
    signature = inspect.signature(func)
    params = list(signature.parameters.values())
    at = next(i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD)
    func.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*params[:at], *keyword_parameters(), *params[at:]]
    )
    if func.__doc__:
        func.__doc__ = documented(func.__doc__, func.__qualname__)
    return func


def documented(doc: str, owner: str) -> str:
    """``doc`` with its line :data:`DOC_MARKER` replaced by the options' ``:param:`` lines, at
    that line's indentation (for a class, whose docstring documents ``__init__``)."""
    lines = doc.split("\n")
    for i, line in enumerate(lines):
        if line.strip() == DOC_MARKER:
            lines[i] = param_docstring(line[: len(line) - len(line.lstrip())])
            return "\n".join(lines)
    raise ValueError(f"{owner}: its docstring has no {DOC_MARKER!r} line")


def take(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Pop every load option out of ``kwargs`` (a ``**`` parameter), each with its declared
    default when not given (``None`` for a required one); the rest stays in ``kwargs``."""
    return {
        opt.name: kwargs.pop(opt.name, None if opt.required else opt.default) for opt in OPTIONS
    }


# --- the TypedDict for type checkers (generated) --------------------------------------------

TYPED_DICT_PATH = Path(__file__).with_name("option_types.py")


def typed_dict_source() -> str:
    """The text of :mod:`airflow_pg_bulk.option_types`: ``LoadOptions``, one key per option."""
    lines = [
        '"""The load options as a ``TypedDict``, for ``**options: Unpack[LoadOptions]``.',
        "",
        "Generated from :data:`airflow_pg_bulk.options.OPTIONS` by ``python -m",
        "airflow_pg_bulk.options``: do not edit (tests/unit/test_option_types.py checks that it is",
        'current)."""',
        "",
        "from __future__ import annotations",
        "",
        "from collections.abc import Sequence",
        "from typing import TypedDict",
        "",
        "",
        "class LoadOptions(TypedDict, total=False):",
        '    """Every load option by name; see :mod:`airflow_pg_bulk.options` for each."""',
        "",
    ]
    lines += [f"    {opt.name}: {_annotation(opt)}" for opt in OPTIONS]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    TYPED_DICT_PATH.write_text(typed_dict_source())
    print(f"wrote {TYPED_DICT_PATH}")
    print()
    print(markdown_table())
