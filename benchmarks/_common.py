"""Shared bits of the benchmark scripts: import path, the machine's description, result files."""

from __future__ import annotations

import datetime
import json
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def task_slice(spec: str, scratch: Path) -> tuple[Path, int, list[Path]]:
    """`JSONL:SKIP:COUNT` (rows SKIP .. SKIP+COUNT of a task export, written as task files under `scratch`): the
    export, SKIP and the task files."""
    from cuda_agent.task import task_files

    path, skip, count = spec.rsplit(":", 2)
    return Path(path), int(skip), task_files(Path(path), scratch)[int(skip):int(skip) + int(count)]


def machine() -> dict:
    info = {"host": platform.node(), "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name()
    except ImportError:
        pass
    try:
        info["cpu"] = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                           if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        version = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
        info["nvcc"] = version.strip().splitlines()[-1]
    except (OSError, IndexError):
        pass
    return info


def write(out: Path | None, title: str, rows: list[dict], columns: list[str], extra: dict) -> None:
    lines = [f"### {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(c)) for c in columns) + " |")
    table = "\n".join(lines)
    print(table)
    if out:
        out.write_text(json.dumps({"machine": machine(), "rows": rows, **extra}, indent=2))
        out.with_suffix(".md").write_text(table + "\n")


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    return "" if value is None else str(value)
