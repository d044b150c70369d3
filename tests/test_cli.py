"""The command line, end to end on the CPU backend. Tests of what a command does with verdicts judge with
fast_config's timing (`fast_cli`): nothing here asserts a speed."""

import json
import math
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import CANDIDATES, TASKS
from cuda_agent.cli import app

runner = CliRunner()


def test_eval_json_verdict_has_the_documented_keys(cache_dir, fast_cli):
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


def test_eval_prints_a_readable_verdict(cache_dir, fast_cli):
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
    assert result.exit_code == 2 and "Invalid value for '--backend'" in result.output


def test_eval_suite_reports_levels_and_resumes(cache_dir, fast_cli, tmp_path, monkeypatch):
    """A three-task suite judged, reported per level and resumed from its database. Slow (~75 s on CI): the single
    file's `load_inline` build is cold in a run's cache, and the suite's judge starts its own workers."""
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
    # the aggregates are those of the verdicts (speeds themselves vary with the machine's load; a timing too noisy
    # on a loaded machine credits none)
    correct = [t["verdict"] for t in report["tasks"] if t["verdict"]["correct"]]
    speedups = [v["speedup_vs_eager"] for v in correct if v["speedup_vs_eager"] is not None]
    assert len(correct) == 2 and overall["faster_than_eager"] == sum(x > 1.0 for x in speedups) / 3
    assert overall["geomean_speedup_vs_eager"] == (pytest.approx(math.prod(speedups) ** (1 / len(speedups)))
                                                   if speedups else None)
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
    assert "judging 3/3" in result.stderr  # piped: a line per task as it ends, not a bar drawn at the end
    # Any setting that can change a verdict is in the key stored verdicts are found by (where files go is not);
    # without --levels, every levelN folder there is judged (here: resumed).
    from cuda_agent.judge import JudgeConfig

    assert JudgeConfig(num_trials=3).verdict_key() != JudgeConfig().verdict_key() != JudgeConfig(atol=0.1).verdict_key()
    assert JudgeConfig(cache_dir=tmp_path).verdict_key() == JudgeConfig().verdict_key()
    no_levels = [a for a in args if a not in ("--levels", "1,2")]
    default = runner.invoke(app, no_levels)
    assert default.exit_code == 0 and json.loads(default.stdout)["overall"]["n"] == 3, default.output
    assert "resumed" in default.stderr
    # the table names the tasks below reward 3 and why; --fail-on-reject exits 1 for the one not correct
    table = runner.invoke(app, [a for a in args if a != "--json"] + ["--fail-on-reject"])
    assert table.exit_code == 1, table.output
    assert "below reward 3:" in table.stdout and "of 3 tasks (1 not correct)" in table.stdout
    row = next(ln for ln in table.stdout.splitlines() if "level1/2_LinearGELU.py" in ln)
    assert row.strip().startswith("level1/2_LinearGELU.py  reward -1  no solution found for") and len(row) > 80
    assert all(not ln.endswith(" ") for ln in table.stdout.splitlines() if "LinearGELU" in ln)  # not padded
    # --rejudge judges the matching tasks again (fresh seeds) and resumes the others
    rejudged = json.loads(runner.invoke(app, [*args, "--rejudge", "level2/*"]).stdout)["tasks"]
    seeds = {t["task"]: t["verdict"]["seeds"] for t in rerun["tasks"]}
    assert rejudged[0]["verdict"]["seeds"] == seeds["level1/1_AffineReLU.py"]
    assert rejudged[2]["verdict"]["seeds"] != seeds["level2/1_Affine.py"] and rejudged[2]["verdict"]["correct"]
    bad = runner.invoke(app, [*args, "--rejudge", "level9/*"])
    assert bad.exit_code == 2 and "--rejudge level9/*: matches no task" in bad.output
    # another machine (device, driver, CUDA) never reuses a verdict measured here
    from cuda_agent.backend import CpuBackend

    monkeypatch.setattr(CpuBackend, "machine", lambda self: "cpu:another machine x64")
    elsewhere = json.loads(runner.invoke(app, [a if a != "1,2" else "1" for a in args]).stdout)["tasks"]
    assert elsewhere[0]["verdict"]["seeds"] != seeds["level1/1_AffineReLU.py"]


