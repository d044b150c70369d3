"""Held-out evaluation (rl/evaluation.py, rl/scores.py, `train eval`): the numbers and their intervals, a local
checkpoint's episodes on the batch sampler, an endpoint's, and a rerun that resumes."""

import json
import shutil
from dataclasses import replace

import pytest
import torch
from typer.testing import CliRunner

from conftest import ROOT, TASKS, fast_config
from cuda_agent.cli import app
from cuda_agent.rl.expert.corpus import op_set
from cuda_agent.rl.scores import EpisodeRecord, paired_difference, summary

runner = CliRunner()


def rec(task: str, reward: float, speedup: float | None = None, malformed: int = 0) -> EpisodeRecord:
    return EpisodeRecord(task, 0, reward, speedup, 3, 3, malformed, "finish", "")


def test_the_summary_is_over_tasks_with_bootstrap_intervals_and_paired_differences():
    before = [rec("a", -1), rec("a", -1), rec("b", 1, 0.5), rec("b", -1), rec("c", 2, 1.0), rec("c", 2, 1.0)]
    row = summary(before, resamples=500)
    assert row["tasks"] == 3 and row["episodes"] == 6
    assert row["pass_rate"] == pytest.approx((0 + 0.5 + 1) / 3)  # each task weighs the same
    assert row["share_2"] == pytest.approx(1 / 3) and row["share_3"] == 0
    lo, hi = row["pass_rate_ci"]
    assert lo <= row["pass_rate"] <= hi and lo < hi
    assert row["geomean_speedup_vs_compile"] == pytest.approx((0.5 * 1.0 * 1.0) ** (1 / 3))
    assert summary([rec("a", 1, 1.0), rec("b", 1, 1.0)], resamples=50)["pass_rate_ci"] == [1.0, 1.0]
    after = [rec("a", 1, 1.0), rec("b", 3, 2.0), rec("c", 3, 2.0), rec("d", 3, 2.0)]  # d: not in both
    diff = paired_difference(after, before, "mean_reward", resamples=500)
    assert diff["tasks"] == 3 and diff["difference"] == pytest.approx((2 + 3 + 1) / 3)
    assert diff["ci"][0] > 0  # better on every shared task
    with pytest.raises(ValueError, match="share no task"):
        paired_difference([rec("x", 1)], before)
    # two run folders' copies of one export (another arm's linked evaluation): the same tasks
    theirs = [rec(f"/runs/paper/tasks/held/{r.task}.py", r.reward) for r in before]
    ours = [rec(f"/runs/full/tasks/held/{r.task}.py", r.reward + 1) for r in before]
    assert paired_difference(ours, theirs, "mean_reward", resamples=50)["difference"] == pytest.approx(1)


def test_train_eval_plays_a_checkpoint_writes_the_table_and_resumes(tiny_checkpoint, tmp_path, cache_dir):
    model = tiny_checkpoint
    args = ["train", "eval", "--model", str(model), "--data", str(TASKS / "affine_relu.py"), "--out",
            str(tmp_path / "eval"), "--backend", "cpu", "--samples", "3", "--max-turns", "1", "--max-new-tokens",
            "12", "--cache-dir", str(cache_dir)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "eval" / "eval.json").read_text())
    row = report["summary"]
    assert row["episodes"] == 3 and row["tasks"] == 1 and row["mean_reward"] == -1 and row["pass_rate"] == 0
    assert "| pass rate |" in (tmp_path / "eval" / "eval.md").read_text()
    runs = sorted((tmp_path / "eval" / "episodes").glob("*/sample_*/trajectory.jsonl"))
    assert len(runs) == 3 and not list((tmp_path / "eval" / "episodes").glob("*/sample_*/workspace"))
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and "3 of 3 episodes played before" in again.output
    assert runs[0].stat().st_mtime == sorted((tmp_path / "eval" / "episodes").glob("*/sample_*/trajectory.jsonl"))[
        0].stat().st_mtime
    both = runner.invoke(app, ["train", "eval", "--model", str(model), "--endpoint", "x", "--data",
                               str(TASKS / "affine_relu.py"), "--out", str(tmp_path / "e2")])
    assert both.exit_code == 2 and "one of --model" in both.output


