"""A trainer's metrics.jsonl as a PNG: mean reward and pass rate, the first slot's option probabilities (from
start.json beside it at step 0, when there), and the losses, over steps. Needs matplotlib (pip install matplotlib).

    python scripts/plot_training.py RUN/metrics.jsonl curve.png
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(metrics: Path, png: Path) -> None:
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    if not rows:
        sys.exit(f"{metrics} holds no steps")
    steps = [r["step"] for r in rows]
    fig, (reward, probs, losses) = plt.subplots(1, 3, figsize=(15, 4))
    reward.plot(steps, [r["reward_mean"] for r in rows], marker="o", label="mean reward")
    reward.plot(steps, [r["pass_rate"] * 3 for r in rows], linestyle="--", label="pass rate x 3")
    reward.set(xlabel="step", ylabel="milestone reward", ylim=(-1.1, 3.1), title="reward")
    reward.legend()
    start = metrics.with_name("start.json")  # the demo's distribution before the first step
    first = json.loads(start.read_text())["p_first_slot"] if start.is_file() else None
    for option in rows[0].get("p_first_slot", {}):
        ys = [r["p_first_slot"][option] for r in rows]
        probs.plot(([0] if first else []) + steps, ([first[option]] if first else []) + ys, label=option)
    probs.set(xlabel="step", ylabel="probability", ylim=(0, 1), title="kernel choice after the step")
    probs.legend()
    losses.plot(steps, [r["policy_loss"] for r in rows], label="policy loss")
    losses.plot(steps, [r["value_loss"] for r in rows], label="value loss")
    losses.plot(steps, [r["entropy"] for r in rows], label="entropy")
    losses.set(xlabel="step", title="losses")
    losses.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(png)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]))
