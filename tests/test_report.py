"""`cuda-agent report`: pages made from what eval-suite, the agent and the trainer really write, opened in a real
headless Chromium (installed by scripts/setup.sh): they draw without console errors and their tables hold the
input's numbers."""

import csv
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import CANDIDATES, TASKS, fast_commands, fast_config
from cuda_agent.agent import Environment, LoopConfig, ScriptedClient, run_episode
from cuda_agent.cli import app
from cuda_agent.judge import Judge
from cuda_agent.rl.trainer import MetricsLog

runner = CliRunner()


class Tables(HTMLParser):
    """Every table of a page as rows of cell texts (what a reader sees)."""

    def __init__(self):
        super().__init__()
        self.tables, self._cell = [], None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append(self._cell.strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def tables(page: str) -> list[list[list[str]]]:
    parser = Tables()
    parser.feed(page)
    return parser.tables


def open_in_chromium(page: Path, screenshot: Path) -> str:
    """The page's DOM after its scripts ran; fails on any console message (errors, warnings, uncaught exceptions)
    and takes a screenshot."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "Chromium is not installed: scripts/setup.sh installs it (apt-get install chromium)"
    flags = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
             "--virtual-time-budget=10000", "--window-size=1280,1600"]
    run = subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-2000:]
    console = [line for line in run.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, "\n".join(console)
    shot = subprocess.run([*flags, f"--screenshot={screenshot}", page.as_uri()], capture_output=True, text=True,
                          timeout=180)
    assert shot.returncode == 0 and screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", shot.stderr[-2000:]
    assert screenshot.stat().st_size > 20_000  # drawn, not blank
    return run.stdout


def charts_drawn(dom: str) -> int:
    """Plots plotly.js drew into the page (each draws one SVG of class main-svg per plot area)."""
    assert 'id="script-errors"></div>' in dom or 'id="script-errors" style=""></div>' in dom, "script errors shown"
    return len(re.findall(r'<svg class="main-svg"', dom))


@pytest.fixture(scope="module")
def suite_runs(cache_dir, tmp_path_factory):
    """Two eval-suite runs of one small suite into one database: A with every solution, B with one missing."""
    root = tmp_path_factory.mktemp("report-suite")
    suite, a, b = root / "suite", root / "solutions-a", root / "solutions-b"
    (suite / "level1").mkdir(parents=True)
    (suite / "level2").mkdir()
    shutil.copy(TASKS / "affine_relu.py", suite / "level1" / "1_AffineReLU.py")
    shutil.copy(TASKS / "linear_gelu.py", suite / "level1" / "2_LinearGELU.py")  # no solution in either run
    shutil.copy(TASKS / "affine_relu.py", suite / "level2" / "1_Affine.py")
    shutil.copytree(CANDIDATES / "affine_relu_ok", a / "level1" / "1_AffineReLU")
    (a / "level2").mkdir(parents=True)
    shutil.copy(CANDIDATES / "affine_relu_single.py", a / "level2" / "1_Affine.py")
    shutil.copytree(CANDIDATES / "affine_relu_ok", b / "level1" / "1_AffineReLU")
    reports = {}
    with fast_commands():  # the pages show whatever was measured: fast_config's timing
        for name, solutions in (("a", a), ("b", b)):
            result = runner.invoke(app, ["eval-suite", str(suite), "--solutions", str(solutions), "--backend", "cpu",
                                         "--json", "--trials", "2", "--cache-dir", str(cache_dir), "--db",
                                         str(root / "results.sqlite")])
            assert result.exit_code == 0, result.output
            reports[name] = json.loads(result.stdout)
            (root / f"{name}.json").write_text(result.stdout)
    return root, reports


def test_a_suite_page_from_the_database_holds_every_number_and_draws_in_chromium(suite_runs, tmp_path):
    root, reports = suite_runs
    page = tmp_path / "suite.html"
    result = runner.invoke(app, ["report", str(root / "results.sqlite"), "--out", str(page)])
    assert result.exit_code == 0, result.output
    report = reports["b"]  # the database's latest run
    html = page.read_text()
    assert "<script src=" not in html and "https://" not in html.split("<script>")[0]  # nothing fetched
    levels, tasks = tables(html)[0], tables(html)[-1]  # (between them: KernelBench's fast_p)
    overall = next(row for row in levels if row[0] == "overall")
    assert overall[1] == str(report["overall"]["n"]) and overall[2] == f"{100 * report['overall']['pass_rate']:.1f}%"
    rows = {row[1]: row for row in tasks[1:]}
    assert len(rows) == 3
    for record in report["tasks"]:
        row, verdict = rows[record["task"].split("/")[-1]], record["verdict"]
        assert row[2] == str(verdict["reward"]) and row[3] == ("yes" if verdict["correct"] else "no")
        if verdict["correct"]:
            assert row[6] == f"{verdict['times_us']['candidate']:.1f}"
            speedup = verdict["speedup_vs_compile"]  # (none credited where the timing was too noisy)
            assert row[8] == (f"{speedup:.2f}x" if speedup is not None else "-")
        else:
            assert row[-1] == verdict["error"]
    with page.with_suffix(".csv").open() as f:
        table = list(csv.DictReader(f))
    assert [r["task"] for r in table] == [t["task"] for t in report["tasks"]]
    assert json.loads(page.with_suffix(".json").read_text())["overall"] == report["overall"]
    dom = open_in_chromium(page, tmp_path / "suite.png")
    assert charts_drawn(dom) >= 1
    assert "no solution found for level1/2_LinearGELU.py" in dom
    # a click on "reward" sorts the tasks by it, a second click the other way
    clicked = tmp_path / "clicked.html"
    click = '<script>document.querySelectorAll("table.sortable th")[2].click();</script>'
    for clicks, order in ((1, sorted), (2, lambda xs: sorted(xs, reverse=True))):
        clicked.write_text(html.replace("</body>", click * clicks + "</body>"))
        rewards = [int(row[2]) for row in tables(open_in_chromium(clicked, tmp_path / "clicked.png"))[-1][1:]]
        assert rewards == order(rewards) and len(set(rewards)) > 1


def test_two_runs_side_by_side_show_the_changes(suite_runs, tmp_path):
    root, reports = suite_runs
    page = tmp_path / "compare.html"
    result = runner.invoke(app, ["report", str(root / "a.json"), "--compare", str(root / "b.json"), "--out",
                                 str(page)])
    assert result.exit_code == 0, result.output
    summary, tasks = tables(page.read_text())[0], tables(page.read_text())[1]
    a, b = reports["a"]["overall"], reports["b"]["overall"]
    overall = next(row for row in summary if row[0] == "overall")
    assert overall[1] == (f"{100 * a['pass_rate']:.1f}% → {100 * b['pass_rate']:.1f}% "
                          f"({100 * (b['pass_rate'] - a['pass_rate']):.1f}%)")
    affine = next(row for row in tasks if row[1] == "1_Affine.py")  # solved in A, missing in B
    reward_a = next(t["verdict"]["reward"] for t in reports["a"]["tasks"] if t["task"] == "level2/1_Affine.py")
    assert affine[2:5] == [str(reward_a), "-1", f"{-1 - reward_a:+d}"] and "no solution" in affine[-1]
    assert charts_drawn(open_in_chromium(page, tmp_path / "compare.png")) >= 1


def test_runs_of_a_database_are_listed_picked_and_compared_by_number(suite_runs, tmp_path):
    root, reports = suite_runs
    db = str(root / "results.sqlite")
    assert (reports["a"]["run"]["id"], reports["b"]["run"]["id"]) == ("1", "2")
    listed = runner.invoke(app, ["report", db, "--list"])
    assert listed.exit_code == 0, listed.output
    lines = listed.stdout.splitlines()[1:]
    assert [line.split()[0] for line in lines] == ["1", "2"]
    assert lines[0].endswith("solutions-a") and lines[1].endswith("solutions-b")
    page = tmp_path / "first.html"
    assert runner.invoke(app, ["report", db, "--run", "1", "--out", str(page)]).exit_code == 0
    rows = {row[1]: row for row in tables(page.read_text())[-1][1:]}
    assert rows["1_Affine.py"][3] == "yes"  # solved in run 1 (A), missing in the latest (B)
    assert "run 1, ended" in page.read_text() and "on cpu:" in page.read_text()  # when, where, with what
    for args, said in ((["--compare", db], "same run"), (["--run", "7"], "has no run 7 (runs 1-2")):
        refused = runner.invoke(app, ["report", db, *args, "--out", str(tmp_path / "no.html")])
        assert refused.exit_code == 2 and said in refused.output, refused.output
    compared = tmp_path / "compare.html"
    assert runner.invoke(app, ["report", db, "--run", "1", "--compare-run", "2", "--out", str(compared)]
                         ).exit_code == 0
    html = compared.read_text()
    assert "passing in A, not in B: 1 (level2/1_Affine.py)" in html
    overall = next(row for row in html.split("<tr>") if ">overall<" in row)
    changes = re.findall(r'class="(good|bad|muted)">\(', overall)  # pass, faster x2, geomean x2, mean reward
    assert changes[0] == "bad" and changes[3:5] == ["muted", "muted"]  # B's geomeans are over fewer tasks


def test_a_reward_below_3_says_why_in_the_table_the_page_and_the_comparison(tmp_path, capsys):
    from cuda_agent.cli.common import print_report
    from cuda_agent.judge.verdict import Verdict

    noisy = Verdict(reward=1, compiled=True, correct=True, speedup_vs_eager=1.52, speedup_vs_compile=1.40,
                    warnings=["timing too noisy to credit any speedup (eager baseline spread 40%): reward for "
                              "correctness only; rerun on a quieter machine"]).to_dict()
    slower = Verdict(reward=2, compiled=True, correct=True, speedup_vs_eager=1.31, speedup_vs_compile=0.92).to_dict()
    del noisy["reason"], slower["reason"]  # as stored before verdicts carried it: derived again on reading
    records = [{"level": "level1", "task": "level1/1_A.py", "solution": "s", "verdict": noisy},
               {"level": "level1", "task": "level1/2_B.py", "solution": "s", "verdict": slower}]
    from cuda_agent.suite.evaluate import report

    (tmp_path / "a.json").write_text(json.dumps(report(records)))
    (tmp_path / "b.json").write_text(json.dumps(report(records[::-1])))
    print_report(report(records), "suite", as_json=False)
    table = capsys.readouterr().out
    assert "level1/1_A.py  reward  1  timing too noisy to credit any speedup" in table
    assert "level1/2_B.py  reward  2  beats eager (1.31x) but not torch.compile (0.92x)" in table
    page = tmp_path / "page.html"
    assert runner.invoke(app, ["report", str(tmp_path / "a.json"), "--out", str(page)]).exit_code == 0
    reasons = {row[1]: row[-1] for row in tables(page.read_text())[-1][1:]}
    assert reasons["1_A.py"].startswith("timing too noisy") and reasons["2_B.py"].startswith("beats eager")
    both = tmp_path / "both.html"
    assert runner.invoke(app, ["report", str(tmp_path / "a.json"), "--compare", str(tmp_path / "b.json"), "--out",
                               str(both)]).exit_code == 0
    assert {row[1]: row[-1] for row in tables(both.read_text())[1][1:]}["1_A.py"].startswith("timing too noisy")


def test_an_agent_run_page_shows_each_turn_and_each_verdict(cache_dir, tmp_path):
    ok = CANDIDATES / "affine_relu_ok"
    files = {str(p.relative_to(ok)): p.read_text() for p in ok.rglob("*") if p.is_file()}

    def call(i, name, **arguments):
        return {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}

    script = [{"role": "assistant", "content": "Reading.", "tool_calls": [call(1, "read_file", path="model.py")]},
              {"role": "assistant", "content": "Writing the kernel.", "tool_calls": [
                  call(i, "write_file", path=path, content=text) for i, (path, text) in enumerate(files.items(), 2)]},
              {"role": "assistant", "content": "", "tool_calls": [call(9, "verify")]},
              {"role": "assistant", "content": "Done.", "tool_calls": [call(10, "finish", summary="ok")]}]
    run_dir = tmp_path / "run"
    with Judge("cpu", fast_config(cache_dir)) as judge:
        summary = run_episode(Environment(judge, run_dir, use_sandbox=False), ScriptedClient(script),
                              TASKS / "affine_relu.py", run_dir, LoopConfig(max_turns=6))
    assert summary.final_verdict["correct"], summary
    page = tmp_path / "agent.html"
    assert runner.invoke(app, ["report", str(run_dir), "--out", str(page)]).exit_code == 0
    html = page.read_text()
    overview, turns = tables(html)[0], tables(html)[1]
    assert ["stop", "finish"] in overview and ["turns", "4"] in overview
    who = [row[2] for row in turns[1:]]
    assert who[:2] == ["system", "user"] and who.count("model") == 4 and "verify" in who
    verify = turns[1:][who.index("verify")]
    records = [json.loads(line) for line in (run_dir / "trajectory.jsonl").read_text().splitlines()]
    verified = next(r["verdict"] for r in records if r.get("tool") == "verify")  # (the final one is judged again)
    assert verify[4].startswith("correct") and f"reward {verified['reward']}" in verify[4]
    speedup = verified["speedup_vs_compile"]  # (none credited where the timing was too noisy)
    assert (f"{speedup:.2f} x compile" in verify[4]) if speedup is not None else "x compile" not in verify[4]
    steps = list(csv.DictReader(page.with_suffix(".csv").open()))
    assert [r["who"] for r in steps] == who
    assert charts_drawn(open_in_chromium(page, tmp_path / "agent.png")) >= 1


def test_a_training_page_plots_every_metric_over_steps(tmp_path):
    (tmp_path / "train").mkdir()
    log = MetricsLog(tmp_path / "train", tensorboard=False)
    for step in range(1, 6):
        log.write(step, {"reward_mean": -1 + 0.5 * step, "pass_rate": step / 5, "policy_loss": 0.1 / step,
                         "value_loss": 1.0 / step, "approx_kl": 0.01 * step, "entropy": 2.0 - 0.1 * step,
                         "clip_fraction": 0.2, "explained_variance": float("nan") if step < 3 else 0.5,
                         "picks": {"A": step}})
    page = tmp_path / "train.html"
    assert runner.invoke(app, ["report", str(tmp_path / "train"), "--out", str(page)]).exit_code == 0
    steps = tables(page.read_text())[0]
    header = steps[0]
    assert header[:8] == ["step", "mean reward of the batch", "pass rate (correct kernels)",
                          "policy loss (PPO, clipped)", "value loss (critic)", "KL to the policy that sampled",
                          "policy entropy", "tokens with a clipped ratio"] and "picks" not in header  # words, not keys
    assert [row[header.index("mean reward of the batch")] for row in steps[1:]] == ["-0.5", "0", "0.5", "1", "1.5"]
    # not a number (MetricsLog writes null): shown as "-" and left out of the plot
    assert [row[header.index("explained_variance")] for row in steps[1:]] == ["-", "-", "0.5", "0.5", "0.5"]
    dom = open_in_chromium(page, tmp_path / "train.png")
    assert charts_drawn(dom) >= 1 and dom.count('class="trace scatter') == 7  # one line per metric
    titles = re.findall(r'class="annotation-text"[^>]*data-unformatted="([^"]+)"', dom)
    assert set(titles) == set(header[1:8])
    axes = set(re.findall(r'class="[xy]\d*title"[^>]*>([^<]+)<', dom))  # every axis says what it measures
    assert {"training step", "milestone reward (-1..3)", "fraction of tokens", "nats per token"} <= axes, axes


def test_bad_inputs_are_one_clear_line(tmp_path):
    (tmp_path / "other.json").write_text(json.dumps({"hello": 1}))
    (tmp_path / "empty").mkdir()
    cases = [(["report", str(tmp_path / "nope"), "--out", str(tmp_path / "x.html")], "no such file or folder"),
             (["report", str(tmp_path / "other.json"), "--out", str(tmp_path / "x.html")], "not a suite report"),
             (["report", str(tmp_path / "empty"), "--out", str(tmp_path / "x.html")], "no report.json"),
             (["report", str(tmp_path / "other.json"), "--out", str(tmp_path / "x.png")], "give an .html file")]
    for args, message in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and message in result.output, result.output
    (tmp_path / "t").mkdir()
    MetricsLog(tmp_path / "t", tensorboard=False).write(1, {"reward_mean": 1.0})
    result = runner.invoke(app, ["report", str(tmp_path / "t"), "--compare", str(tmp_path / "t"), "--out",
                                 str(tmp_path / "x.html")])
    assert result.exit_code == 2 and "--compare takes two suite inputs" in result.output
    assert not (tmp_path / "x.html").exists()


def _recipe_folder(root: Path, seed: int, ppo_reward: float) -> Path:
    """A `train recipe` folder as the recipe writes it: recipe.json and its PPO stage's metrics.jsonl."""
    row = lambda reward, share: {"pass_rate": share, "pass_rate_ci": [share - 0.1, share + 0.1], "share_2": share / 2,  # noqa: E731
                                 "share_2_ci": [0, share], "share_3": 0.0, "share_3_ci": [0, 0], "mean_reward": reward,
                                 "mean_reward_ci": [reward - 0.2, reward + 0.2], "geomean_speedup_vs_compile": None}
    folder = root / f"seed{seed}"
    (folder / "ppo").mkdir(parents=True)
    (folder / "recipe.json").write_text(json.dumps({
        "arm": "full", "seed": seed,
        "heldout": {"base": row(-1.0, 0.0), "sft": row(0.0, 0.5), "ppo": row(ppo_reward, 0.75)},
        "controls": {"best_of_k": row(0.5, 0.6)}}))
    log = MetricsLog(folder / "ppo", tensorboard=False)
    for step in (1, 2, 3):
        log.write(step, {"reward_mean": ppo_reward * step / 3, "entropy": 1.0 + seed, "cut_share": 0.1,
                         "policy_violations": 0})
    return folder


def test_a_recipe_page_shows_the_held_out_table_over_seeds_and_the_signals_with_bands(tmp_path):
    a, b = _recipe_folder(tmp_path, 0, 1.0), _recipe_folder(tmp_path, 1, 2.0)
    page = tmp_path / "recipe.html"
    result = runner.invoke(app, ["report", str(a), "--seed-run", str(b), "--out", str(page)])
    assert result.exit_code == 0, result.output
    held = {row[0]: row for row in tables(page.read_text())[0][1:]}
    assert list(held) == ["base", "sft", "ppo", "best_of_k"] and held["best_of_k"][1] == "control"
    assert held["ppo"][6] == "1.500 ± 0.707 (n=2)"  # mean reward over the two seeds
    rows = list(csv.DictReader((tmp_path / "recipe.csv").open()))
    assert [r["row"] for r in rows] == list(held) and float(rows[2]["mean_reward"]) == 1.5
    dom = open_in_chromium(page, tmp_path / "recipe.png")
    titles = set(re.findall(r'class="annotation-text"[^>]*data-unformatted="([^"]+)"', dom))
    assert titles == {"mean reward (train tasks)", "actor entropy", "replies cut at the length limit",
                      "episodes with a policy violation"}
    assert dom.count('class="trace scatter') == 8  # per signal a band (lowest to highest seed) and the mean
    one = tmp_path / "one.html"
    assert runner.invoke(app, ["report", str(a), "--out", str(one)]).exit_code == 0
    assert tables(one.read_text())[0][3][6] == "1.000 [0.800, 1.200]"  # one seed: its bootstrap interval
    bad = runner.invoke(app, ["report", str(a), "--seed-run", str(a / "ppo"), "--out", str(tmp_path / "x.html")])
    assert bad.exit_code == 2 and "--seed-run takes recipe folders" in bad.output


def test_the_module_section_shows_the_export_and_the_whole_model_check():
    """`optimize --hf-model`'s module.json on the run's page: the export, then the whole model's outputs and time
    (a failed check reads as such)."""
    from cuda_agent.report.module_view import module_section

    record = {"task": "run/task.py", "task_notes": ["past_key_values (DynamicCache) dropped"],
              "export": {"package": "run/export/llamamlp_kernel", "kernels_build": "run/export/build/torch211-cu130",
                         "namespace": "cuda_agent_llamamlp_kernel_0123", "class": "LlamaMLP", "notes": []},
              "check": {"replaced": ["model.layers.0.mlp", "model.layers.1.mlp"], "max_abs_diff": 2.6e-6,
                        "within_tolerance": True, "error_vs_fp64": {"original": 3.0e-6, "replaced": 3.4e-6},
                        "time_us": {"original": 1000.0, "replaced": 800.0}, "speedup": 1.25}}
    title, body = module_section(record)
    assert "checked in the whole model" in title
    assert "run/export/llamamlp_kernel" in body and "replaced 2 submodule(s)" in body and "1.250x" in body
    assert "<span class='good'>match</span>" in body and "DynamicCache" in body
    record["check"]["within_tolerance"] = False
    assert "<span class='bad'>differ</span>" in module_section(record)[1]
    record["export"] = None
    assert "nothing exported" in module_section(record)[1]
