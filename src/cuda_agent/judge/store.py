"""A small SQLite key-value store: baseline timings and suite results survive restarts and crashes."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any


class Store:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._sql("PRAGMA journal_mode=WAL")
        self._sql("CREATE TABLE IF NOT EXISTS entries (namespace TEXT, key TEXT, value TEXT, updated REAL, "
                  "PRIMARY KEY (namespace, key))")

    def _sql(self, statement: str, args: tuple = ()) -> list[tuple]:
        db = sqlite3.connect(self.path, timeout=60)
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