def test_numbers_are_checked_when_the_command_line_is_read(tmp_path):
    task, ok = str(TASKS / "affine_relu.py"), str(CANDIDATES / "affine_relu_ok")
    cases = [(["eval", task, "--solution", ok, "--atol", "-1"], "--atol"),
             (["eval", task, "--solution", ok, "--timeout", "0"], "--timeout"),
             (["eval", task, "--solution", ok, "--trials", "0"], "--trials"),
             (["eval-suite", str(tmp_path), "--solutions", str(tmp_path), "--workers", "0"], "--workers"),
             (["data", "build", "--target", "5", "--out", str(tmp_path / "d"), "--workers", "0"], "--workers"),
             (["data", "build", "--target", "0", "--out", str(tmp_path / "d")], "--target"),
             (["optimize", task, "--model", "m", "--max-turns", "0"], "--max-turns"),
             (["model", "serve", "--port", "70000"], "--port")]
    for args, option in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and f"Invalid value for '{option}'" in result.output, (args, result.output)
        assert "Traceback" not in result.output
    assert not (tmp_path / "d").exists()


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU machine: the cuda default is usable")
def test_data_build_on_a_machine_without_a_gpu_says_to_use_the_cpu_backend(tmp_path):
    result = runner.invoke(app, ["data", "build", "--target", "1", "--out", str(tmp_path / "d")])
    assert result.exit_code == 2 and "use --backend cpu" in result.output, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_exit_codes_and_json_errors(cache_dir, tmp_path):
    wrong = ["eval", str(TASKS / "linear_gelu.py"), "--solution", str(CANDIDATES / "affine_relu_ok"), "--backend",
             "cpu", "--cache-dir", str(cache_dir), "--json"]
    rejected = runner.invoke(app, wrong)
    assert rejected.exit_code == 0 and json.loads(rejected.stdout)["correct"] is False  # a verdict: 0
    assert runner.invoke(app, [*wrong, "--fail-on-reject"]).exit_code == 1
    missing = runner.invoke(app, ["eval", str(tmp_path / "nope.py"), "--solution", str(CANDIDATES / "affine_relu_ok"),
                                  "--backend", "cpu", "--json"])
    assert missing.exit_code == 2
    error = json.loads(missing.stdout)
    assert error["exit_code"] == 2 and "no such file" in error["error"]


def test_a_dataset_row_is_a_reference(cache_dir, fast_cli, tmp_path):
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


def test_the_command_line_follows_the_usual_conventions():
    from cuda_agent import __version__

    version = runner.invoke(app, ["--version"])
    assert version.exit_code == 0 and version.stdout.strip() == f"cuda-agent {__version__}"
    for command in (["eval"], ["eval-suite"], ["optimize"], ["data", "build"], ["report"], ["train", "demo"]):
        short, long = runner.invoke(app, [*command, "-h"]), runner.invoke(app, [*command, "--help"])
        assert short.exit_code == long.exit_code == 0 and short.stdout == long.stdout, command
        assert "<bool>" not in short.stdout and "--no-no-" not in short.stdout, command
        assert "{" not in next(line for line in short.stdout.splitlines() if "Usage:" in line), command
    usage = runner.invoke(app, ["eval", "-h"], env={"COLUMNS": "200"}).stdout
    assert "eval [OPTIONS] REFERENCE" in usage and "<cuda|cpu>" in usage and "<strict|kernelbench>" in usage
    assert "--compile" in runner.invoke(app, ["data", "build", "-h"]).stdout


