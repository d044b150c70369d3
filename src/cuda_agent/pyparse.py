"""`ast.parse` that threads may call at once.

CPython 3.11 keeps the depth counter of its AST-to-object conversion in interpreter-wide state: when a garbage
collection inside one thread's conversion runs a finaliser that hands the GIL to another thread parsing too, the
counters mix and `ast.parse` raises `SystemError: AST constructor recursion depth mismatch`. A judge pool parses
tasks and candidates on many threads, so every parse in this package goes through one lock.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    with _LOCK:
        return ast.parse(source, filename=filename)
