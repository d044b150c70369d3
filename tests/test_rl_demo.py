"""`cuda-agent train demo` on the cpu backend with a tiny model: every pick is written, built, verified and timed by
the real judge through the agent's Environment; the wrong kernel scores -1, the correct ones >= 1; PPO moves
probability off the wrong kernel; a second invocation resumes from the checkpoint."""

import json
import math

import pytest
from typer.testing import CliRunner

from cuda_agent.cli import app

pytest.importorskip("transformers")


def test_the_demo_learns_from_judged_picks_and_resumes(tiny_smollm2, cache_dir, fast_cli, tmp_path):
    """Two real PPO steps of a tiny model through the CLI, a resume between them, 16 picks each judged by the cpu
    judge: the one test of the whole training path, end to end. Slow (~4 min on CI's 2 cores): the judge's
    evaluations, not the model, take the time, and each is already at FAST_TIMING."""
    # the rewards asserted are -1 (wrong) and >= 1 (correct): whatever the speedups, so the judge times briefly
    out = tmp_path / "run"
    args = ["train", "demo", "--backend", "cpu", "--model", str(tiny_smollm2), "--random-init", "--batch", "4",
            "--actor-lr", "1e-3", "--critic-lr", "1e-3", "--save-every", "1", "--cache-dir", str(cache_dir),
            "--out", str(out)]
    first = CliRunner().invoke(app, args + ["--steps", "1"])
    assert first.exit_code == 0, first.output
    second = CliRunner().invoke(app, args + ["--steps", "2"])
    assert second.exit_code == 0, second.output
    assert "resuming at step 1" in second.output

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert all(math.isfinite(r[k]) for k in ("policy_loss", "value_loss", "entropy", "reward_mean"))
        assert sum(r["picks"].values()) == 4 and 0 <= r["pass_rate"] <= 1
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    rewards = {(e["step"], e["pick"]): e["reward"] for e in episodes}
    for (_, pick), reward in rewards.items():
        if pick == "C":  # the kernel without * 0.5
            assert reward == -1
        else:
            assert reward >= 1
    assert any("incorrect" in (e["error"] or "") for e in episodes if e["pick"] == "C")

    start = json.loads((out / "start.json").read_text())["p_first_slot"]
    end = rows[-1]["p_first_slot"]
    assert end["C"] < start["C"], (start, end)  # mass leaves the kernel the judge rejects
    assert (out / "checkpoint" / "actor" / "config.json").is_file()
    assert (out / "checkpoint" / "critic" / "value_head.pt").is_file()


def test_the_demo_refuses_bad_input(tmp_path):
    result = CliRunner().invoke(app, ["train", "demo", "--backend", "rocm", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "Invalid value for '--backend'" in result.output
    result = CliRunner().invoke(app, ["train", "demo", "--backend", "cpu", "--model", str(tmp_path),
                                      "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "no config.json" in result.output
    result = CliRunner().invoke(app, ["train", "demo", "--batch", "1", "--out", str(tmp_path)])
    assert result.exit_code == 2
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')  # a folder without weights or tokenizer
    result = CliRunner().invoke(app, ["train", "demo", "--backend", "cpu", "--model", str(tmp_path),
                                      "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and f"model {tmp_path}" in result.output.replace("\n", ""), result.output


def test_the_demo_says_there_is_no_gpu_before_loading_anything(tmp_path):
    import shutil

    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has a GPU")
    result = CliRunner().invoke(app, ["train", "demo", "--model", str(tmp_path), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "no CUDA GPU found" in result.output, result.output
