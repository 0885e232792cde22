"""Tables for the console and RESULTS.md, the targets, and the choices the figures support."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import statistics
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

NOISE = 0.10  # differences under 10% are not called (same-run noise here is 10-30%)


# --- lookups ---------------------------------------------------------------------------------


def records(bench: Any, workload: str, key: str, group: str | None = None) -> list[Any]:
    """The successful records of one method."""
    return [
        r
        for r in bench.records
        if r.workload == workload
        and r.key == key
        and r.ok
        and r.seconds
        and (group is None or r.group == group)
    ]


def median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def med_seconds(bench: Any, workload: str, key: str, group: str | None = None) -> float | None:
    return median(r.seconds for r in records(bench, workload, key, group))


def rep_ratio(
    bench: Any,
    workload: str,
    key: str,
    base: str,
    group: str = "methods",
    base_group: str | None = None,
) -> tuple[float | None, int]:
    """Median over repetitions of seconds(key) / seconds(base) in the same repetition; when
    they never ran in the same repetition, the ratio of their medians. Returns (ratio, n)."""
    a = {r.rep: r.seconds for r in records(bench, workload, key, group)}
    b = {r.rep: r.seconds for r in records(bench, workload, base, base_group or group)}
    both = sorted(set(a) & set(b))
    if (base_group in (None, group)) and both and len(a) > 1:
        return statistics.median(a[n] / b[n] for n in both), len(both)
    ma, mb = median(a.values()), median(b.values())
    if ma is None or mb is None:
        return None, 0
    return ma / mb, 1


def phase(rec_list: list[Any], name: str) -> float | None:
    return median(r.phases.get(name) for r in rec_list if name in r.phases)


def kind(rec_list: list[Any], name: str) -> float | None:
    return median(r.statement_kinds.get(name, 0.0) for r in rec_list) if rec_list else None


def fmt(value: float | None, digits: int = 2, suffix: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}{suffix}"


def mb(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e6:,.1f}"


def rss(value: float | None) -> str:
    return "-" if value is None else f"{value / 1024:,.1f}"


# --- method tables ---------------------------------------------------------------------------


def method_rows(
    bench: Any, ds: Any, groups: tuple[str, ...] = ("methods",)
) -> list[dict[str, Any]]:
    """One row per method: medians, and ratios to naive and floor."""
    naive = med_seconds(bench, ds.key, "copy_indexed", "methods")
    floor = med_seconds(bench, ds.key, "copy_unlogged", "methods")
    keys: list[str] = []
    for r in bench.records:
        if r.workload == ds.key and r.group in groups and r.key not in keys:
            keys.append(r.key)
    out = []
    for key in keys:
        all_recs = [
            r for r in bench.records if r.workload == ds.key and r.key == key and r.group in groups
        ]
        ok = [r for r in all_recs if r.ok and r.seconds]
        first = all_recs[0]
        row: dict[str, Any] = {
            "key": key,
            "label": first.label,
            "n": len(ok),
            "error": next((r.error for r in all_recs if r.error), None),
            "rows": first.rows,
            "expected": first.expected,
            "note": first.note,
        }
        if ok:
            secs = median(r.seconds for r in ok)
            extra = median(r.extrapolated_seconds for r in ok)
            basis = extra or secs
            row.update(
                seconds=secs,
                extrapolated=extra,
                rows_per_s=median(r.rows / r.seconds for r in ok),
                # a capped load read only its share of the files
                mb_per_s=median(
                    r.source_bytes
                    / 1e6
                    * (r.rows / ds.rows if r.extrapolated_seconds else 1)
                    / r.seconds
                    for r in ok
                ),
                vs_naive=(
                    rep_ratio(bench, ds.key, "copy_indexed", key)[0]
                    if key in ("copy_unlogged", "pipeline_replace_p2", "copy_indexed")
                    else (naive / basis if naive and basis else None)
                ),
                vs_floor=(
                    rep_ratio(bench, ds.key, key, "copy_unlogged")[0]
                    if key in ("copy_indexed", "pipeline_replace_p2", "copy_unlogged")
                    else (basis / floor if floor and basis else None)
                ),
                wal=median(r.wal_bytes for r in ok),
                rss=median(r.peak_rss_kb for r in ok),
                client_cpu=median(r.client_cpu for r in ok),
                server_cpu=median(r.server_cpu for r in ok),
                other_cpu=median(r.other_cpu for r in ok),
                table=median(r.table_bytes for r in ok),
                index=median(r.index_bytes for r in ok),
                spread=(min(r.seconds for r in ok), max(r.seconds for r in ok)),
            )
        out.append(row)
    return out


def console_table(bench: Any, ds: Any) -> str:
    lines = [
        f"\n{ds.title}: {ds.rows:,} rows, {ds.bytes / 1e6:,.1f} MB of CSV",
        f"  {'method':<36} {'rows':>11} {'seconds':>9} {'rows/s':>11} {'MB/s':>7} "
        f"{'x naive':>8} {'/ floor':>8}",
    ]
    for row in method_rows(bench, ds, ("methods", "peers", "airflow")):
        if "seconds" not in row:
            lines.append(f"  {row['key']:<36} FAILED: {str(row['error'])[:200]}")
            continue
        secs = row["extrapolated"] or row["seconds"]
        mark = "*" if row["extrapolated"] else " "
        lines.append(
            f"  {row['key']:<36} {row['rows']:>11,} {secs:>8.2f}{mark} {row['rows_per_s']:>11,.0f}"
            f" {row['mb_per_s']:>7.1f} {fmt(row['vs_naive']):>8} {fmt(row['vs_floor']):>8}"
        )
    lines.append("  * extrapolated from a capped subset (rows/s measured on the subset)")
    return "\n".join(lines)


def md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def methods_md(bench: Any, ds: Any) -> str:
    rows = []
    for row in method_rows(bench, ds, ("methods", "peers", "airflow")):
        if "seconds" not in row:
            rows.append(
                [
                    f"`{row['key']}` {row['label']}",
                    "FAILED",
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    str(row["error"])[:400].replace("|", "/"),
                ]
            )
            continue
        secs = f"{row['seconds']:.2f}"
        if row["n"] > 1:
            lo, hi = row["spread"]
            secs += f" (n={row['n']}, {lo:.2f}-{hi:.2f})"
        rows_cell = f"{row['rows']:,}"
        note = row["note"]
        if row["extrapolated"]:
            rows_cell += f" of {ds.rows:,}"
            note = (
                f"capped: **{row['extrapolated']:.1f} s extrapolated** to all rows at the "
                "measured rows/s; ratios use the extrapolation. " + note
            )
        rows.append(
            [
                f"`{row['key']}` {row['label']}",
                rows_cell,
                secs,
                f"{row['rows_per_s']:,.0f}",
                f"{row['mb_per_s']:.1f}",
                fmt(row["vs_naive"]),
                fmt(row["vs_floor"]),
                mb(row["wal"]),
                rss(row["rss"]),
                fmt(row["client_cpu"], 1),
                fmt(row["server_cpu"], 1),
                fmt(row["other_cpu"], 1),
                mb(row["table"]),
                mb(row["index"]),
                note,
            ]
        )
    return md_table(
        [
            "method",
            "rows",
            "seconds",
            "rows/s",
            "MB/s",
            "speed-up vs naive",
            "/ floor",
            "WAL MB",
            "client peak RSS MB",
            "client CPU s",
            "server CPU s",
            "other CPU s (noise)",
            "table MB",
            "index MB",
            "note",
        ],
        rows,
    )


PHASES = [
    "prepare",
    "copy",
    "check",
    "set_logged",
    "indexes",
    "constraints",
    "insert",
    "analyze",
    "swap",
]
KINDS = [
    "create index",
    "add PK/unique using index",
    "add constraint NOT VALID",
    "validate constraint",
    "set logged",
    "insert from staging",
    "analyze",
]


def phases_md(
    bench: Any, ds: Any, groups: tuple[str, ...] = ("methods", "tuning", "memory")
) -> str:
    keys: list[str] = []
    for r in bench.records:
        if r.workload == ds.key and r.group in groups and r.phases and r.key not in keys:
            keys.append(r.key)
    rows = []
    for key in keys:
        recs = [r for r in records(bench, ds.key, key) if r.group in groups and r.phases]
        if not recs:
            continue
        total = median(r.seconds for r in recs)
        known = median(sum(r.phases.values()) for r in recs)
        rows.append(
            [f"`{key}`", str(len(recs)), fmt(total)]
            + [fmt(phase(recs, p)) for p in PHASES]
            + [fmt(total - known if total and known else None)]
            + [fmt(kind(recs, "validate constraint")), mb(median(r.wal_bytes for r in recs))]
        )
    return md_table(
        ["load", "n", "total s", *PHASES, "cleanup+connect", "of which VALIDATE", "WAL MB"], rows
    )


# --- choices ---------------------------------------------------------------------------------


def _verdict(ratio: float | None, better: str, worse: str, same: str) -> str:
    if ratio is None:
        return "not measured"
    if ratio < 1 - NOISE:
        return better
    if ratio > 1 + NOISE:
        return worse
    return same


def tuning_md(bench: Any, ds: Any) -> str:
    w = ds.key
    parts = []

    aw = bench.append_tuning or w

    def row(key: str, label: str, base: str = "tune_default") -> list[str]:
        on = aw if key.startswith("tune_append") else w
        recs = records(bench, on, key, "tuning")
        ratio, n = rep_ratio(bench, on, key, base, "tuning")
        return [
            label,
            fmt(median(r.seconds for r in recs)),
            fmt(phase(recs, "copy")),
            fmt(phase(recs, "set_logged")),
            fmt(phase(recs, "indexes")),
            fmt(phase(recs, "insert")),
            mb(median(r.wal_bytes for r in recs)),
            fmt(ratio) + (f" (n={n})" if n else ""),
        ]

    header = [
        "variant",
        "total s",
        "copy s",
        "set_logged s",
        "indexes s",
        "insert s",
        "WAL MB",
        "/ baseline, same repetition",
    ]
    # staging
    wal_u = mb(median(r.wal_bytes for r in records(bench, aw, "tune_append_default", "tuning")))
    wal_l = mb(median(r.wal_bytes for r in records(bench, aw, "tune_append_logged", "tuning")))
    r_unlogged = rep_ratio(bench, w, "tune_replace_unlogged", "tune_default", "tuning")[0]
    r_append = rep_ratio(bench, aw, "tune_append_logged", "tune_append_default", "tuning")[0]
    parts.append("### Staging table: logged or unlogged\n")
    parts.append(
        md_table(
            header,
            [
                row("tune_default", "replace, logged staging (default)"),
                row("tune_replace_unlogged", "replace, unlogged staging + SET LOGGED"),
                row(
                    "tune_append_default",
                    "append, unlogged staging (default)",
                    "tune_append_default",
                ),
                row("tune_append_logged", "append, logged staging", "tune_append_default"),
            ],
        )
    )
    parts.append(
        "\n- **replace**: "
        + _verdict(
            r_unlogged,
            f"unlogged staging is faster ({fmt(r_unlogged)}x the time): make it the default",
            f"keep **logged** staging: unlogged + SET LOGGED takes {fmt(r_unlogged)}x "
            "the time (SET LOGGED rewrites the heap into WAL in one serial pass)",
            f"no resolvable difference ({fmt(r_unlogged)}x); keep **logged** staging "
            "(no SET LOGGED rewrite, survives a crash)",
        )
        + "\n- **append**: "
        + _verdict(
            r_append,
            f"logged staging is faster ({fmt(r_append)}x): make it the default",
            f"keep **unlogged** staging: logged staging takes {fmt(r_append)}x the time "
            "(its rows are written to WAL twice: into staging and into the target)",
            f"no resolvable difference ({fmt(r_append)}x); keep **unlogged**: less WAL "
            f"({wal_u} MB vs {wal_l} MB: the rows are logged once, by the INSERT into the "
            "target, not also by the COPY into staging)",
        )
    )
    # maintenance_work_mem
    m64 = rep_ratio(bench, w, "tune_mwm_64MB", "tune_default", "tuning")[0]
    m1g = rep_ratio(bench, w, "tune_mwm_1GB", "tune_default", "tuning")[0]
    parts.append("\n### Index builds: maintenance_work_mem (sequential builds, as the code does)\n")
    parts.append(
        md_table(
            header,
            [
                row("tune_mwm_64MB", "64MB"),
                row("tune_default", "512MB (default)"),
                row("tune_mwm_1GB", "1GB"),
            ],
        )
    )
    idx = {
        k: phase(records(bench, w, k, "tuning"), "indexes")
        for k in ("tune_mwm_64MB", "tune_default", "tune_mwm_1GB")
    }
    parts.append(
        f"\n- index phase: 64MB {fmt(idx['tune_mwm_64MB'])} s, 512MB {fmt(idx['tune_default'])} s,"
        f" 1GB {fmt(idx['tune_mwm_1GB'])} s. "
        + _verdict(
            m1g,
            f"1GB is faster end to end ({fmt(m1g)}x): raise the default to 1GB",
            f"1GB is slower ({fmt(m1g)}x): keep 512MB",
            f"1GB vs 512MB: {fmt(m1g)}x, not resolvable: keep **512MB**",
        )
        + " "
        + _verdict(
            m64,
            f"64MB is faster ({fmt(m64)}x) than 512MB: lower the default",
            f"64MB (the server default) takes {fmt(m64)}x the time of 512MB: keep "
            "setting it in the session",
            f"64MB vs 512MB: {fmt(m64)}x, not resolvable at this size (the index fits "
            "in a few sort runs either way); 512MB stays, it costs nothing while unused",
        )
    )
    # chunks
    c64 = rep_ratio(bench, w, "tune_chunk_64KiB", "tune_default", "tuning")[0]
    c4m = rep_ratio(bench, w, "tune_chunk_4MiB", "tune_default", "tuning")[0]
    parts.append("\n### COPY buffer (`reading.READ_CHUNK` / `driver.COPY_BUFFER`)\n")
    parts.append(
        md_table(
            header,
            [
                row("tune_chunk_64KiB", "64 KiB"),
                row("tune_default", "1 MiB (default)"),
                row("tune_chunk_4MiB", "4 MiB"),
            ],
        )
    )
    parts.append(
        "\n- 64 KiB: "
        + _verdict(
            c64,
            f"faster ({fmt(c64)}x)",
            f"slower ({fmt(c64)}x)",
            f"{fmt(c64)}x, no resolvable difference",
        )
        + "; 4 MiB: "
        + _verdict(
            c4m,
            f"faster ({fmt(c4m)}x)",
            f"slower ({fmt(c4m)}x)",
            f"{fmt(c4m)}x, no resolvable difference",
        )
        + ". (`driver.COPY_BUFFER` is read by the psycopg2 path only.)"
        " Keep **1 MiB** unless a variant is resolvably faster: the server parses the "
        "rows, the client only passes bytes through, and the buffer bounds the client's "
        "memory (one per COPY connection)."
    )
    # synchronous_commit
    sc = rep_ratio(bench, w, "tune_sync_on", "tune_default", "tuning")[0]
    parts.append("\n### synchronous_commit in the COPY sessions\n")
    parts.append(
        md_table(header, [row("tune_default", "off (default)"), row("tune_sync_on", "on")])
    )
    parts.append(
        "\n- on vs off: "
        + _verdict(
            sc,
            f"on is faster ({fmt(sc)}x)?! keep off only for its documented reason",
            f"on takes {fmt(sc)}x the time: keep **off**",
            f"{fmt(sc)}x: not resolvable; each COPY session commits once, so the flush it "
            "waits for is one WAL flush per partition. Keeping **off** is harmless (the ledger "
            "check catches a lost partition) but buys little; `on` would be an equally good "
            "default",
        )
    )
    # partitions
    parts.append("\n### Partition count (replace)\n")
    prow = []
    base = med_seconds(bench, w, "pipeline_replace_p2")
    for key, label, group in [
        ("pipeline_replace_p1", "1", "methods"),
        ("pipeline_replace_p2", "2", "methods"),
        ("pipeline_replace_p4", "4", "methods"),
        ("tune_p8", "8 (4 connections)", "tuning"),
        ("tune_p_auto", "not given (one per 64 MB of input, <=16; connections <=4)", "tuning"),
    ]:
        recs = records(bench, w, key, group)
        secs = median(r.seconds for r in recs)
        prow.append(
            [
                label,
                str(len(recs)),
                fmt(secs),
                fmt(phase(recs, "copy")),
                fmt(median(r.server_cpu for r in recs), 1),
                fmt(median(r.client_cpu for r in recs), 1),
                str(median(r.extra.get("partitions") for r in recs) or "-"),
                fmt(secs / base if secs and base else None),
            ]
        )
    parts.append(
        md_table(
            [
                "partitions",
                "n",
                "total s",
                "copy phase s",
                "server CPU s",
                "client CPU s",
                "partitions made",
                "/ 2 partitions (medians)",
            ],
            prow,
        )
    )
    copies = {
        k: phase(records(bench, w, k), "copy")
        for k in ("pipeline_replace_p1", "pipeline_replace_p2", "pipeline_replace_p4")
    }
    c1, c2 = copies["pipeline_replace_p1"], copies["pipeline_replace_p2"]
    speed = c1 / c2 if c1 and c2 else None
    parts.append(
        f"\n- COPY phase, 1 -> 2 partitions: {fmt(speed)}x faster. On {os.cpu_count()} cores the "
        "server's COPY backends and the client share the CPUs, so more partitions than cores "
        "cannot help. Recommended default for this machine: **2 partitions** (= cores); in "
        "general `min(cores of the database server, 4)`; the current default (one per 64 MB) "
        "gives 3 for workload A."
    )
    # FK validation
    ours = records(bench, w, "pipeline_replace_p2", "methods")
    validate = kind(ours, "validate constraint")
    total = median(r.seconds for r in ours)
    parts.append("\n### Foreign-key validation\n")
    parts.append(
        f"- VALIDATE CONSTRAINT on the staged table: **{fmt(validate)} s** of "
        f"{fmt(total)} s ({fmt(100 * validate / total if validate and total else None, 0)}%) "
        "in `pipeline_replace_p2` (statement timings in the finalize step). Skipping it would "
        "save at most that, and leave a NOT VALID FK on the target (the planner cannot use it, "
        "and bad rows would go unnoticed). Keep validating by default; an opt-out "
        "(`validate_foreign_keys=False`) is worth it only when the share is large."
    )
    parts.append(
        "\n### Binary COPY\n\n- Not implemented in the package (`CopyOptions.format` is csv or "
        "text): not measured. The input here is CSV files, which the client streams without "
        "parsing; binary COPY pays off only when rows start as Python objects (see "
        "airflow-3.3-facts §5: 1.5x from tuples)."
    )
    ours = records(bench, w, "pipeline_replace_p2", "methods")
    copies = {
        n: phase(records(bench, w, f"pipeline_replace_p{n}", "methods"), "copy") for n in (1, 2)
    }
    speedup = copies[1] / copies[2] if copies[1] and copies[2] else None
    auto = median(r.extra.get("partitions") for r in records(bench, w, "tune_p_auto"))
    auto_parts = "-" if auto is None else f"{auto:.0f}"
    summary = [
        [
            "staging, replace",
            "logged",
            "**" + _verdict(r_unlogged, "unlogged", "logged", "logged") + "**",
            f"unlogged + SET LOGGED: {fmt(r_unlogged)}x the time",
        ],
        [
            "staging, append",
            "unlogged",
            "**" + _verdict(r_append, "logged", "unlogged", "unlogged") + "**",
            f"logged: {fmt(r_append)}x the time, {wal_l} vs {wal_u} MB WAL (workload {aw})",
        ],
        [
            "maintenance_work_mem",
            "512MB",
            "**"
            + ("1GB" if (m1g or 1) < 1 - NOISE else "64MB" if (m64 or 1) < 1 - NOISE else "512MB")
            + "**",
            f"64MB {fmt(m64)}x, 1GB {fmt(m1g)}x the time of 512MB",
        ],
        [
            "COPY buffer",
            "1 MiB",
            "**"
            + (
                "64 KiB"
                if (c64 or 1) < 1 - NOISE
                else "4 MiB"
                if (c4m or 1) < 1 - NOISE
                else "1 MiB"
            )
            + "**",
            f"64 KiB {fmt(c64)}x, 4 MiB {fmt(c4m)}x; client peak RSS grows with it",
        ],
        [
            "synchronous_commit (COPY sessions)",
            "off",
            _verdict(sc, "**on**", "**off**", "**off** (no resolvable difference)"),
            f"on: {fmt(sc)}x",
        ],
        [
            "partitions",
            f"one per 64 MB ({auto_parts} here)",
            f"**min(server cores, 4)**; {os.cpu_count()} here",
            f"COPY phase 1 -> 2 partitions {fmt(speedup)}x faster; 4 and 8 no better on 2 cores",
        ],
        [
            "FK validation",
            "validate",
            "**validate**",
            f"VALIDATE {fmt(kind(ours, 'validate constraint'))} s of "
            f"{fmt(median(r.seconds for r in ours))} s",
        ],
        ["binary COPY", "not implemented", "-", "not measured"],
    ]
    parts.insert(
        0,
        md_table(
            ["setting", "default now", "recommended", "figure (same-repetition ratios)"], summary
        )
        + "\n",
    )
    return "\n".join(parts)


# --- targets ---------------------------------------------------------------------------------


def targets(bench: Any) -> list[list[str]]:
    w = "A"
    out = []
    r_floor, n1 = rep_ratio(bench, w, "pipeline_replace_p2", "copy_unlogged")
    r_naive, n2 = rep_ratio(bench, w, "copy_indexed", "pipeline_replace_p2")
    ours = med_seconds(bench, w, "pipeline_replace_p2", "methods")
    recs = records(bench, w, "pipeline_replace_p2", "methods")

    def status(ok: bool | None, text_missed: str) -> str:
        if ok is None:
            return "not measured"
        return "**met**" if ok else f"**missed**: {text_missed}"

    floor = med_seconds(bench, w, "copy_unlogged", "methods")
    naive = med_seconds(bench, w, "copy_indexed", "methods")
    if r_floor is not None:
        over = r_floor / 1.2
        extra = ""
        if recs and floor:
            copy = phase(recs, "copy") or 0.0
            serial = sum(
                phase(recs, p) or 0.0
                for p in ("prepare", "check", "indexes", "constraints", "analyze", "swap")
            )
            idx = [r.phases.get("indexes", 0.0) for r in recs]
            extra = (
                f". Why: the floor is one unlogged COPY ({fmt(floor)} s, no WAL, no index); the "
                f"pipeline's parallel COPY into logged staging takes {fmt(copy)} s "
                f"({mb(median(r.wal_bytes for r in recs))} MB of WAL), then finalize runs "
                f"serially for {fmt(serial)} s = {fmt(serial / floor)}x the floor on its own: "
                f"PK build {fmt(phase(recs, 'indexes'))} s (ranged {fmt(min(idx))}-"
                f"{fmt(max(idx))} s over the runs), FK validation "
                f"{fmt(kind(recs, 'validate constraint'))} s, ANALYZE "
                f"{fmt(phase(recs, 'analyze'))} s. Within 1.2x the floor "
                f"({fmt(1.2 * floor)} s) the COPY would have to be as fast as the unlogged one "
                "and finalize nearly free; on 2 cores that leaves no room"
            )
        out.append(
            [
                "replace, 2 partitions <= 1.2x the unlogged no-index floor",
                f"{fmt(r_floor)}x (median of {n1} same-repetition ratios)",
                status(
                    r_floor <= 1.2,
                    f"{fmt(over)}x the allowance ({fmt(r_floor)}x instead of <= 1.2x){extra}",
                ),
            ]
        )
    if r_naive is not None:
        why = ""
        if naive and floor:
            why = (
                f". Why: the naive COPY takes {fmt(naive)} s here and even the floor is only "
                f"{fmt(naive / floor)}x faster than it, so 7x ({fmt(naive / 7)} s) means "
                f"<= {fmt(naive / 7 / floor)}x the floor: the same wall as the target above"
            )
        out.append(
            [
                "replace, 2 partitions >= 7x faster than one COPY into the indexed target",
                f"{fmt(r_naive)}x (median of {n2})",
                status(r_naive >= 7, f"{fmt(r_naive / 7)} of the 7x goal{why}"),
            ]
        )
    for other in ("B", "C"):
        r_other, _ = rep_ratio(bench, other, "pipeline_replace_p2", "copy_unlogged")
        n_other, _ = rep_ratio(bench, other, "copy_indexed", "pipeline_replace_p2")
        if r_other is not None and n_other is not None:
            out.append(
                [
                    f"(context, workload {other}, not a target) replace, 2 partitions",
                    f"{fmt(r_other)}x the floor; {fmt(n_other)}x faster than naive",
                    "-",
                ]
            )
    pgl = [med_seconds(bench, w, c.key) for c in _pgloader_configs()]
    pgl = [p for p in pgl if p]
    if pgl and ours:
        best = min(pgl)
        ratio = best / ours
        out.append(
            [
                ">= 5x faster than pgloader's best",
                f"{fmt(ratio)}x ({fmt(best)} s vs {fmt(ours)} s)",
                status(ratio >= 5, f"{fmt(ratio / 5)} of the 5x goal"),
            ]
        )
    else:
        out.append(
            [
                ">= 5x faster than pgloader's best",
                "-",
                "not measured (pgloader did not run or failed; see Peers)",
            ]
        )
    dag_runs = records(bench, w, "airflow_dag_p4", "airflow")
    p4 = med_seconds(bench, w, "pipeline_replace_p4", "methods")
    if dag_runs and p4:
        dag_wall = median(r.seconds for r in dag_runs)
        over = dag_wall - p4
        out.append(
            [
                "DAG run overhead (DAG - in-process) <= 15 s, 4 partitions",
                f"{fmt(over)} s ({fmt(dag_wall)} s DAG, median of {len(dag_runs)}, vs "
                f"{fmt(p4)} s in-process)",
                status(over <= 15, f"by {fmt(over - 15)} s; see the Airflow breakdown"),
            ]
        )
    else:
        out.append(["DAG run overhead <= 15 s, 4 partitions", "-", "not measured"])
    small = records(bench, w, "memory_small", "memory")
    if small and recs:
        big_rss = median(r.peak_rss_kb for r in recs)
        small_rss = median(r.peak_rss_kb for r in small)
        ratio = big_rss / small_rss
        out.append(
            [
                f"client peak RSS at {recs[0].rows:,} rows within 20% of {small[0].rows:,}",
                f"{rss(big_rss)} MB vs {rss(small_rss)} MB ({fmt(ratio)}x)",
                status(abs(ratio - 1) <= 0.2, f"by {fmt(100 * (abs(ratio - 1) - 0.2), 0)} points"),
            ]
        )
    return out


def _pgloader_configs() -> list[Any]:
    from benchmarks.peers import PGLOADER_CONFIGS

    return PGLOADER_CONFIGS


# --- Airflow ---------------------------------------------------------------------------------


def airflow_md(bench: Any) -> str:
    if not bench.airflow:
        return "Not run (`--skip-airflow`)."
    parts = []
    p4 = records(bench, "A", "pipeline_replace_p4", "methods")
    parts.append(
        "Trigger -> success of each run, broken down from the task instances' start and end "
        "times and what the tasks returned through XCom (COPY seconds per partition, "
        "finalize's phases). The target compares the median run with the in-process load of "
        "the same 4 partitions; a first run after start-up is usually slower (cold task "
        "processes). Airflow's start-up is not in any run's time.\n"
    )
    for key, out in bench.airflow.items():
        if "error" in out:
            parts.append(f"**{key} failed**: `{out['error'][:1500]}`")
            continue
        parts.append(
            f"**{key}**: Airflow up (api-server + scheduler healthy) in "
            f"{fmt(out.get('ready_seconds'), 1)} s; DAG parsed after "
            f"{fmt(out.get('dag_listed_seconds'), 1)} s; {len(out['runs'])} runs, whole "
            f"Airflow session {fmt(out.get('total_seconds'), 1)} s (start-up is not counted in "
            "a run's time)."
        )
        inproc = median(r.seconds for r in p4)
        for run in out["runs"]:
            if "parts" not in run:
                parts.append(f"\nRun {run['run']}: {run.get('state')} {run.get('error', '')}")
                continue
            rows = [[name, fmt(secs)] for name, secs in run["parts"]]
            rows.append(["**trigger -> success**", f"**{fmt(run['wall'])}**"])
            rows.append(
                ["(trigger -> finalize done: the new rows are visible)", fmt(run.get("visible"))]
            )
            parts.append(
                f"\nRun {run['run']} (in-process, 4 partitions: {fmt(inproc)} s; "
                f"overhead {fmt(run['wall'] - inproc if inproc else None)} s):\n"
            )
            parts.append(md_table(["segment", "seconds"], rows))
            work = run["copy_work"]
            parts.append(
                f"\n- COPY tasks: durations {', '.join(fmt(d) for d in run['copy_task_durations'])}"
                f" s, of which COPY work {', '.join(fmt(x) for x in work)} s -> task start-up "
                f"and teardown ≈ {fmt(run['copy_task_overhead_mean'])} s per task; at most "
                f"{run['copy_concurrency']} ran at once."
                f"\n- finalize task {fmt(run['finalize_work'] + run['finalize_overhead'])} s, "
                f"of which finalize work {fmt(run['finalize_work'])} s -> overhead "
                f"{fmt(run['finalize_overhead'])} s."
                f"\n- XCom: the plan is {run['plan_xcom_bytes']:,} bytes (pushed by prepare, "
                "pulled by every COPY task and finalize when their templates render); its cost "
                "is inside the task start-up figures, and is small next to starting a task "
                "process (import Airflow, the provider, the DAG file; talk to the API server)."
            )
            parts.append(
                "\n<details><summary>task instances</summary>\n\n```\n"
                + run["tasks"]
                + "\n```\n</details>"
            )
    return "\n".join(parts)


# --- peers -----------------------------------------------------------------------------------


def _version(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"not available ({exc})"
    text = (out.stdout + out.stderr).strip().splitlines()
    lines = [t for t in text if "version" in t.lower()]
    return (lines or text or ["?"])[0].strip()[:120]


def peers_md(bench: Any) -> str:
    if bench.args.skip_peers:
        return "Not run (`--skip-peers`)."
    parts = [
        f"- pgloader: `{_version(['pgloader', '--version'])}`; pgcopydb: "
        f"`{_version(['pgcopydb', '--version'])}` (Debian packages).",
        "- pgloader loads the same CSV files into a fresh target with the same PK + FK. Its "
        "`drop indexes` drops and rebuilds the indexes; FKs stay and are checked per row unless "
        "`disable triggers` (then never checked: not a safe load).",
        "- pgcopydb cannot read CSV: it clones a database holding only the workload's tables "
        "(loaded beforehand, not timed) into a fresh database on the same server: schema, COPY "
        "with same-table split, indexes, constraints, VACUUM ANALYZE. A DB->DB copy, so only a "
        "rough peer of a file load; its figures include starting pg_dump/pg_restore. "
        "(pgcopydb 0.10's `--filters` could not be used: with `[include-only-table]` it still "
        "restored the identity sequence of a filtered-out table and failed.)",
    ]
    for key, status in bench.peer_status.items():
        parts.append(f"- **{key}: {status[:1500]}**")
    loads = [r for r in bench.records if r.group == "peers" and r.extra.get("load_file")]
    if loads:
        parts.append("\n<details><summary>pgloader load files</summary>\n")
        for r in loads:
            parts.append(f"{r.workload} `{r.key}`:\n```\n{r.extra['load_file']}```")
        parts.append("</details>")
    cmds = [r for r in bench.records if r.key == "pgcopydb" and r.extra.get("command")]
    for r in cmds:
        parts.append(f"\n{r.workload} pgcopydb command: `{r.extra['command']}`")
    return "\n".join(parts)


# --- scaling ---------------------------------------------------------------------------------


def scaling_md(bench: Any) -> str:
    w = "A"
    rows = []
    info = {}
    for n, key, group in [
        (1, "pipeline_replace_p1", "methods"),
        (2, "pipeline_replace_p2", "methods"),
        (4, "pipeline_replace_p4", "methods"),
        (8, "tune_p8", "tuning"),
    ]:
        recs = records(bench, w, key, group)
        if not recs:
            continue
        copy = phase(recs, "copy")
        total = median(r.seconds for r in recs)
        srv = median(r.server_cpu for r in recs)
        cli = median(r.client_cpu for r in recs)
        cores = (srv + cli) / total if srv is not None and cli is not None and total else None
        info[n] = (copy, total)
        rows.append([str(n), fmt(total), fmt(copy), fmt(srv, 1), fmt(cli, 1), fmt(cores)])
    parts = [
        md_table(
            [
                "partitions",
                "total s",
                "copy phase s",
                "server CPU s",
                "client CPU s",
                "cores busy on average (CPU s / wall s)",
            ],
            rows,
        )
    ]
    if 1 in info and 2 in info and info[1][0] and info[2][0]:
        c1, t1 = info[1]
        c2 = info[2][0]
        fixed = t1 - c1
        parts.append(
            f"\n**Parallel COPY gains little here**: the COPY phase goes from {fmt(c1)} s (1 "
            f"partition) to {fmt(c2)} s (2), {fmt(c1 / c2)}x, and more partitions do not help: "
            f"this machine has {os.cpu_count()} cores, and each COPY stream needs a server "
            "backend that parses and inserts the rows (CPU-bound) while the client process and "
            "any other load share the same cores.\n"
        )
        est = []
        for p in (1, 2, 4, 8, 16):
            t = fixed + c1 / p * 1.15 if p > 1 else t1
            est.append([str(p), f">= {p + 1}", fmt(c1 / p * (1.15 if p > 1 else 1)), fmt(t)])
        parts.append(
            "*Estimate* (not measured) for a database server with more cores than COPY streams "
            f"and storage that keeps up: the COPY phase as 1-partition COPY time ({fmt(c1)} s) "
            "/ partitions x 1.15 (contention on WAL insertion and the relation extension "
            "lock), the rest of the load unchanged (finalize builds one index, validates and "
            f"analyzes serially: {fmt(fixed)} s here). Background write-up 002 saw the gain "
            "flatten near half the CPUs.\n"
        )
        parts.append(
            md_table(
                ["partitions", "server cores", "COPY phase s (estimate)", "total s (estimate)"], est
            )
        )
    return "\n".join(parts)


# --- profile ---------------------------------------------------------------------------------


def profile_md(bench: Any) -> str:
    prof = getattr(bench, "profile", None)
    if not prof:
        return "Not run (quick run or `--skip-tuning`)."
    if "error" in prof:
        return f"py-spy failed: `{prof['error'][:800]}`"
    lines = [
        f"py-spy ({prof['rate']} Hz, all threads, idle samples dropped) of one "
        f"`pipeline_replace_p2` load of workload A ({fmt(prof['wall'])} s wall, "
        f"{prof['samples']:,} active samples = {fmt(prof['active_seconds'])} thread-seconds "
        f"on CPU, {fmt(100 * prof['active_seconds'] / prof['wall'], 0)}% of one core). "
        "Top functions by own samples:\n",
        md_table(
            ["function", "samples", "share"],
            [
                [f"`{name}`", f"{n:,}", f"{100 * n / max(1, prof['samples']):.0f}%"]
                for name, n in prof["top"]
            ],
        ),
        f"\nThe client is on CPU {fmt(100 * prof['active_seconds'] / prof['wall'], 0)}% of "
        "the wall time (summed over its threads) and waits for the server otherwise: the load "
        "is bound by "
        "the server's CPU (COPY parsing, heap and WAL inserts, index build), as the server "
        "CPU figures above show. Server-side: pg_stat_statements needs "
        "`shared_preload_libraries` (not a default setting, so not enabled on the throwaway "
        "cluster); the per-statement timings of finalize above stand in for it.",
    ]
    return "\n".join(lines)


# --- the document ----------------------------------------------------------------------------


def _other_results() -> list[str]:
    """A line naming the result files the other benchmark scripts wrote (16 cores, incremental
    and partitioned loads, Parquet, ranges), which a full run of this one leaves alone."""
    found = sorted(Path(__file__).resolve().parent.glob("RESULTS-*.md"))
    if not found:
        return []
    links = ", ".join(f"[{p.name}]({p.name})" for p in found)
    return [f"Results of the other benchmark scripts: {links}.", ""]


def _machine() -> list[str]:
    cpu = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next(
            (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?"
        )
    mem = "?"
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("MemTotal"))
        mem = f"{kb / 1024 / 1024:.1f} GiB"
    versions = []
    for dist in ("psycopg", "apache-airflow-core", "apache-airflow-providers-postgres"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions.append(f"{dist} {importlib.metadata.version(dist)}")
    return [
        f"- nproc: {os.cpu_count()}; memory: {mem}; CPU: {cpu}",
        f"- kernel {platform.release()}; Python {platform.python_version()}; "
        + ", ".join(versions),
    ]


def render(bench: Any, command: str) -> str:
    a = bench.args
    settings = bench.settings
    out = [
        "# airflow-pg-bulk benchmarks",
        "",
        f"Written by `{command}` (from the repository root) on "
        f"{bench.started:%Y-%m-%d %H:%M} UTC; the run took {bench.elapsed / 60:.1f} min. "
        "Every full run overwrites this file.",
        "",
        *_other_results(),
        "## Machine and server",
        "",
        *_machine(),
        f"- PostgreSQL {settings.get('server_version', '?')}, "
        + (
            "a throwaway cluster started by the benchmark (Debian's binaries, initdb defaults "
            "except `shared_buffers`), on 127.0.0.1"
            if bench.own_server
            else "the server given by `--conn`"
        ),
        "",
        md_table(
            ["setting", "value"],
            [[k, f"`{v}`"] for k, v in settings.items() if k != "server_version"],
        ),
        "",
        "## How it measures",
        "",
        "- Every method loads the same CSV files (header line, server-generated) into a freshly "
        "created target of the same definition (`CREATE TABLE … (LIKE template INCLUDING ALL)` "
        "+ the template's FKs) on the same server; the row count is checked after each load.",
        "- Each load runs in its own process, after a `CHECKPOINT`: seconds are the load alone "
        "(timed inside that process); client peak RSS and CPU from `os.wait4`; server CPU = "
        "the postmaster's and its children's CPU time before/after (from /proc); WAL = "
        "`pg_current_wal_lsn()` difference; table and index sizes after the load.",
        f"- The key comparison (naive, floor, replace with 2 partitions) ran {a.reps} times on "
        f"workload A, interleaved; its ratios are medians of same-repetition ratios. Other "
        "methods ran once (B and C: "
        f"{a.other_reps}x); their ratios use the medians. Tuning variants ran "
        f"{a.tuning_reps}x each, each repetition with its own baseline.",
        "- *naive* = one COPY (1 MiB writes, one transaction, one connection) into the indexed, "
        "logged target; *floor* = the same COPY into an UNLOGGED table with no index or "
        "constraint (not a usable result). Speed-up vs naive = naive s / method s; "
        "/ floor = method s / floor s.",
        f"- Row INSERTs via executemany are capped at {a.insert_cap:,} rows (A, B, C) and "
        "**extrapolated** to all rows at the measured rate (labelled). psycopg 3 sends an "
        "executemany in pipeline mode (no round trip per row), so this is the best case of "
        "row-by-row inserts. Multi-row INSERTs load every row. Both include parsing the CSV "
        "with Python's csv module.",
        "- `PostgresHook.copy_expert` (provider "
        "7.x on psycopg 3) opens a connection, COPYs in 8 KiB reads and commits, per call: one "
        "call per file, one after the other. `PostgresHook.bulk_load` wants PostgreSQL's "
        "tab-delimited text format: the CSV was converted once beforehand (not timed).",
        f"- Noise: load average {bench.load_start:.2f} at the start. Other engineers' work "
        "shares this machine; *other CPU* seconds during each load are in the JSON output. "
        "Differences under ~10% are not called anything but noise.",
        "",
        "## Targets (workload A, 2 partitions, in-process)",
        "",
        md_table(["target", "measured", "result"], targets(bench)),
        "",
    ]
    for key in a.workloads:
        ds = bench.datasets[key]
        out += [
            f"## {ds.title}",
            "",
            f"{ds.description}. {ds.rows:,} rows, {ds.bytes / 1e6:,.1f} MB of CSV.",
            "",
            methods_md(bench, ds),
            "",
            "Pipeline phases (median seconds; `cleanup+connect` = wall - the phases):",
            "",
            phases_md(bench, ds),
            "",
        ]
    if "A" in bench.datasets and "A" in a.tuning_workloads and not a.skip_tuning:
        out += [
            "## Choices for the defaults (workload A)",
            "",
            tuning_md(bench, bench.datasets["A"]),
            "",
        ]
    out += [
        "## Parallel COPY on this machine",
        "",
        scaling_md(bench),
        "",
        "## Client profile",
        "",
        profile_md(bench),
        "",
        "## The pipeline as an Airflow DAG",
        "",
        airflow_md(bench),
        "",
        "## Peers",
        "",
        peers_md(bench),
        "",
    ]
    notes = getattr(bench, "notes", [])
    if notes:
        out += ["## Notes", "", *notes, ""]
    return "\n".join(out)