def test_train_eval_of_an_endpoint_counts_its_malformed_calls(tmp_path, cache_dir):
    from test_agent import ScriptedEndpoint

    broken = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "write_file", "arguments": "{not json"}}]}
    endpoint = ScriptedEndpoint(lambda request: broken)
    try:
        result = runner.invoke(app, ["train", "eval", "--endpoint", "scripted", "--base-url", endpoint.url, "--data",
                                     str(TASKS / "affine_relu.py"), "--out", str(tmp_path / "eval"), "--backend",
                                     "cpu", "--samples", "2", "--cache-dir", str(cache_dir)],
                               env={"OPENAI_API_KEY": "test"})
    finally:
        endpoint.close()
    assert result.exit_code == 0, result.output
    row = json.loads((tmp_path / "eval" / "eval.json").read_text())["summary"]
    assert row["episodes"] == 2 and row["mean_reward"] == -1 and row["malformed_call_rate"] == 1.0


def test_train_recipe_runs_every_stage_on_the_cpu_and_resumes(tiny_checkpoint, tmp_path, cache_dir, fast_cli,
                                                                monkeypatch):
    """The whole recipe on a tiny model: the expert's episode, SFT on it, the evaluations, RFT, value, PPO; then a
    rerun does nothing again. (A tiny random model writes no tool call: every held-out reward is -1.)"""
    model = tiny_checkpoint
    args = ["train", "recipe", "--model", str(model), "--data", str(TASKS / "affine_relu.py"), "--held-out",
            str(TASKS / "row_mean.py"), "--out", str(tmp_path / "run-full-0"), "--backend", "cpu", "--shapes", "direct",
            "--sft-steps", "1", "--rft-samples", "1", "--rft-steps", "1", "--value-steps", "1", "--ppo-steps", "1",
            "--batch", "2", "--samples", "1", "--max-turns", "1", "--max-new-tokens", "8", "--lora-rank", "2",
            "--sft-lora-rank", "0", "--sft-corpus", "2", "--sft-repeat", "3", "--epochs", "3", "--minibatches", "1",
            "--group", "2", "--cache-dir", str(cache_dir)]
    shared = runner.invoke(app, [*args, "--validation", str(TASKS / "affine_relu.py")])
    assert shared.exit_code == 2 and "also train or held-out tasks" in shared.output, shared.output
    uneven = runner.invoke(app, [*args, "--group", "3"])  # (last: it replaces the 2 above)
    assert uneven.exit_code == 2 and "dividing the batch (2)" in uneven.output, uneven.output
    args += ["--validation", str(TASKS / "linear_gelu.py")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "run-full-0" / "recipe.json").read_text())
    assert list(report["heldout"]) == ["base", "sft", "rft", "ppo"] and report["arm"] == "full"
    assert report["config"]["stage"]["train"]["epochs"] == 3 and report["config"]["stage"]["train"]["minibatches"] == 1
    assert report["config"]["stage"]["group"] == 2
    assert "sft: a pool of 5 conversations (1 episode(s) x 3, 2 first replies)" in result.output, result.output
    assert all(row["mean_reward"] == -1 for row in report["heldout"].values())
    assert report["ppo_vs_sft"]["mean_reward"]["difference"] == 0
    assert report["critic_on_heldout"]["episodes"] == 1  # (its variance: none, every return is -1)
    for step in ("expert", "sft", "rft_samples", "rft", "value", "value_check", "ppo", "eval_best_of_2", "fft_samples",
                 "eval_fft", "expert_heldout"):
        assert (tmp_path / "run-full-0" / step / "done.json").is_file(), step
    controls = report["controls"]
    assert sorted(controls) == ["best_of_k", "expert_best", "expert_fast", "expert_random", "filter_finetune"]
    assert controls["best_of_k"]["episodes"] == 1 and controls["filter_finetune"]["mean_reward"] == -1
    assert "passes the RFT filter" in report["notes"]["filter_finetune"]  # the tiny model succeeded nowhere
    assert not (tmp_path / "run-full-0" / "fft").exists()
    assert controls["expert_fast"]["pass_rate"] == 1  # the expert's kernel for the held-out row mean, judged
    assert controls["expert_best"]["mean_reward"] >= controls["expert_random"]["mean_reward"]
    assert report["ppo_vs_expert_best"]["mean_reward"]["difference"] < 0
    ppo = [json.loads(line) for line in (tmp_path / "run-full-0" / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert {"policy_violations", "cut_share", "response_tokens_mean", "entropy"} <= set(ppo[-1])
    assert ppo[-1]["cut_share"] == 1  # 8 new tokens a turn: every reply is cut
    assert "a policy that imitates it is cut mid-reply" in result.output  # the expert's turns are > 8 tokens
    composed = [t.read_text() for t in sorted((tmp_path / "run-full-0" / "corpus" / "tasks").glob("corpus_*.py"))]
    evaluated = {op_set((TASKS / name).read_text()) for name in ("row_mean.py", "linear_gelu.py")}
    assert len(composed) == 2 and None not in evaluated and not evaluated & {op_set(t) for t in composed}
    assert "sft trains on 1 episode(s) and 2 corpus task(s)' first replies and verify calls" in result.output, \
        result.output
    sft = [json.loads(line) for line in (tmp_path / "run-full-0" / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert sft[-1]["sft_loss"] > 0 and sft[-1]["reward_mean"] >= 1  # trained on the expert's judged episode
    assert sft[-1]["probe_replies"] == 1 and sft[-1]["probe_nll"] > 0  # the expert's reply on the validation task
    assert "sft step 1/" in result.output and "rft step 1/" in result.output  # each progress line names its step
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and again.output.count("done before") == 16, again.output
    bad = runner.invoke(app, [*args[:-2], "--arm", "sideways"])
    assert bad.exit_code == 2 and "unknown arm" in bad.output
    # the same folder with another setting: refused at the first step it changes, nothing mixed
    other = runner.invoke(app, [*args, "--ppo-steps", "2"])
    assert other.exit_code == 2 and "ppo holds a result of other settings or inputs" in other.output, other.output
    direct = runner.invoke(app, [*args, "--sft-shapes", "direct"])  # which shapes SFT reads is in its key
    assert direct.exit_code == 2 and "sft holds a result of other settings" in direct.output, direct.output
    at = args.index("--sft-corpus")
    plain = runner.invoke(app, [*args[:at], *args[at + 2:]])  # the corpus SFT read is in its key
    assert plain.exit_code == 2 and "sft holds a result of other settings" in plain.output, plain.output
    with monkeypatch.context() as patch:  # episodes the expert would now write otherwise are played again
        patch.setattr("cuda_agent.rl.recipe.SCRIPT_VERSION", -1)
        rewritten = runner.invoke(app, args)
    assert rewritten.exit_code == 2 and "expert holds a result of other settings" in rewritten.output
    unplayed = runner.invoke(app, [*args, "--sft-shapes", "fix"])
    assert unplayed.exit_code == 2 and "the expert plays only direct" in unplayed.output, unplayed.output
    colder = runner.invoke(app, [*args, "--temperature", "0.5"])  # every sampled step changes
    assert colder.exit_code == 2 and "holds a result of other settings or inputs" in colder.output, colder.output
    _another_arm_takes_the_steps_it_shares(args, tmp_path, report)
    _a_run_brought_back_with_its_adapters_only_is_rebuilt(args, tmp_path)


def _another_arm_takes_the_steps_it_shares(args: list[str], tmp_path, report: dict) -> None:
    """no_value on the same seed, with --reuse: the eight steps before the value stage are linked, not run."""
    at = args.index("--out") + 1
    arm = runner.invoke(app, [*args[:at], str(tmp_path / "no_value"), *args[at + 1:], "--arm", "no_value",
                              "--controls", "", "--reuse", str(tmp_path / "run-full-0")])
    assert arm.exit_code == 0, arm.output
    assert arm.output.count(f"taken from {tmp_path / 'run'}") == 8, arm.output
    assert (tmp_path / "no_value" / "rft").is_symlink() and not (tmp_path / "no_value" / "value").exists()
    theirs = json.loads((tmp_path / "no_value" / "recipe.json").read_text())
    assert theirs["heldout"]["rft"] == report["heldout"]["rft"] and "ppo" in theirs["heldout"]


def _a_run_brought_back_with_its_adapters_only_is_rebuilt(args: list[str], tmp_path) -> None:
    """What comes back from the device machine, packed by scripts/recipe_h200.sh (`collect`: no full weights, no
    links; the adapters, the value heads, trainer.pt) and put back as a later machine does (`stash` with RESTORE=,
    `prepare`) where the run was: a rerun there trains the full-weight SFT again from its seed (the same weights on
    the CPU), merges each later actor and critic from its adapter (equal to the originals) and trains PPO again from
    the rebuilt value critic. A stage whose adapter did not come cannot be rebuilt, and a step that needs it says
    so."""
    import os
    import subprocess

    from safetensors.torch import load_file

    moved, back = tmp_path / "run-full-0", tmp_path / "back"
    back.mkdir()
    (tmp_path / "data").mkdir()
    for split in ("train", "held_out"):  # (what `prepare` cuts the task lists from; the rerun reads its own)
        (tmp_path / "data" / f"{split}.jsonl").write_text("")
    env = {**os.environ, "KEEP": str(tmp_path), "OUT": str(back), "SMOL": str(tmp_path / "no-smol"),
           "DATA": str(tmp_path / "data")}
    script = ROOT / "scripts" / "recipe_h200.sh"
    for command in (["collect", "0"], ["stash"], ["prepare"]):
        if command == ["stash"]:
            moved.rename(tmp_path / "original")
            env["RESTORE"] = str(back)
            (tmp_path / "model").symlink_to(args[args.index("--model") + 1])  # (converted on a machine's first call)
        done = subprocess.run(["bash", str(script), *command], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    assert "restored 16 finished steps" in done.stdout, done.stdout  # (the controls are steps too)
    assert not list(moved.rglob("model.safetensors")) and not (moved / "sft" / "checkpoint").exists()
    moved_args = args
    task = moved / "corpus" / "tasks" / "corpus_00001.py"
    source = task.read_text()
    task.unlink()
    short = runner.invoke(app, moved_args)  # a corpus that came without its tasks is not read as a smaller one
    assert short.exit_code == 2 and "holds 1 of its 2 tasks" in short.output, short.output
    task.write_text(source)
    again = runner.invoke(app, moved_args)  # every step done: no weights needed, none made
    assert again.exit_code == 0 and again.output.count("done before") == 16, again.output
    assert "merged from its adapter" not in again.output and "trained again" not in again.output
    shutil.rmtree(moved / "ppo")  # to be trained again: from value's actor and critic
    adapters = {name: next(moved.glob(f"{name}/checkpoint-*/{part}/adapter/adapter_model.safetensors"))
                for name, part in (("rft", "actor"), ("value", "critic"))}
    kept = {name: path.read_bytes() for name, path in adapters.items()}
    adapters["rft"].unlink()  # (a run packed without an adapter's weights: its config only)
    lost = runner.invoke(app, moved_args)
    assert lost.exit_code == 2 and "nor a LoRA adapter's to rebuild them: delete" in lost.output, lost.output
    assert lost.output.count("trained again from its seed") == 1  # SFT first: RFT's adapter is merged into it
    adapters["rft"].write_bytes(kept["rft"])
    adapters["value"].unlink()
    critic = runner.invoke(app, moved_args)
    assert critic.exit_code == 2 and "the critic value trained did not come with its checkpoint" in critic.output
    adapters["value"].write_bytes(kept["value"])
    again = runner.invoke(app, moved_args)
    assert again.exit_code == 0 and again.output.count("done before") == 15, again.output
    made = lost.output + critic.output + again.output
    assert made.count("trained again from its seed") == 1 and "sft trained again: last loss" in made
    assert made.count("actor's weights merged from its adapter") == 2  # rft's, value's
    assert made.count("kept unchanged, rebuilt") == 1  # rft's (the SFT replay made its own)
    assert made.count("critic's weights merged from its adapter") == 1  # value's
    assert json.loads((moved / "sft" / "done.json").read_text())["replays"][0]["sft_loss"] > 0
    first, replayed = ([{k: v for k, v in json.loads(line).items() if k != "seconds"} for line in
                        (moved / "sft" / name).read_text().splitlines()] for name in ("metrics.first-run.jsonl",
                                                                                       "metrics.jsonl"))
    assert first == replayed  # (on the CPU the same numbers, step by step)
    for step, part in (("sft", "actor"), ("rft", "actor"), ("rft", "critic"), ("value", "actor"), ("value", "critic")):
        name = "model.safetensors"
        original = load_file(tmp_path / "original" / step / "checkpoint" / part / name)
        rebuilt = load_file(moved / step / "checkpoint" / part / name)
        assert original.keys() == rebuilt.keys()
        assert all(torch.allclose(original[k], rebuilt[k], atol=1e-6) for k in original), (step, part)


def test_a_step_key_follows_what_the_step_depends_on_and_nothing_else(tmp_path):
    """The model's content (weights, tokenizer, chat template: not its folder or a stray file), and a stage's
    settings without its time limit (a supervised stage: without the PPO settings it never reads)."""
    from cuda_agent.rl.recipe import RecipeConfig
    from cuda_agent.rl.step_keys import model_key, stage_settings

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        for file in ("config.json", "model.safetensors", "chat_template.jinja"):
            (tmp_path / name / file).write_text(file)
    (tmp_path / "b" / "README.md").write_text("notes")
    assert model_key(tmp_path / "a") == model_key(tmp_path / "b")
    (tmp_path / "b" / "chat_template.jinja").write_text("another template")
    assert model_key(tmp_path / "a") != model_key(tmp_path / "b")
    full, paper = RecipeConfig(), RecipeConfig(arm="paper")
    assert stage_settings(full.stage_config("rft", 30)) == stage_settings(paper.stage_config("rft", 30))
    assert stage_settings(full.stage_config("value", 3)) != stage_settings(paper.stage_config("value", 3))
    timed = replace(full.stage_config("rft", 30), time_limit_s=60.0)
    assert stage_settings(timed) == stage_settings(full.stage_config("rft", 30))
    assert stage_settings(full.stage_config("rft", 30)) != stage_settings(full.stage_config("rft", 31))


def test_the_supervised_stages_take_their_own_learning_rate_and_checkpoint_less_often():
    from cuda_agent.rl.recipe import RecipeConfig

    config = RecipeConfig(sft_lr=1e-3)
    sft, ppo = config.stage_config("rft", 40), config.stage_config("agentic", 40)
    assert sft.train.actor_lr == 1e-3 and ppo.train.actor_lr == config.stage.train.actor_lr != 1e-3
    assert sft.save_every == 10 and ppo.save_every == config.stage.save_every == 5
    assert RecipeConfig().stage_config("rft", 4).train.actor_lr == config.stage.train.actor_lr  # default: the actor's


def test_a_rollout_temperature_changes_value_pretraining_and_ppo_only_and_their_keys():
    """--rollout-temperature: value pretraining and PPO sample at it; SFT, RFT and the evaluations keep the run's
    temperature, so their finished steps (and keys) stand; without it every key is what it was."""
    from cuda_agent.rl.recipe import RecipeConfig
    from cuda_agent.rl.step_keys import stage_settings

    base = RecipeConfig(stage=replace(RecipeConfig().stage, temperature=0.3))
    hot = replace(base, rollout_temperature=1.0)
    for stage in ("value", "agentic", "warmup"):
        assert base.stage_config(stage, 3).temperature == 0.3 and hot.stage_config(stage, 3).temperature == 1.0
        assert stage_settings(base.stage_config(stage, 3)) != stage_settings(hot.stage_config(stage, 3))
    assert stage_settings(hot.stage_config("rft", 30)) == stage_settings(base.stage_config("rft", 30))
    assert hot.eval == base.eval
    with pytest.raises(ValueError, match="rollout-temperature"):
        RecipeConfig(rollout_temperature=0.0)


def test_the_recipe_stops_at_its_time_limit_and_the_same_command_continues(tiny_checkpoint, tmp_path, cache_dir):
    """A clock that passes the 60 s limit as the base evaluation's first episode ends: nothing after it starts,
    recipe.json says where it stopped; the same recipe without the limit then continues from there."""
    from cuda_agent.judge.pool import JudgePool
    from cuda_agent.rl.config import EvalConfig, StageConfig
    from cuda_agent.rl.recipe import Recipe, RecipeConfig

    limits = dict(max_turns=1, max_new_tokens=4, compact=True)
    config = RecipeConfig(arm="no_rft", controls=(), value_steps=1, ppo_steps=1, time_limit_s=60,
                          stage=StageConfig(batch=1, **limits), eval=EvalConfig(samples=2, batch=1, **limits))
    now, lines = [0.0], []

    def log(line: str) -> None:
        lines.append(line)
        if " sample 0: reward " in line:  # the first episode's end
            now[0] = 61.0
    with JudgePool("cpu", fast_config(cache_dir)) as pool:
        first = Recipe(config, tiny_checkpoint, [TASKS / "affine_relu.py"], [TASKS / "row_mean.py"],
                       tmp_path / "run", pool, "cpu", log, clock=lambda: now[0]).run()
        assert first["stopped"] == "time limit reached in eval_base after 1 of 2 episodes", lines
        assert first["heldout"] == {} and not (tmp_path / "run" / "value").exists()
        assert json.loads((tmp_path / "run" / "recipe.json").read_text())["stopped"] == first["stopped"]
        again = Recipe(replace(config, time_limit_s=None), tiny_checkpoint, [TASKS / "affine_relu.py"],
                       [TASKS / "row_mean.py"], tmp_path / "run", pool, "cpu", lines.append).run()
    assert "eval: 1 of 2 episodes played before, 1 to play" in lines
    assert "stopped" not in again and list(again["heldout"]) == ["base", "ppo"] and again["controls"] == {}


def test_an_episode_whose_reply_runs_past_the_time_limit_is_dropped_and_played_by_the_rerun(
        tiny_checkpoint, tmp_path, cache_dir):
    from cuda_agent.judge.pool import JudgePool
    from cuda_agent.rl import evaluation
    from cuda_agent.rl.config import EvalConfig

    config = EvalConfig(samples=1, batch=1, max_turns=1, max_new_tokens=4, compact=True)
    with JudgePool("cpu", fast_config(cache_dir)) as pool:
        late = evaluation.local_player(tiny_checkpoint, config, pool, "cpu", out_of_time=lambda: True)
        with pytest.raises(TimeoutError, match="time limit reached before this reply"):
            evaluation.evaluate([TASKS / "row_mean.py"], tmp_path / "eval", config, late, {})
        assert not list((tmp_path / "eval" / "episodes").glob("*/sample_0"))  # no half episode left behind
        lines = []
        player = evaluation.local_player(tiny_checkpoint, config, pool, "cpu", log=lines.append)
        result = evaluation.evaluate([TASKS / "row_mean.py"], tmp_path / "eval", config, player, {}, lines.append)
    assert result["summary"]["episodes"] == 1 and any(" sample 0: reward " in line for line in lines), lines


def test_the_critic_is_scored_on_episodes_read_back_from_their_run_folders(tiny_checkpoint, tmp_path):
    """A fresh critic (a zero value head) foresees none of two held-out episodes' returns (-1 and 3): explained
    variance 0; a folder without a model turn is skipped."""
    import shutil

    from cuda_agent.rl.critic_check import critic_explained_variance

    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(tiny_checkpoint, checkpoint / "actor")
    shutil.copytree(tiny_checkpoint, checkpoint / "critic")
    runs = []
    for i, (reward, reply) in enumerate([(-1, "No idea."), (3, "I will write a kernel."), (1, None)]):
        run = tmp_path / f"run{i}"
        run.mkdir()
        messages = [{"role": "system", "content": "You write kernels."}, {"role": "user", "content": "Task."}]
        messages += [{"role": "assistant", "content": reply}] if reply else []
        (run / "trajectory.jsonl").write_text("".join(json.dumps({"type": m["role"], "message": m}) + "\n"
                                                      for m in messages))
        (run / "summary.json").write_text(json.dumps({"final_verdict": {"reward": reward}}))
        runs.append(run)
    result = critic_explained_variance(checkpoint, runs, compact=True)
    assert result["episodes"] == 2 and result["mean_return"] == 1.0
    assert result["explained_variance"] == pytest.approx(0.0, abs=1e-6)


def test_train_audit_lays_out_the_best_verified_kernel_of_each_task(tmp_path):
    """Each task once (its best episode), best first, unverified ones left out; the task's and the kernel's files in
    full, the verdict's numbers and the questions to answer."""
    import shutil
    from dataclasses import asdict

    episodes = []
    for i, (task, reward, speedup) in enumerate([("affine_relu", 1, 0.8), ("affine_relu", 3, 1.5),
                                                 ("row_mean", 2, 0.9), ("softmax_rows", -1, None)]):
        run = tmp_path / "eval" / "episodes" / f"{i:04d}"
        (run / "best" / "kernels").mkdir(parents=True)
        (run / "best" / "kernels" / "k.cu").write_text(f"// kernel of episode {i}\n")
        (run / "best" / "model_new.py").write_text("class ModelNew: ...\n")
        (run / "best_verdict.json").write_text(json.dumps({"correct": reward >= 1, "times_us": {"candidate": 10.0},
                                                           "policy_violations": []}))
        episodes.append(EpisodeRecord(str(TASKS / f"{task}.py"), i, reward, speedup, 3, 3, 0, "finish", str(run)))
    (tmp_path / "eval" / "episodes.jsonl").write_text("".join(json.dumps(asdict(e)) + "\n" for e in episodes))
    shutil.move(tmp_path / "eval", tmp_path / "back" / "eval")  # as a run folder comes back from the device
    result = runner.invoke(app, ["train", "audit", str(tmp_path / "back" / "eval"), "--out",
                                 str(tmp_path / "audit.md")])
    assert result.exit_code == 0 and "2 kernels to audit" in result.output, result.output
    page = (tmp_path / "audit.md").read_text()
    assert page.index("## 1. affine_relu: reward 3, 1.50x") < page.index("## 2. row_mean: reward 2, 0.90x")
    assert "episode 1\n" in page and "episode 0\n" not in page and "softmax_rows" not in page
    assert (TASKS / "row_mean.py").read_text().strip() in page and page.count("- [ ] ") == 6
    empty = tmp_path / "none"
    empty.mkdir()
    (empty / "episodes.jsonl").write_text(json.dumps(asdict(episodes[3])) + "\n")
    nothing = runner.invoke(app, ["train", "audit", str(empty), "--out", str(tmp_path / "none.md")])
    assert nothing.exit_code == 2 and "nothing to audit" in nothing.output
    (empty / "episodes.jsonl").write_text(json.dumps({"task": "t", "shape": "direct"}) + "\n")  # the expert's
    other = runner.invoke(app, ["train", "audit", str(empty), "--out", str(tmp_path / "none.md")])
    assert other.exit_code == 2 and "not an evaluation's" in other.output


def test_the_audit_page_shows_every_file_whole_whatever_it_holds(tmp_path):
    """Held out (red team, 2026-12-04): a kernel that put ``` and `<!--` in a comment closed the page's fixed fence
    and hid its next lines in an HTML comment, and an included `.inl` file was not on the page at all."""
    from cuda_agent.rl.audit import entry

    run = tmp_path / "run"
    (run / "best" / "kernels").mkdir(parents=True)
    (run / "best" / "kernels" / "k.cpp").write_text('#include "helpers.inl"\n/* ```\n<!-- */\nint hidden_trick;\n')
    (run / "best" / "kernels" / "helpers.inl").write_text("int table_lookup_cheat;\n")
    (run / "best_verdict.json").write_text(json.dumps({"warnings": ["`` <!-- x"]}))
    page = entry(1, EpisodeRecord(str(TASKS / "affine_relu.py"), 0, 3, 1.2, 3, 3, 0, "finish", str(run)), tmp_path)
    assert "table_lookup_cheat" in page and "hidden_trick" in page
    body = page[page.index("k.cpp"):]
    fence = body.split("\n")[2][:4]
    assert fence == "````" and body.count(fence) == 2, body  # longer than the file's own ``` run
    assert "``` ['`` <!-- x'] ```" in page  # the verdict's strings as code


def test_the_supervised_stages_read_the_expert_s_episodes_of_the_shapes_asked():
    from cuda_agent.rl.recipe import of_shapes

    runs = ["/r/expert/t0/direct-0", "/r/expert/t0/improve-0", "/r/expert/t1/fix-0", "/r/expert/t1/direct-1"]
    assert of_shapes(runs, ("direct",)) == [runs[0], runs[3]]
    assert of_shapes(runs, ("improve", "fix")) == runs[1:3]
    assert of_shapes(runs, ()) == runs


def _recipe_run(folder, arm: str, seed: int, rewards: dict[str, list[float]], half_done: tuple[str, ...] = ()):
    """A `train recipe` folder as the table reads it: recipe.json, and per stage one episode a held-out task."""
    folder.mkdir(parents=True)
    (folder / "recipe.json").write_text(json.dumps({"arm": arm, "seed": seed, "heldout": {}}))
    for stage, values in rewards.items():
        step = folder / f"eval_{stage}"
        step.mkdir()
        (step / "episodes.jsonl").write_text("".join(json.dumps(
            {"task": f"/tmp/run-{arm}-{seed}/tasks/held/t{i}.py", "sample": 0, "reward": r,
             "speedup_vs_compile": 1.5 if r >= 1 else None, "turns": 4, "model_turns": 4, "malformed": 0,
             "stop": "finish", "run_dir": "x"}) + "\n" for i, r in enumerate(values)))
        if stage not in half_done:
            (step / "done.json").write_text("{}")
    return folder


def test_the_recipe_table_combines_seeds_per_arm_and_pairs_ppo_with_the_earlier_stages(tmp_path):
    """Mean and std over seeds, intervals over the tasks with both seeds pooled, PPO - SFT paired by task; a
    half-done evaluation does not count; an arm's seed given twice, or a folder without recipe.json, is refused."""
    from cuda_agent.rl.recipe_table import markdown, read_run, recipe_table

    runs = [_recipe_run(tmp_path / "a", "full", 0, {"base": [-1, -1, -1, -1], "sft": [2, -1, 1, -1],
                                                     "ppo": [2, 2, 1, -1], "rft": [3, 3, 3, 3]}, half_done=("rft",)),
            _recipe_run(tmp_path / "b", "full", 1, {"base": [-1, -1, -1, -1], "sft": [2, 1, -1, -1],
                                                     "ppo": [3, 2, 1, 1]}),
            _recipe_run(tmp_path / "c", "paper", 0, {"base": [-1, -1, 1, -1]})]
    table = recipe_table([read_run(r) for r in runs], resamples=500)
    full = table["arms"]["full"]
    assert full["seeds"] == [0, 1] and set(full["heldout"]) == {"base", "sft", "ppo"}  # (rft: not finished)
    sft, ppo = full["heldout"]["sft"], full["heldout"]["ppo"]
    assert sft["mean_reward_seeds"] == [0.25, 0.25] and sft["mean_reward"] == 0.25 and sft["mean_reward_std"] == 0
    assert ppo["mean_reward_seeds"] == [1.0, 1.75] and ppo["mean_reward"] == 1.375
    assert ppo["pass_rate_seeds"] == [0.75, 1.0] and ppo["episodes"] == 8 and ppo["tasks"] == 4
    lo, hi = ppo["mean_reward_ci"]
    assert lo <= 1.375 <= hi and lo < hi
    diff = full["ppo_vs"]["sft"]["mean_reward"]
    assert diff["tasks"] == 4 and diff["difference"] == 1.375 - 0.25 and full["ppo_vs"]["sft"]["seeds"] == [0, 1]
    assert table["arms"]["paper"]["heldout"]["base"]["pass_rate"] == 0.25 and table["arms"]["paper"]["ppo_vs"] == {}
    text = markdown(table)
    assert "| full | ppo | 2 | 0.88 ± 0.18 [" in text and "full: PPO - sft over 2 seed(s), paired by task" in text

    again = _recipe_run(tmp_path / "d", "full", 1, {"base": [-1, -1, -1, -1]})
    with pytest.raises(ValueError, match="arm 'full' seed 1 given twice"):
        recipe_table([read_run(r) for r in (*runs, again)])
    (tmp_path / "e").mkdir()
    with pytest.raises(ValueError, match="recipe.json"):
        read_run(tmp_path / "e")

    result = CliRunner().invoke(app, ["train", "table", str(runs[0]), str(runs[1]), "--out",
                                      str(tmp_path / "t.json")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "t.json").read_text())["arms"]["full"]["heldout"]["ppo"]["mean_reward"] == 1.375
    assert "| full | sft |" in (tmp_path / "t.md").read_text() and "| full | sft |" in result.output
    refused = CliRunner().invoke(app, ["train", "table", str(tmp_path / "e")])
    assert refused.exit_code != 0 and "recipe.json" in refused.output


def test_an_interrupted_recipe_keeps_its_finished_evaluations_in_recipe_json(tmp_path):
    """Ctrl-C (or the device script's `timeout -s INT`) mid-recipe: recipe.json says so and holds what was
    evaluated, then the interruption goes on (the ninth attempt's second session left none)."""
    from types import SimpleNamespace

    from cuda_agent.rl.recipe import Recipe, RecipeConfig

    def _run(heldout: dict) -> dict:
        heldout["base"] = {"mean_reward": -1.0}
        raise KeyboardInterrupt
    fake = SimpleNamespace(config=RecipeConfig(seed=3), out=tmp_path, log=print, _run=_run)
    fake._write = lambda result: Recipe._write(fake, result)
    with pytest.raises(KeyboardInterrupt):
        Recipe.run(fake)
    saved = json.loads((tmp_path / "recipe.json").read_text())
    assert saved["stopped"] == "interrupted" and saved["heldout"] == {"base": {"mean_reward": -1.0}}
    assert saved["arm"] == "full" and saved["seed"] == 3
