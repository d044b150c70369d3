"""The command line's structure: the three ways to start it list the same commands (`train` was once registered
after `python -m cuda_agent.cli` had already run the app, so that form lacked it), and every judge option's default
is the one its config states (JudgeConfig for eval and eval-suite, which once restated them, and rl/config.py's for
training, whose learning rates were stated three times)."""

import os
import re
import shutil
import subprocess
import sys


def commands(argv: list[str]) -> set[str]:
    run = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"})
    assert run.returncode == 0, run.stderr[-2000:]
    section = run.stdout.split("Commands", 1)[1]
    return set(re.findall(r"^[│|]\s+([a-z][a-z-]*)\s", section, re.MULTILINE))


def test_every_entry_point_lists_the_same_commands():
    script = shutil.which("cuda-agent")
    assert script, "the cuda-agent script is not installed (pip install -e .)"
    listed = [commands([sys.executable, "-m", "cuda_agent.cli"]), commands([sys.executable, "-m", "cuda_agent"]),
              commands([script])]
    assert listed[0] == listed[1] == listed[2], listed
    assert {"eval", "eval-suite", "optimize", "data", "model", "report", "train"} <= listed[0], listed[0]


def test_the_judges_options_take_their_defaults_from_its_config():
    import typer

    from cuda_agent.cli import app
    from cuda_agent.judge.config import JudgeConfig

    fields = {"atol": "atol", "rtol": "rtol", "trials": "num_trials", "allow_tf32": "allow_tf32",
              "compile_mode": "compile_mode", "timeout": "run_timeout_s", "max_error_ratio": "max_error_ratio",
              "sandbox_mode": "sandbox", "policy": "policy"}
    defaults = JudgeConfig()
    group = typer.main.get_command(app)
    for name in ("eval", "eval-suite"):
        params = {p.name: p for p in group.commands[name].params}
        for option, field in fields.items():
            assert params[option].default == getattr(defaults, field), (name, option)


def test_the_training_options_take_their_defaults_from_the_run_configs():
    import typer

    from cuda_agent.cli import app
    from cuda_agent.rl.config import DemoConfig, StageConfig, TrainConfig

    train = typer.main.get_command(app).commands["train"]
    for params, config in (({p.name: p for p in train.commands["demo"].params}, DemoConfig()),
                           ({p.name: p for p in train.params}, StageConfig())):
        for name in ("steps", "batch", "seed", "save_every", "keep_checkpoints", "save_optimizer"):
            assert params[name].default == getattr(config, name), (type(config).__name__, name)
        lrs = (params["actor_lr"].default, params["critic_lr"].default)
        assert lrs == (TrainConfig.actor_lr, TrainConfig.critic_lr), type(config).__name__
    stage = {p.name: p for p in train.params}
    for name in ("max_turns", "max_new_tokens", "max_context"):
        assert stage[name].default == getattr(StageConfig, name), name


def test_the_agents_options_take_their_defaults_from_the_loop_and_the_client():
    import typer

    from cuda_agent import llm
    from cuda_agent.agent.config import LoopConfig
    from cuda_agent.cli import app

    group = typer.main.get_command(app)
    for name in ("optimize", "optimize-suite"):
        params = {p.name: p for p in group.commands[name].params}
        assert (params["max_turns"].default, params["max_context"].default) == (LoopConfig.max_turns,
                                                                                LoopConfig.max_context), name
        assert (params["temperature"].default, params["max_tokens"].default) == (llm.TEMPERATURE, llm.MAX_TOKENS), \
            name
