"""A COPY task in a process of its own, for tests/test_faults.py to kill mid-stream.

    python fault_child.py DSN DRIVER PLAN_JSON_FILE PARTITION

Reads the plan as the copy task gets it through XCom (JSON), then runs
``steps.copy_partition`` on a new connection, feeding the partition slowly (4 KiB chunks,
a pause after each) so the parent finds the COPY in progress. Prints ``streaming`` once the
first chunk has been handed to the driver and ``committed <rows>`` if it gets to the end.
Only the file reader is slowed down; the database is the real one.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from airflow_pg_bulk import steps
from airflow_pg_bulk.db.driver import connect
from airflow_pg_bulk.plan import CopyOptions, LoadPlan, Piece
from airflow_pg_bulk.source import reading

CHUNK = 4096
PAUSE = 0.05


def main() -> None:
    dsn, driver, plan_file, partition = sys.argv[1:5]
    plan = LoadPlan.from_dict(json.loads(Path(plan_file).read_text()))
    real_chunks = reading.piece_chunks
    announced = False

    def slow_chunks(
        piece: Piece, opts: CopyOptions, chunk_size: int = CHUNK, **kwargs: object
    ) -> Iterator[bytes]:
        nonlocal announced
        for chunk in real_chunks(piece, opts, chunk_size=CHUNK, **kwargs):
            yield chunk
            if not announced:
                announced = True
                print("streaming", flush=True)
            time.sleep(PAUSE)

    reading.piece_chunks = slow_chunks
    conn = connect(dsn, driver)
    try:
        result = steps.copy_partition(conn, plan, int(partition))
    finally:
        conn.close()
    print(f"committed {result.rows}", flush=True)


if __name__ == "__main__":
    main()
