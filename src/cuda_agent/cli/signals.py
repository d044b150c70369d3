"""SIGTERM (what schedulers and `docker stop` send) taken as Ctrl-C is: the first raises KeyboardInterrupt in the main
thread, so a command stops as on Ctrl-C (`eval-suite` finishes and stores the evaluations in flight), stopping its
worker processes and removing its temporary folders; a second abandons the work in flight, as a second Ctrl-C does.
The command then exits 143 (128 + SIGTERM), not Ctrl-C's 130. Only the main process is signalled (`docker stop`
signals PID 1); the judge's workers, in sessions of their own, are stopped by the judge (`WorkerProcess.kill`)."""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager
from typing import Iterator

EXIT_TERMINATED = 128 + signal.SIGTERM
FIRST = "cuda-agent: SIGTERM: stopping as on Ctrl-C (a second SIGTERM abandons the work in flight)\n"
AGAIN = "cuda-agent: SIGTERM again: abandoning the work in flight\n"

_received = 0


def _on_sigterm(signum, frame) -> None:
    global _received
    _received += 1
    try:
        os.write(2, (FIRST if _received == 1 else AGAIN).encode())  # no buffered stream: safe inside a handler
    except OSError:
        pass
    raise KeyboardInterrupt


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM handled as Ctrl-C meanwhile; a command it ended (a failing exit after it) exits 143."""
    global _received
    _received = 0
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    except SystemExit as exc:
        if _received and exc.code:  # typer's 130 for KeyboardInterrupt (an older typer's 1)
            raise SystemExit(EXIT_TERMINATED) from None
        raise
    except KeyboardInterrupt:  # raised past the command (while it exits)
        if _received:
            raise SystemExit(EXIT_TERMINATED) from None
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)

