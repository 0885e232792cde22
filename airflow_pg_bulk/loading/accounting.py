"""Row accounting: every COPY of a piece counts the records it sends, and the rows the server
reports (plus the rows set aside as rejects) must add up to them before the partition commits.

This closes, for every format, source and server version, the ways a load could report success
having lost rows: an end-of-data marker the server stopped at, or any disagreement between our
reading of record boundaries and the server's. A failure names the file and the first line that
did not arrive; the partition's transaction rolls back, so nothing reaches the target.
"""

from __future__ import annotations

from collections.abc import Iterator

from airflow_pg_bulk.errors import BadDataError
from airflow_pg_bulk.plan import CopyOptions, Piece
from airflow_pg_bulk.source import lines, reading, records
from airflow_pg_bulk.source.syntax import RecordSyntax


def counted_chunks(
    piece: Piece, opts: CopyOptions, rule: records.MarkerRule, target: str
) -> tuple[records.RecordCounter, Iterator[bytes]]:
    """The piece's bytes for COPY, counted on the way; the counter is final once they are
    exhausted. A marker that would make COPY skip rows, or a first line ending that differs
    from the file's, raises :class:`BadDataError` from the iterator (which aborts the COPY)."""
    counter = records.RecordCounter(
        RecordSyntax.of(opts),
        rule,
        first_line=piece.first_line or 1,
        file_end=reading.piece_ends_file(piece),
        expected_newline=piece.newline.encode() if piece.newline else None,
        encoding=opts.encoding,
    )

    def chunks() -> Iterator[bytes]:
        try:
            yield from counter.wrap(reading.piece_chunks(piece, opts))
        except records.RecordError as exc:
            # a piece past a guessed split point counts its lines only now
            line = exc.line if piece.first_line else exc.line + lines.first_line(piece, opts) - 1
            raise BadDataError(
                f"{piece.path} line {line}: {exc.message}. Nothing of this load reached {target}.",
                path=piece.path,
                line=line,
            ) from None

    return counter, chunks()


def check_rows(
    counter: records.RecordCounter,
    piece: Piece,
    opts: CopyOptions,
    target: str,
    rows: int,
    skipped: int = 0,
) -> None:
    """Fail unless the server took every record sent: ``rows`` loaded plus ``skipped`` (rows
    the server set aside by ``ON_ERROR ignore``) must equal the records counted."""
    sent = counter.finish()
    taken = rows + skipped
    if taken == sent:
        return
    where = f"{piece.path} (the part from line {lines.first_line(piece, opts)})"
    line = None
    if taken < sent and not skipped:
        try:
            line, _last = lines.record_lines(piece, taken + 1, opts, numbering="records")
        except ValueError:
            line = None
        else:
            where = f"{piece.path} line {line}"
    counts = f"COPY reported {rows} rows" + (f" and {skipped} skipped" if skipped else "")
    raise BadDataError(
        f"{where}: {counts} where the data sent holds {sent} records; "
        + (
            "the server stopped reading before the end (this is the first record that did "
            "not arrive)"
            if taken < sent
            else "the server read the records differently from this load's reading of them"
        )
        + f". Nothing of this load reached {target}.",
        path=piece.path,
        line=line,
    )