def test_a_single_file_compile_error_shows_the_compilers_errors_on_the_candidates_lines(cache_dir, tmp_path):
    source = (CANDIDATES / "affine_relu_single.py").read_text()
    bad = tmp_path / "bad_single.py"
    bad.write_text(source.replace("const int64_t n = x.numel();", "const int64_t n = x.numel()"))
    line = next(i for i, text in enumerate(bad.read_text().splitlines(), 1) if "x.numel()" in text)
    result = runner.invoke(app, ["eval", str(TASKS / "affine_relu.py"), "--solution", str(bad), "--backend", "cpu",
                                 "--cache-dir", str(cache_dir)])
    assert result.exit_code == 0, result.output
    compiler = [ln.split("compiler", 1)[1].strip() for ln in result.stdout.splitlines()
                if ln.strip().startswith("compiler")]
    # gcc reports the missing ';' on the next line (the #pragma), in the candidate's own file and line numbers
    assert compiler[0].startswith(f"bad_single.py line {line + 1} (cpp_sources line ") and "error" in compiler[0]
    log = compiler[-1].split("whole log: ")[1].rstrip("]")
    assert "x.numel()" in Path(log).read_text() or "error" in Path(log).read_text()
    assert "failure    loading the candidate failed" in result.stdout and "  error " not in result.stdout
    assert "numerics" not in result.stdout and "0.00e+00" not in result.stdout  # nothing was compared
    assert all(not ln.endswith(" ") for ln in result.stdout.splitlines())  # no padding when piped
    assert "built (" in result.stderr  # phases as they end, when piped


def test_a_candidate_without_modelnew_is_told_so_before_anything_is_built(cache_dir, tmp_path):
    workspace = tmp_path / "ws"
    shutil.copytree(CANDIDATES / "affine_relu_ok", workspace)
    model_new = workspace / "model_new.py"
    model_new.write_text(model_new.read_text().replace("class ModelNew", "class ModelNu"))
    result = runner.invoke(app, ["eval", str(TASKS / "affine_relu.py"), "--solution", str(workspace), "--backend",
                                 "cpu", "--cache-dir", str(cache_dir), "--json"])
    verdict = json.loads(result.stdout)
    assert verdict["error"].startswith("model_new.py defines no ModelNew") and verdict["build"] == {}


