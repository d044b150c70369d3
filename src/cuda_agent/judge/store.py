"""A small SQLite key-value store: baseline timings and suite results survive restarts and crashes."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any


class Store:
    """JSON values by (namespace, key), each with the time it was last written. The schema is this class's alone:
    other modules (reports, suites) read through it. `read_only` opens an existing store without changing it
    (sqlite3.DatabaseError when the file is no such store)."""

    def __init__(self, path: Path, read_only: bool = False):
        self.path, self.read_only = Path(path), read_only
        if read_only:
            self._sql("SELECT count(*) FROM entries")
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._sql("PRAGMA journal_mode=WAL")
        self._sql("CREATE TABLE IF NOT EXISTS entries (namespace TEXT, key TEXT, value TEXT, updated REAL, "
                  "PRIMARY KEY (namespace, key))")

    def _sql(self, statement: str, args: tuple = ()) -> list[tuple]:
        db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=60) if self.read_only else \
            sqlite3.connect(self.path, timeout=60)
        try:
            with db:
                return db.execute(statement, args).fetchall()
        finally:
            db.close()

    def get(self, namespace: str, key: str) -> Any | None:
        rows = self._sql("SELECT value FROM entries WHERE namespace=? AND key=?", (namespace, key))
        return json.loads(rows[0][0]) if rows else None

    def put(self, namespace: str, key: str, value: Any) -> None:
        self._sql("INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?)",
                  (namespace, key, json.dumps(value), time.time()))

    def append(self, namespace: str, value: Any) -> str:
        """Store `value` under the next number in `namespace` ("1", "2", ...: one statement, so two writers never
        take the same one); returns its key."""
        db = sqlite3.connect(self.path, timeout=60)
        try:
            with db:
                db.execute("INSERT INTO entries SELECT ?, CAST(count(*) + 1 AS TEXT), ?, ? FROM entries "
                           "WHERE namespace=?", (namespace, json.dumps(value), time.time(), namespace))
                return db.execute("SELECT key FROM entries WHERE rowid=last_insert_rowid()").fetchone()[0]
        finally:
            db.close()

    def entries(self, namespace: str) -> list[tuple[str, Any, float]]:
        """Every (key, value, time written) in `namespace`, oldest first."""
        return [(key, json.loads(value), updated) for key, value, updated in
                self._sql("SELECT key, value, updated FROM entries WHERE namespace=? ORDER BY updated", (namespace,))]
