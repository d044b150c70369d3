"""The command line, end to end on the CPU backend."""

import json
import shutil

import pytest
from typer.testing import CliRunner

from conftest import CANDIDATES, TASKS
from cuda_agent.cli import app

runner = CliRunner()


def test_eval_json_verdict_has_the_documented_keys(cache_dir):
    result = runner.invoke(app, ["eval", str(TASKS / "affine_relu.py"), "--solution",
                                 str(CANDIDATES / "affine_relu_ok"), "--backend", "cpu", "--json",
                                 "--cache-dir", str(cache_dir)])
    assert result.exit_code == 0, result.output
    verdict = json.loads(result.stdout)
    for key in ("reward", "compiled", "correct", "policy_violations", "error", "times_us", "speedup_vs_eager",
                "speedup_vs_compile", "max_abs_error", "backend", "device", "torch_version"):
        assert key in verdict
    assert set(verdict["times_us"]) == {"eager", "compile", "candidate"}
    assert verdict["correct"] and verdict["reward"] >= 1 and verdict["backend"] == "cpu"


def test_eval_prints_a_readable_verdict(cache_dir):
    result = runner.invoke(app, ["eval", str(TASKS / "affine_relu.py"), "--solution",
                                 str(CANDIDATES / "affine_relu_ok"), "--backend", "cpu", "--cache-dir", str(cache_dir)])
    assert result.exit_code == 0, result.output
    assert "reward" in result.stdout and "speedup" in result.stdout


def test_bad_input_is_one_clear_error_line(cache_dir, tmp_path):
    result = runner.invoke(app, ["eval", str(TASKS / "broken" / "no_model.py"), "--solution",
                                 str(CANDIDATES / "affine_relu_ok"), "--backend", "cpu", "--cache-dir", str(cache_dir)])
    assert result.exit_code == 2 and "missing Model" in result.output
    result = runner.invoke(app, ["eval", str(TASKS / "affine_relu.py"), "--solution", str(tmp_path / "nope"),
                                 "--backend", "cpu", "--cache-dir", str(cache_dir)])
    assert result.exit_code == 2 and "no such file or folder" in result.output
    result = runner.invoke(app, ["eval", str(TASKS / "affine_relu.py"), "--solution", str(tmp_path),
                                 "--backend", "tpu", "--cache-dir", str(cache_dir)])
    assert result.exit_code == 2 and "unknown backend" in result.output