def test_data_build_ends_with_the_paths_it_wrote(tmp_path):
    out = tmp_path / "data"
    result = runner.invoke(app, ["data", "build", "--target", "1", "--backend", "cpu", "--no-transformers",
                                 "--no-compile", "--workers", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    written = result.stdout.split("written:")[1].split()
    assert written == [str(out / name) for name in ("dataset.parquet", "dataset.jsonl", "splits", "stats.json",
                                                    "stats.md", "attempts.jsonl")]
    assert all(Path(path).exists() for path in written) and (out / "splits" / "train.jsonl").is_file()


UNWRITABLE_CASES = {  # every command that writes, with the unusable path in the option that names what it writes
    "data seeds": ["data", "seeds", "--out", "{bad}"],
    "data build": ["data", "build", "--target", "1", "--backend", "cpu", "--out", "{bad}"],
    "model fetch": ["model", "fetch", "--out", "{bad}"],
    "eval": ["eval", "{task}", "--solution", "{ok}", "--backend", "cpu", "--cache-dir", "{bad}"],
    "eval-suite --db": ["eval-suite", "{suite}", "--solutions", "{suite}", "--backend", "cpu", "--db",
                        "{bad}/r.sqlite"],
    "eval-suite --cache-dir": ["eval-suite", "{suite}", "--solutions", "{suite}", "--backend", "cpu", "--cache-dir",
                               "{bad}"],
    "optimize": ["optimize", "{task}", "--model", "m", "--backend", "cpu", "--out", "{bad}"],
    "optimize-suite": ["optimize-suite", "{suite}", "--model", "m", "--backend", "cpu", "--out", "{bad}"],
    "report": ["report", "{task}", "--out", "{bad}/r.html"],
    "train demo": ["train", "demo", "--backend", "cpu", "--out", "{bad}"],
    "train": ["train", "--stage", "agentic", "--model", "{suite}", "--data", "{task}", "--out", "{bad}"],
    "train verl": ["train", "verl", "--stage", "agentic", "--model", "{suite}", "--data", "{task}", "--out", "{bad}"],
}


@pytest.mark.parametrize("case", sorted(UNWRITABLE_CASES))
def test_an_unwritable_output_path_is_one_line_and_exit_2_before_any_work(case, tmp_path):
    """A path that cannot be written (here: one inside a regular file, which root cannot write either) is said in
    one line naming the option, exit 2, before anything runs (no traceback, nothing built, fetched or judged)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    fields = {"bad": str(blocker / "out"), "task": str(TASKS / "affine_relu.py"), "suite": str(tmp_path),
              "ok": str(CANDIDATES / "affine_relu_ok")}
    result = runner.invoke(app, [arg.format(**fields) for arg in UNWRITABLE_CASES[case]])
    option = next(arg for arg in UNWRITABLE_CASES[case] if "{bad}" in arg)
    option = UNWRITABLE_CASES[case][UNWRITABLE_CASES[case].index(option) - 1]
    assert result.exit_code == 2, (result.output, repr(result.exception))
    assert f"error: {option} {blocker / 'out'}" in result.output and "not a writable folder" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1, result.output


def test_report_never_writes_over_its_input_nor_an_earlier_report_unasked(tmp_path):
    """A report's JSON beside its HTML once replaced the metrics it was made from; an earlier report is replaced
    only with --overwrite; an input never."""
    run = tmp_path / "run"
    run.mkdir()
    metrics = run / "metrics.jsonl"
    metrics.write_text('{"step": 1, "reward_mean": 0.5}\n')
    (run / "metrics.json").write_text("{}")  # what `--out run/metrics.html` would write its JSON over
    kept = metrics.read_text()
    into_input = runner.invoke(app, ["report", str(run), "--out", str(run / "metrics.html"), "--overwrite"])
    assert into_input.exit_code == 2 and "input" in into_input.output, into_input.output
    assert (run / "metrics.json").read_text() == "{}" and metrics.read_text() == kept
    first = runner.invoke(app, ["report", str(metrics), "--out", str(tmp_path / "r.html")])
    assert first.exit_code == 0, first.output
    again = runner.invoke(app, ["report", str(metrics), "--out", str(tmp_path / "r.html")])
    assert again.exit_code == 2 and "--overwrite" in again.output, again.output
    forced = runner.invoke(app, ["report", str(metrics), "--out", str(tmp_path / "r.html"), "--overwrite"])
    assert forced.exit_code == 0, forced.output


def test_a_command_never_writes_into_a_folder_holding_other_files_unasked(tmp_path):
    """optimize, data seeds, data build and model convert refuse an --out that holds files they did not write
    (data build and data seeds continue their own earlier run); --overwrite allows it."""
    earlier = tmp_path / "run"
    earlier.mkdir()
    (earlier / "trajectory.jsonl").write_text('{"type": "system"}\n')
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    for args in (["optimize", str(TASKS / "affine_relu.py"), "--model", "m", "--backend", "cpu"],
                 ["data", "seeds"], ["data", "build", "--target", "1", "--backend", "cpu"],
                 ["model", "convert", str(gguf)]):
        result = runner.invoke(app, [*args, "--out", str(earlier)])
        assert result.exit_code == 2 and "earlier run" in result.output and "--overwrite" in result.output, args
        assert [p.name for p in earlier.iterdir()] == ["trajectory.jsonl"]
        assert (earlier / "trajectory.jsonl").read_text() == '{"type": "system"}\n'
    converted = runner.invoke(app, ["model", "convert", str(gguf), "--out", str(earlier), "--overwrite"])
    assert "earlier run" not in converted.output and "cannot convert" in converted.output  # it went on


def test_smaller_faults_are_told_plainly(cache_dir, tmp_path):
    """Issue 30's smaller points: each said in one line (or in the verdict) instead of ignored or misplaced."""
    task = str(TASKS / "affine_relu.py")
    single = tmp_path / "my_kernel.py"
    single.write_text("import torch\n\nclass ModelNew(torch.nn.Module:\n    pass\n")
    syntax = runner.invoke(app, ["eval", task, "--solution", str(single), "--backend", "cpu", "--json",
                                 "--cache-dir", str(cache_dir)])
    verdict = json.loads(syntax.stdout)
    assert verdict["error"].startswith("syntax error: my_kernel.py line 3:") and "model_new.py" not in verdict["error"]
    (tmp_path / "empty").mkdir()
    empty = json.loads(runner.invoke(app, ["eval", task, "--solution", str(tmp_path / "empty"), "--backend", "cpu",
                                           "--json", "--cache-dir", str(cache_dir)]).stdout)
    assert empty["device"] and empty["device"].startswith("cpu:") and "no model_new.py" in empty["error"]
    (tmp_path / "suite" / "level1").mkdir(parents=True)
    (tmp_path / "one" / "level1").mkdir(parents=True)
    shutil.copy(task, tmp_path / "one" / "level1" / "1_Affine.py")
    absent = tmp_path / "needs_a_module.py"  # said before any build, not after the candidate's
    absent.write_text("import not_a_module_here\n" + (TASKS / "affine_relu.py").read_text())
    for args, said in (
            (["eval", str(absent), "--solution", str(single), "--backend", "cpu"],
             "imports not_a_module_here, which is not installed"),
            (["eval", task, "--row", "3", "--solution", str(single), "--backend", "cpu"], "--row picks a row"),
            (["eval-suite", str(tmp_path / "suite"), "--solutions", str(tmp_path), "--backend", "cpu"], "no tasks"),
            (["eval-suite", str(tmp_path / "one"), "--solutions", str(tmp_path), "--backend", "cpu", "--gpus", "0"],
             "--gpus picks GPUs for the cuda backend")):
        refused = runner.invoke(app, args)
        assert refused.exit_code == 2 and said in refused.output, (args, refused.output)


def test_run_as_a_program_json_errors_and_narrow_help_are_whole():
    """The installed command (not typer's test runner): with --json, a bad option value is JSON on stdout like every
    other error; at 80 columns the help is click's plain layout, with choices and option names never cut."""
    import os
    import subprocess
    import sys

    def run(*args):
        return subprocess.run([sys.executable, "-m", "cuda_agent", *args], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "COLUMNS": "80"})

    bad = run("eval", str(TASKS / "affine_relu.py"), "--solution", "x", "--atol", "-1", "--json")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    error = json.loads(bad.stdout)
    assert error["exit_code"] == 2 and "--atol" in error["error"]
    help_text = run("eval", "--help").stdout
    assert "<strict|kernelbench>" in help_text and "--max-error-ratio" in help_text and "--fail-on-reject" in help_text
    assert "…" not in help_text and all(len(line) <= 80 for line in help_text.splitlines())


def test_train_expert_checks_its_options_and_says_which_tasks_it_cannot_fuse(tmp_path, cache_dir):
    """(The episodes themselves: tests/test_expert.py plays them through the same function.)"""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "transposed.py").write_text((TASKS / "affine_relu.py").read_text().replace(
        "def forward(self, x):", "def forward(self, x):\n        x = x.transpose(0, 1)"))
    bad = runner.invoke(app, ["train", "expert", "--data", str(tasks), "--out", str(tmp_path / "x"), "--shapes",
                              "direct,sideways"])
    assert bad.exit_code == 2 and "unknown sideways" in bad.output
    result = runner.invoke(app, ["train", "expert", "--data", str(tasks), "--out", str(tmp_path / "runs"),
                                 "--backend", "cpu", "--cache-dir", str(cache_dir)])
    assert result.exit_code != 0 and "the expert fuses none of these tasks" in result.output, result.output
    assert "0 episode(s) on 0 of 1 tasks" in result.output and "1 task(s) the expert cannot fuse" in result.output
    assert "transpose" in json.loads((tmp_path / "runs" / "skipped.json").read_text())[str(tasks / "transposed.py")]
