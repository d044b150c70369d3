"""Where an export runs the solution's code: in a process of its own (`run`), sandboxed where the machine allows.
Importing a solution runs its code, and a kernel the agent wrote is the policy's, as untrusted as in the judge
(held out, red team 2026-12-05: the best kernel of `optimize --module`, imported in the CLI's process at its export,
rewrote the run's verdict files as reward 3 for RFT and multiplied the judge's cached torch.compile times by 1000).
The process sees the files it is given, writes only the export's staging folder, gets the environment without
credentials and never the judge's cache, and hands back what it found as JSON (an error names the export's or the
check's kind, raised again here as `ExportError` or `CheckError`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .. import sandbox

TIMEOUT_S = 3600  # builds of a solution's extensions and a whole model's check included


def run(command: str, payload: dict, writable: Path, readable: list[Path], hidden: list[Path]) -> dict:
    """`command` (below) on `payload` in a process of its own; its JSON answer. `writable`: a folder it may write
    (the answer goes there too); `readable`: what it reads where the sandbox would hide it (under /tmp, say)."""
    from .check_model import CheckError
    from .package import ExportError

    answer = writable / ".isolated.json"
    answer.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "cuda_agent.export.isolated", command, json.dumps(payload), str(answer)]
    if sandbox.probe() is None:
        view = sandbox.View(writable=[writable], readable=[p for p in readable if p.exists()], hidden=hidden)
        done = sandbox.run(argv, view, writable, TIMEOUT_S, sandbox.Limits(cpu_seconds=None))
    else:  # no namespaces here: a process of its own, without the environment's credentials
        done = subprocess.run(argv, cwd=writable, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, errors="replace", timeout=TIMEOUT_S,
                              env=sandbox.public_environ())
    if not answer.is_file():
        raise ExportError(f"the solution's process ended without an answer (exit {done.returncode}): "
                          f"{done.stdout.strip()[-2000:]}")
    found = json.loads(answer.read_text())
    answer.unlink()
    if "error" in found:
        raise (CheckError if found["kind"] == "check" else ExportError)(found["error"])
    return found


def main(command: str, payload: str, answer: str) -> None:
    from .check_model import CheckError, check_here
    from .package import ExportError, build_inline_here, check_here as check_export_here

    args = json.loads(payload)
    try:
        if command == "build-inline":
            found = {"made": build_inline_here(**args)}
        elif command == "check":
            found = {"notes": check_export_here(**args)}
        elif command == "check-model":
            found = {"check": check_here(**args)}
        else:
            raise ExportError(f"unknown command {command!r}")
    except ExportError as exc:
        found = {"error": str(exc), "kind": "export"}
    except CheckError as exc:
        found = {"error": str(exc), "kind": "check"}
    Path(answer).write_text(json.dumps(found))


if __name__ == "__main__":
    main(*sys.argv[1:])