def test_eval_suite_reports_levels_and_resumes(cache_dir, tmp_path):
    suite, solutions = tmp_path / "suite", tmp_path / "solutions"
    (suite / "level1").mkdir(parents=True)
    (suite / "level2").mkdir()
    shutil.copy(TASKS / "affine_relu.py", suite / "level1" / "1_AffineReLU.py")
    shutil.copy(TASKS / "linear_gelu.py", suite / "level1" / "2_LinearGELU.py")  # no solution: a failure
    shutil.copy(TASKS / "affine_relu.py", suite / "level2" / "1_Affine.py")
    shutil.copytree(CANDIDATES / "affine_relu_ok", solutions / "level1" / "1_AffineReLU")
    (solutions / "level2").mkdir(parents=True)
    shutil.copy(CANDIDATES / "affine_relu_single.py", solutions / "level2" / "1_Affine.py")
    args = ["eval-suite", str(suite), "--solutions", str(solutions), "--levels", "1,2", "--backend", "cpu", "--json",
            "--cache-dir", str(cache_dir), "--db", str(tmp_path / "results.sqlite")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    level1, overall = report["levels"]["level1"], report["overall"]
    assert level1["n"] == 2 and level1["pass_rate"] == 0.5
    assert report["levels"]["level2"]["n"] == 1 and overall["n"] == 3
    # the aggregates are those of the verdicts (speeds themselves vary with the machine's load)
    speedups = [t["verdict"]["speedup_vs_eager"] for t in report["tasks"] if t["verdict"]["correct"]]
    assert len(speedups) == 2 and overall["faster_than_eager"] == sum(x > 1.0 for x in speedups) / 3
    assert overall["geomean_speedup_vs_eager"] == pytest.approx((speedups[0] * speedups[1]) ** 0.5)
    for key in ("pass_rate", "faster_than_eager", "faster_than_compile", "geomean_speedup_vs_eager",
                "geomean_speedup_vs_compile"):
        assert key in overall
    missing = [t for t in report["tasks"] if t["task"] == "level1/2_LinearGELU.py"][0]
    assert "no solution" in missing["verdict"]["error"]

    again = runner.invoke(app, args)
    assert again.exit_code == 0
    rerun = json.loads(again.stdout)
    assert [t["verdict"]["seeds"] for t in rerun["tasks"]] == [t["verdict"]["seeds"] for t in report["tasks"]]
    assert "resumed" in again.stderr
    # Any setting that can change a verdict judges again; without --levels, every levelN folder there is judged.
    other = runner.invoke(app, [*args, "--trials", "3"])
    assert other.exit_code == 0 and "resumed" not in other.stderr, other.stderr
    judged = [t["verdict"] for t in json.loads(other.stdout)["tasks"] if t["verdict"]["correct"]]
    assert len(judged) == 2 and all(len(v["seeds"]) == 3 for v in judged)
    no_levels = [a for a in args if a not in ("--levels", "1,2")]
    default = runner.invoke(app, [*no_levels, "--trials", "3"])
    assert default.exit_code == 0 and json.loads(default.stdout)["overall"]["n"] == 3, default.output


def test_a_dataset_row_is_a_reference(cache_dir, tmp_path):
    from cuda_agent.data.build import write_parquet

    row = {"code": (TASKS / "affine_relu.py").read_text(), "ops": "[]", "data_source": "torch#2", "num_ops": 2}
    write_parquet([{**row, "code": "broken"}, row], tmp_path / "ops.parquet")
    (tmp_path / "ops.jsonl").write_text(json.dumps({"code": "broken"}) + "\n" + json.dumps(row) + "\n")
    for dataset in ("ops.parquet", "ops.jsonl"):
        result = runner.invoke(app, ["eval", str(tmp_path / dataset), "--row", "1", "--solution",
                                     str(CANDIDATES / "affine_relu_ok"), "--backend", "cpu", "--json",
                                     "--cache-dir", str(cache_dir)])
        assert result.exit_code == 0, result.output
        verdict = json.loads(result.stdout)
        assert verdict["reward"] >= 1 and verdict["task"]["name"] == "ops_row1", verdict
    result = runner.invoke(app, ["eval", str(tmp_path / "ops.parquet"), "--solution",
                                 str(CANDIDATES / "affine_relu_ok"), "--backend", "cpu", "--cache-dir", str(cache_dir)])
    assert result.exit_code == 2 and "has 2 rows: pick one with --row 0..1" in result.output
    result = runner.invoke(app, ["optimize", str(tmp_path / "ops.jsonl"), "--row", "7", "--model", "m",
                                 "--base-url", "http://127.0.0.1:9/v1", "--backend", "cpu",
                                 "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "has 2 rows" in result.output and not (tmp_path / "run").exists()


def test_without_a_sandbox_auto_warns_and_required_refuses(cache_dir, tmp_path):
    """Where namespaces cannot be made (here: no `unshare` on PATH), `auto` says so loudly; `required` refuses."""
    import os
    import shutil
    import subprocess
    import sys

    torch_ops = tmp_path / "torch_ops.py"
    torch_ops.write_text("import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def __init__(self, scale, shift):\n"
                         "        super().__init__()\n        self.scale, self.shift = scale, shift\n\n"
                         "    def forward(self, x):\n        return torch.relu(x * self.scale + self.shift) * 0.5\n")
    env = {**os.environ, "PATH": str(tmp_path / "empty"), "CXX": shutil.which("g++")}
    base = [sys.executable, "-m", "cuda_agent", "eval", str(TASKS / "affine_relu.py"), "--solution", str(torch_ops),
            "--backend", "cpu", "--policy", "kernelbench", "--cache-dir", str(cache_dir)]
    auto = subprocess.run([*base, "--json"], capture_output=True, text=True, env=env, timeout=600)
    assert auto.returncode == 0 and "warning: no sandbox here" in auto.stderr, auto.stderr
    verdict = json.loads(auto.stdout)
    assert verdict["sandbox"].startswith("none") and verdict["correct"], verdict["error"]
    required = subprocess.run([*base, "--sandbox", "required"], capture_output=True, text=True, env=env, timeout=600)
    assert required.returncode == 2 and "the sandbox is required but unavailable" in required.stderr, required.stderr
