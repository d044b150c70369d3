"""Which KernelBench revision a suite's task files come from: every version of every problem file in KernelBench's
history, by its git blob hash (`git hash-object FILE`), with the dates it was current. Run on a clone of
ScalingIntelligence/KernelBench; writes the table `suite/revisions.py` reads (the files' hashes, not their text).

    python3 scripts/kernelbench_revisions.py PATH/TO/KernelBench [--out src/cuda_agent/suite/kernelbench_revisions.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("repo", type=Path, help="a clone (or bare git folder) of ScalingIntelligence/KernelBench")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parents[1] / "src/cuda_agent/suite/kernelbench_revisions.json")
    args = parser.parse_args()
    commits = [line.split() for line in git(args.repo, "log", "--format=%H %ad", "--date=short", "--reverse",
                                            "--", "KernelBench/").splitlines()]
    files: dict[str, list] = {}  # blob -> [path, first date, last date, in the newest revision]
    for commit, date in commits:
        for line in git(args.repo, "ls-tree", "-r", commit, "KernelBench/").splitlines():
            meta, path = line.split("\t", 1)
            if path.endswith(".py") and "/level" in "/" + path:
                entry = files.setdefault(meta.split()[2], [path.removeprefix("KernelBench/"), date, date, False])
                entry[2] = date
    head, head_date = commits[-1]
    for line in git(args.repo, "ls-tree", "-r", head, "KernelBench/").splitlines():
        blob = line.split("\t", 1)[0].split()[2]
        if blob in files:
            files[blob][3] = True
    table = {"source": "github.com/ScalingIntelligence/KernelBench", "head": head, "head_date": head_date,
             "commits": len(commits), "files": dict(sorted(files.items()))}
    args.out.write_text(json.dumps(table, separators=(",", ":")) + "\n")
    print(f"{len(files)} file versions over {len(commits)} commits (newest {head[:10]}, {head_date}) -> {args.out}")


if __name__ == "__main__":
    main()
