"""airflow_pg_bulk.sql: statements rendered without a connection (``as_string(None)``)."""

from __future__ import annotations

import pytest

from airflow_pg_bulk import sql
from airflow_pg_bulk.plan import CopyOptions
from airflow_pg_bulk.plan.codes import ConstraintKind, TriggerState


def text(statement: sql.Composable) -> str:
    return statement.as_string(None)


def test_identifiers_and_values_are_quoted() -> None:
    assert text(sql.drop_table('we"ird', "x.y", if_exists=True)) == (
        'DROP TABLE IF EXISTS "we""ird"."x.y"'
    )
    assert text(sql.set_config("lock_timeout", "1s'; --", local=True)) == (
        "SELECT set_config('lock_timeout', '1s''; --', true)"
    )


def test_copy_from_stdin_options() -> None:
    opts = CopyOptions(format="csv", null="", encoding="LATIN1")
    assert text(sql.copy_from_stdin("s", "stage", ["a", "B"], opts)) == (
        'COPY "s"."stage" ("a", "B") FROM STDIN WITH (FORMAT csv, DELIMITER \',\', '
        "ENCODING 'LATIN1', NULL '', QUOTE '\"', ESCAPE '\"')"
    )
    skipping = text(
        sql.copy_from_stdin("s", "t", ["a"], CopyOptions(format="text"), skip_bad_values=True,
                            reject_limit=3)
    )  # fmt: skip
    assert skipping.endswith("ON_ERROR ignore, LOG_VERBOSITY verbose, REJECT_LIMIT 3)")
    assert "QUOTE" not in skipping


@pytest.mark.parametrize(
    ("kind", "keyword"), [(ConstraintKind.PRIMARY_KEY, "PRIMARY KEY"), ("u", "UNIQUE")]
)
def test_keys_are_added_from_their_index(kind: str, keyword: str) -> None:
    statement = sql.add_key_using_index(
        "s", "stage", "k", kind=kind, index="i", deferrable=True, deferred=False
    )
    assert text(statement) == (
        f'ALTER TABLE "s"."stage" ADD CONSTRAINT "k" {keyword} USING INDEX "i" DEFERRABLE'
    )


@pytest.mark.parametrize(
    ("state", "words"),
    [(TriggerState.DISABLED, "DISABLE"), ("R", "ENABLE REPLICA"), ("A", "ENABLE ALWAYS")],
)
def test_trigger_states(state: str, words: str) -> None:
    assert text(sql.set_trigger_state("s", "t", "g", state)) == (
        f'ALTER TABLE "s"."t" {words} TRIGGER "g"'
    )


def test_an_index_keeps_the_servers_text_after_using() -> None:
    statement = sql.create_index("s", "stage", "i0", unique=True, tail="btree (lower(name))")
    assert text(statement) == 'CREATE UNIQUE INDEX "i0" ON "s"."stage" USING btree (lower(name))'


def test_the_ledger_statements_take_literals() -> None:
    assert "VALUES (3" in text(sql.claim_partition("s", "l", 3)).replace("\n", " ")


def test_replay_queries_compose_names_and_operators() -> None:
    pair = sql.replay_conflicting_pair(["sp an"], [("pg_catalog", "&&")], after=7, same=["id"])
    assert text(pair) == (
        'SELECT a."pgbulk_row", b."pgbulk_row" FROM "pg_temp"."pgbulk_replay" a JOIN'
        ' "pg_temp"."pgbulk_replay" b ON a."pgbulk_row" < b."pgbulk_row" AND'
        ' "a"."sp an" OPERATOR("pg_catalog".&&) "b"."sp an" AND ("a"."id") IS DISTINCT FROM'
        ' ("b"."id") WHERE b."pgbulk_row" > 7 ORDER BY b."pgbulk_row", a."pgbulk_row" LIMIT 1'
    )
    found = sql.replay_failing(sql.unreferenced(["p"], "s", "parents", ["id"]), after=0)
    assert text(found) == (
        'SELECT r."pgbulk_row" FROM "pg_temp"."pgbulk_replay" r WHERE r."pgbulk_row" > 0 AND'
        ' (r."p" IS NOT NULL AND NOT EXISTS (SELECT 1 FROM "s"."parents" p WHERE'
        ' p."id" = r."p")) ORDER BY r."pgbulk_row" LIMIT 1'
    )
    with pytest.raises(ValueError, match="operator"):
        sql.replay_conflicting_pair(["a"], [("s", "&&); DROP TABLE x; --")], after=0)
