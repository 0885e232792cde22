"""The one declaration of the load options (``airflow_pg_bulk.options``) and everything that
must agree with it: the request dataclasses, the signatures and ``:param:`` docstrings of
``PgBulkPrepareOperator``, ``pg_bulk_load`` and ``load()``, the CLI's flags and the README's
table. Any drift fails here. Also: no load without a mode, and the CLI's spellings."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import create_items, leftovers

from airflow_pg_bulk import cli, options, runner
from airflow_pg_bulk.options import MODES, OPTIONS, REQUIRED
from airflow_pg_bulk.plan import (
    LOAD_OPTIONS,
    CopyOptions,
    ErrorPolicy,
    LoadRequest,
    Settings,
    request_from_options,
)

README = Path(__file__).resolve().parent.parent / "README.md"
CLI = [os.path.join(os.path.dirname(sys.executable), "airflow-pg-bulk")]
GROUPS = {"copy": CopyOptions, "settings": Settings, "errors": ErrorPolicy}
# Parameters of the three entry points that are not load options.
NOT_OPTIONS = {
    "PgBulkPrepareOperator": {"self", "table", "source", "kwargs"},
    "pg_bulk_load": {
        "group_id",
        "table",
        "source",
        "postgres_conn_id",
        "pool",
        "max_parallel_copies",
        "copy_retries",
        "finalize_retries",
        "task_id",
        "operator_kwargs",
    },
    "load": {"conn", "table", "source", "jobs", "driver", "load_id", "objects"},
}


def _entry_points() -> dict[str, Callable[..., Any]]:
    from airflow_pg_bulk.operators.pg_bulk import PgBulkPrepareOperator
    from airflow_pg_bulk.task_group import pg_bulk_load

    return {
        "PgBulkPrepareOperator": PgBulkPrepareOperator.__init__,
        "pg_bulk_load": pg_bulk_load,
        "load": runner.load,
    }


def _docstring_of(name: str) -> str:
    if name == "PgBulkPrepareOperator":
        from airflow_pg_bulk.operators.pg_bulk import PgBulkPrepareOperator

        return PgBulkPrepareOperator.__doc__ or ""
    return _entry_points()[name].__doc__ or ""


def _params(doc: str) -> dict[str, str]:
    """``:param x: text`` sections of a docstring, whitespace normalized."""
    found = re.findall(r":param (\w+):(.*?)(?=\n\s*:param |\n\s*\n|\Z)", doc, re.S)
    return {name: " ".join(text.split()) for name, text in found}


# --- the declaration and the request -----------------------------------------------------


def test_declaration_groups_match_the_request_dataclasses():
    for group, cls in GROUPS.items():
        declared = {o.name: o.default for o in OPTIONS if o.group == group}
        fields = {f.name: f.default for f in dataclasses.fields(cls)}
        assert declared == fields, group
    request_fields = {f.name: f for f in dataclasses.fields(LoadRequest)}
    for opt in OPTIONS:
        if opt.group != "request":
            continue
        default = request_fields[opt.name].default
        assert (opt.default is REQUIRED) == (default == ""), opt.name
        if opt.default is not REQUIRED:
            assert default == opt.default, opt.name
    assert set(options.NAMES) - {"columns"} == LOAD_OPTIONS
    assert options.MODES == MODES
    assert options.BY_NAME["mode"].choices == MODES


def test_every_option_is_documented_in_one_line():
    for opt in OPTIONS:
        assert opt.doc and "\n" not in opt.doc and opt.default_doc, opt.name
        assert set(opt.modes) <= set(MODES) and opt.modes, opt.name
        assert opt.group in {*GROUPS, "request"}, opt.name


# --- the Python signatures and docstrings ------------------------------------------------


@pytest.mark.parametrize("name", sorted(NOT_OPTIONS))
def test_signature_has_every_option_keyword_only_with_its_default(name):
    signature = inspect.signature(_entry_points()[name])
    params = signature.parameters
    assert set(params) - NOT_OPTIONS[name] == set(options.NAMES)
    for opt in OPTIONS:
        param = params[opt.name]
        assert param.kind is inspect.Parameter.KEYWORD_ONLY, opt.name
        expected = None if opt.required else opt.default
        assert param.default == expected, opt.name
        if opt.type in (bool, int):
            assert opt.type.__name__ in str(param.annotation), opt.name


@pytest.mark.parametrize("name", sorted(NOT_OPTIONS))
def test_docstring_params_match_the_declaration(name):
    documented = _params(_docstring_of(name))
    for opt in OPTIONS:
        assert documented.get(opt.name) == options.param_doc(opt), (
            f"{name}: :param {opt.name}: differs from airflow_pg_bulk.options; "
            "paste the output of `python -m airflow_pg_bulk.options`"
        )
    undocumented = set(inspect.signature(_entry_points()[name]).parameters) - set(documented)
    assert undocumented <= {"self", "kwargs"}, undocumented


def test_templated_options_are_template_fields():
    from airflow_pg_bulk.operators.pg_bulk import PgBulkCleanupOperator, PgBulkPrepareOperator

    fields = PgBulkPrepareOperator.template_fields
    assert len(fields) == len(set(fields))
    # table, source and the connection id are templated too, but are not load options
    assert set(fields) == {"table", "source", "postgres_conn_id"} | {
        o.name for o in OPTIONS if o.templated
    }
    # every option a user would template: all of them but source_url (it may carry a
    # password, which a rendered template field would show; under Airflow: source_conn_id)
    assert options.templated_names() == tuple(n for n in options.NAMES if n != "source_url")
    assert "lock_timeout" in PgBulkCleanupOperator.template_fields  # cleanup takes it too


def test_operator_passes_every_option_through():
    from airflow_pg_bulk.operators.pg_bulk import PgBulkPrepareOperator

    op = PgBulkPrepareOperator(
        task_id="p",
        table="s.t",
        source="/x/*.csv",
        mode="append",
        format="text",
        delimiter="|",
        partition_size=1000,
        staging_logged=True,
        lock_timeout="5s",
        maintenance_work_mem="1GB",
        synchronous_commit="on",
        analyze=False,
        on_error="reject",
        max_rejects=3,
        reject_table="s.bad",
    )
    request = op.build_request()
    assert request.mode == "append" and request.partition_size == 1000
    assert request.copy.format == "text" and request.copy.delimiter == "|"
    assert request.staging_logged is True
    assert request.settings == Settings("5s", "1GB", "on", False)
    assert request.errors == ErrorPolicy("reject", 3, "s.bad")


def test_operator_passes_the_upsert_options_a_rendered_key_may_be_a_string():
    from airflow_pg_bulk.operators.pg_bulk import PgBulkPrepareOperator

    op = PgBulkPrepareOperator(
        task_id="p", table="s.t", source="/x.csv", mode="upsert", key=["meter", "day"],
        on_duplicate_key="fail",
    )  # fmt: skip
    request = op.build_request()
    assert (request.key, request.on_duplicate_key) == (("meter", "day"), "fail")
    op.key = "meter, day"  # what a template renders
    assert op.build_request().key == ("meter", "day")
    assert "key" in PgBulkPrepareOperator.template_fields


# --- rendered values: typed, checked in execute ---------------------------------------------


def _prepare(**given):
    from airflow_pg_bulk.operators.pg_bulk import PgBulkPrepareOperator

    return PgBulkPrepareOperator(
        task_id="p", **{"table": "s.t", "source": "/x.csv", "mode": "append", **given}
    )


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"header": "false"}, ("copy", "header", False)),
        ({"header": "True"}, ("copy", "header", True)),
        ({"header": ""}, ("copy", "header", False)),  # rendered empty: not given
        ({"analyze": "FALSE"}, ("settings", "analyze", False)),
        ({"staging_logged": "true"}, ("request", "staging_logged", True)),
        ({"partitions": " 3 "}, ("request", "partitions", 3)),
        ({"partitions": ""}, ("request", "partitions", None)),
        ({"partition_size": "1_000"}, ("request", "partition_size", 1000)),
        ({"max_rejects": "4", "on_error": "reject"}, ("errors", "max_rejects", 4)),
        ({"index_workers": "0"}, ("settings", "index_workers", 0)),
        ({"columns": "id,v"}, ("request", "columns", ("id", "v"))),
        ({"columns": " id , v ,"}, ("request", "columns", ("id", "v"))),
        ({"columns": "['id', 'v']"}, ("request", "columns", ("id", "v"))),  # a list, rendered
        ({"columns": ["id", "v"]}, ("request", "columns", ("id", "v"))),
        ({"columns": ""}, ("request", "columns", None)),
        ({"mode": "upsert", "key": "meter, day"}, ("request", "key", ("meter", "day"))),
        ({"delimiter": "\t"}, ("copy", "delimiter", "\t")),
    ],
)
def test_rendered_text_is_taken_as_the_declared_type(given, expected):
    group, name, value = expected
    request = _prepare(**given).build_request()
    where = request if group == "request" else getattr(request, group)
    assert getattr(where, name) == value


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"header": "yes"}, "header must be true or false, not 'yes' (str)"),
        ({"header": 1}, "header must be true or false, not 1 (int)"),
        ({"analyze": "0"}, "analyze must be true or false, not '0' (str)"),
        ({"partitions": "many"}, "partitions must be a whole number, not 'many' (str)"),
        ({"partitions": "2.5"}, "partitions must be a whole number, not '2.5' (str)"),
        ({"partitions": True}, "partitions must be a whole number, not True (bool)"),
        ({"partitions": "0"}, "partitions must be 1 or more, not 0"),
        ({"max_rejects": "-1"}, "max_rejects must be 0 or more, not -1"),
        ({"lock_timeout": 30}, "lock_timeout must be a text, not 30 (int)"),
        ({"format": "xml"}, "format must be one of 'csv', 'text', 'parquet', not 'xml' (str)"),
        ({"mode": "sideways"}, "mode must be one of 'replace', 'append', 'upsert', "),
        ({"columns": 7}, "columns must be a list of column names or one text of comma-sep"),
        ({"columns": ["id", 2]}, "columns must be a list of column names or one text of"),
        ({"columns": "['id'"}, "columns must be a list of column names"),
        ({"table": ""}, "table must name the target table, not an empty text"),
        ({"table": ["s.t"]}, "table must be a text, not ['s.t'] (list)"),
        ({"source": 5}, "source must be a path, glob or URL, or a list of them, not 5 (int)"),
    ],
)
def test_a_rendered_value_of_the_wrong_type_fails_in_execute_naming_it(given, message):
    from airflow.sdk.exceptions import AirflowFailException

    prepare = _prepare(**given)
    with pytest.raises(AirflowFailException) as failed:
        prepare.execute({})  # the check comes first: nothing connects
    assert str(failed.value).startswith(f"p: {message}"), str(failed.value)


def test_an_option_of_another_type_is_checked_as_that_type(monkeypatch):
    """An option declared later with a type of its own (a float here) is checked too."""
    ratio = options.LoadOption("ratio", float, 0.5, "a ratio", "`0.5`", "settings")
    monkeypatch.setitem(options.BY_NAME, "ratio", ratio)
    assert options.checked("ratio", " 0.25 ") == 0.25
    assert options.checked("ratio", 2.0) == 2.0
    with pytest.raises(TypeError, match=r"ratio must be a float, not 'half' \(str\)"):
        options.checked("ratio", "half")


def test_templates_render_into_checked_values():
    """Airflow renders every load option (Jinja renders text); the rendered text becomes the
    option's type in execute: ``columns="{{ params.columns }}"`` with ``"id,v"`` is two
    columns (it was the characters ``['i', 'd', ',', 'v']``)."""
    from airflow.sdk import DAG

    from airflow_pg_bulk.operators.pg_bulk import PgBulkPrepareOperator

    with DAG("options_templates", schedule=None):
        prepare = PgBulkPrepareOperator(
            task_id="p",
            **{
                name: "{{ params." + name + " }}"
                for name in ("table", "source", *options.templated_names())
            },
        )
    params = {
        "table": "s.t", "source": "/x.csv", "mode": "replace", "columns": "id,v",
        "format": "text", "header": False, "delimiter": "|", "null": "", "quote": '"',
        "escape": "", "encoding": "LATIN1", "partitions": 3, "partition_size": 1000,
        "key": "", "on_duplicate_key": "last", "strategy": "auto", "staging_logged": True,
        "lock_timeout": "5s", "maintenance_work_mem": "1GB", "index_workers": 2,
        "synchronous_commit": "on", "analyze": False, "on_error": "reject", "max_rejects": 9,
        "reject_table": "s.bad", "source_conn_id": "", "allow_older_run": True,
        "history_keep": 50, "abandoned_after": "2h", "source_url": None, "query": "",
        "source_table": "", "split_by": "", "create_target": False,
    }  # fmt: skip
    assert set(params) >= set(options.NAMES)
    prepare.render_template_fields({"params": params})
    assert prepare.columns == "id,v" and prepare.header == "False"  # what Jinja renders
    prepare.escape = None  # text format: no escape (an empty text is an escape of its own)
    request = prepare.build_request()
    assert (request.table, request.source, request.mode) == ("s.t", ("/x.csv",), "replace")
    assert request.columns == ("id", "v")
    assert request.copy == CopyOptions("text", False, "|", "", '"', None, "LATIN1")
    assert (request.partitions, request.partition_size, request.staging_logged) == (3, 1000, True)
    assert request.settings == Settings("5s", "1GB", "on", False, 2, True, 50, "2h")
    assert request.errors == ErrorPolicy("reject", 9, "s.bad")
    assert request.source_conn_id is None
    assert request.create_target is False


# --- no destructive default ----------------------------------------------------------------


def _assert_names_each_mode(message: str) -> None:
    assert "replace" in message and "append" in message
    assert "exactly the loaded rows" in message and "added" in message


def test_request_without_mode_is_refused_naming_each_mode():
    with pytest.raises(ValueError) as refused:
        request_from_options("s.t", "/x.csv")
    _assert_names_each_mode(str(refused.value))
    with pytest.raises(ValueError):
        LoadRequest(table="s.t", source=("/x.csv",))


def test_load_without_mode_stops_before_connecting():
    def factory() -> Any:
        raise AssertionError("load() connected without a mode")

    with pytest.raises(ValueError) as refused:
        runner.load(factory, "s.t", "/x.csv", header=True)
    _assert_names_each_mode(str(refused.value))


def test_operator_and_task_group_without_mode_fail_at_parse_time():
    from airflow_pg_bulk.operators.pg_bulk import PgBulkPrepareOperator
    from airflow_pg_bulk.task_group import pg_bulk_load

    with pytest.raises(ValueError) as refused:
        PgBulkPrepareOperator(task_id="p", table="s.t", source="/x.csv")
    _assert_names_each_mode(str(refused.value))
    from airflow.sdk import DAG

    with DAG("options_no_mode", schedule=None), pytest.raises(ValueError):
        pg_bulk_load(group_id="g", table="s.t", source="/x.csv")


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600)


def test_cli_load_without_mode_refuses_and_leaves_the_table_unchanged(db, tmp_path):
    create_items(db)
    db.run(f"INSERT INTO {db.schema}.items VALUES (-1, 'kept', 1, '2020-01-01', NULL)")
    before = db.checksum("items")
    path = tmp_path / "new.csv"
    path.write_text("1,a,1.0,2024-01-01,\n")

    done = _run_cli("load", "--conn", db.dsn, "--table", db.table("items"), "--source", str(path))

    assert done.returncode == 2
    assert "--mode replace" in done.stderr and "--mode append" in done.stderr
    _assert_names_each_mode(done.stderr)
    assert "Error" not in done.stderr and "Traceback" not in done.stderr
    assert db.checksum("items") == before
    assert leftovers(db) == []


# --- the command line ----------------------------------------------------------------------


def _load_parser() -> argparse.ArgumentParser:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["load"]


def test_cli_has_one_flag_per_option_and_no_stale_ones():
    actions = {a.dest: a for a in _load_parser()._actions}
    for opt in OPTIONS:
        action = actions.pop(opt.name)
        assert opt.flag in action.option_strings, opt.name
        assert action.default is None, opt.name  # not given: the declared default applies
        if opt.type is bool:
            assert action.option_strings == [opt.flag, opt.flag.replace("--", "--no-", 1)]
        if opt.choices:
            assert tuple(action.choices) == opt.choices, opt.name
    assert set(actions) == {
        "help", "quiet", "conn", "table", "source", "jobs", "driver", "json", "dry_run"
    }  # fmt: skip


def test_cli_help_shows_every_default():
    for action in _load_parser()._actions:
        if action.dest == "help":
            continue
        assert "default:" in action.help or "required" in action.help, action.dest
    for opt in OPTIONS:
        help_text = _load_parser()._option_string_actions[opt.flag].help
        shown = "none, must be given" if opt.required else opt.default_doc.replace("`", "")
        assert f"(default: {shown})" in help_text.replace("%%", "%"), opt.name


def _parse(*flags: str) -> argparse.Namespace:
    base = ["load", "--conn", "x", "--table", "t", "--source", "f"]
    return cli.build_parser().parse_args([*base, *flags])


@pytest.mark.parametrize("typed", ["\\t", "\\\\t", "\t", "tab"])
def test_cli_delimiter_spellings_of_tab(typed):
    assert _parse("--delimiter", typed).delimiter == "\t"
    assert _parse("--delimiter", "|").delimiter == "|"


def test_cli_flags_parse_to_option_values():
    args = _parse(
        "--mode", "append", "--no-staging-logged", "--no-analyze", "--partition-size", "1_000",
        "--maintenance-work-mem", "1GB", "--synchronous-commit", "on", "--columns", "a, b",
    )  # fmt: skip
    assert args.mode == "append" and args.staging_logged is False and args.analyze is False
    assert args.partition_size == 1000 and args.columns == ["a", "b"]
    assert args.maintenance_work_mem == "1GB" and args.synchronous_commit == "on"
    assert _parse("--staging-logged").staging_logged is True
    assert _parse().staging_logged is None and _parse().header is None


@pytest.mark.parametrize("where", ["before", "after"])
def test_cli_quiet_before_or_after_the_subcommand(where):
    base = ["load", "--conn", "x", "--table", "t", "--source", "f"]
    argv = ["-q", *base] if where == "before" else [*base, "-q"]
    assert cli.build_parser().parse_args(argv).quiet is True
    assert cli.build_parser().parse_args(base).quiet is False


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--max-rejects", "3"], "--max-rejects needs --on-error 'reject'"),
        (["--delimiter", "ab"], "--delimiter must be a single one-byte character"),
        (["--format", "text", "--quote", "'"], "--quote and --escape apply to --format 'csv'"),
    ],
)
def test_cli_option_errors_are_in_flag_words(flags, expected, capsys):
    argv = ["load", "--conn", "x", "--table", "t", "--source", "f", "--mode", "replace", *flags]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert expected in err and "ValueError" not in err


def test_cli_bad_number_is_a_clear_usage_error(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["load", "--conn", "x", "--table", "t", "--source", "f", "--partitions", "x"])
    assert exited.value.code == 2
    assert "--partitions: a whole number is needed, not 'x'" in capsys.readouterr().err


def test_cli_unexpected_errors_have_no_python_type_names():
    missing = FileNotFoundError(2, "No such file or directory", "/nope.csv")
    assert cli._describe(missing) == "No such file or directory: /nope.csv"
    assert cli._describe(RuntimeError("boom")) == "boom"
    assert "bug" in cli._describe(RuntimeError())


def test_cli_loads_a_tab_delimited_file_typed_as_backslash_t(db, tmp_path):
    create_items(db)
    path = tmp_path / "items.tsv"
    path.write_text("1\ta\t1.5\t2024-01-01\tx\n2\tb\t2.5\t2024-01-02\ty\n")

    done = _run_cli(
        "load", "--conn", db.dsn, "--table", db.table("items"), "--source", str(path),
        "--mode", "replace", "--delimiter", "\\t", "-q", "--json",
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert db.scalar(f"SELECT string_agg(name, ',' ORDER BY id) FROM {db.schema}.items") == "a,b"


# --- the README ---------------------------------------------------------------------------


def _readme_parameters_section() -> str:
    text = README.read_text()
    start = text.index("## Parameters")
    return text[start : text.index("\n## ", start + 1)]


def test_readme_table_is_the_declaration():
    section = _readme_parameters_section()
    header = "| parameter | default | modes | meaning |"
    assert header in section, "README's ## Parameters lost the options table"
    start = section.index(header)
    lines = []
    for line in section[start:].splitlines():
        if not line.startswith("|"):
            break
        lines.append(line)
    assert "\n".join(lines) == options.markdown_table(), (
        "README's options table differs from airflow_pg_bulk.options; "
        "paste the output of `python -m airflow_pg_bulk.options`"
    )


# --- group_id -------------------------------------------------------------------------------


def test_pg_bulk_load_takes_group_id_and_task_id_is_deprecated():
    from airflow.sdk import DAG

    from airflow_pg_bulk.task_group import pg_bulk_load

    with DAG("options_group_id", schedule=None):
        group = pg_bulk_load(group_id="load_it", table="s.t", source="/x.csv", mode="replace")
        assert group.group_id == "load_it"
        with pytest.warns(DeprecationWarning, match="group_id"):
            old = pg_bulk_load(task_id="old_name", table="s.t", source="/x.csv", mode="append")
        assert old.group_id == "old_name"
    with pytest.raises(TypeError, match="group_id"):
        pg_bulk_load(table="s.t", source="/x.csv", mode="replace")
