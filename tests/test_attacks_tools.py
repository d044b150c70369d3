"""Red team (agent environment, 2026-12-05): what a policy can do to the training system through its tool calls.

Each test asserts the secure behaviour and fails on the code it was written against: an episode that raises out of
`run_episode`/`rollout.play` ends the PPO step (`stages._ppo_step` maps its episodes in a thread pool and re-raises),
verl's agent loop (`verl_loop.CudaAgentLoop.run`) and verl's reward function (`verl_reward.compute_score`), and a
file tool that runs for minutes or takes gigabytes does so in the trainer's own process, holding the GIL.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import TASKS, fast_config
from cuda_agent import sandbox
from cuda_agent.agent import Environment, LoopConfig, ScriptedClient, run_episode
from cuda_agent.judge import Judge
from cuda_agent.workspace.candidate import load_candidate
from cuda_agent.llm import reply_from

AFFINE = TASKS / "affine_relu.py"
SANDBOX = sandbox.probe() is None
SRC = str(Path(__file__).resolve().parents[1] / "src")
NESTED = '<tool_call>{"name": "glob", "arguments": ' + "[" * 1100 + "}</tool_call>"


@pytest.fixture(scope="module")
def judge(cache_dir):
    with Judge("cpu", fast_config(cache_dir)) as j:
        yield j


@pytest.fixture
def env(judge, tmp_path):
    environment = Environment(judge, tmp_path / "run", use_sandbox=SANDBOX, bash_timeout=60)
    environment.reset(AFFINE)
    return environment


def _chatml_tokenizer():
    """A character-level ChatML tokenizer (no download): what the rollout renders observations with."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {chr(i): i for i in range(32, 127)}
    vocab.update({"\n": 127, "<|im_start|>": 128, "<|im_end|>": 129, "<unk>": 130})
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer, core.decoder = pre_tokenizers.Split("", "isolated"), decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<|im_end|>",
                                  additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return tok


# ---- R1: the policy raises out of the rollout (PPO step, verl agent loop, verl reward) ---------------------------
CRASHES = {
    # a lone surrogate in a path comes back in the observation; the tokenizer (or the openai client) cannot encode it
    "surrogate": ['<tool_call>{"name": "read_file", "arguments": {"path": "\\udcff"}}</tool_call>',
                  '<tool_call>{"name": "finish", "arguments": {}}</tool_call>'],
    # ~1,100 brackets: json's RecursionError is not a JSONDecodeError
    "nested": [NESTED, '<tool_call>{"name": "finish", "arguments": {}}</tool_call>'],
    # an OSError of a file tool (FileExistsError, ENAMETOOLONG) is not a ToolError
    "oserror": ['<tool_call>{"name": "write_file", "arguments": {"path": "model_new.py/x", "content": "a"}}'
                '</tool_call>', '<tool_call>{"name": "finish", "arguments": {}}</tool_call>'],
}


@pytest.mark.parametrize("attack", sorted(CRASHES))
def test_no_tool_call_of_the_policy_raises_out_of_a_rollout(attack, judge, tmp_path):
    pytest.importorskip("transformers")
    from cuda_agent.agent.tools import schemas
    from cuda_agent.rl.rollout import play
    from cuda_agent.rl.tokens import TurnTokenizer

    tok = _chatml_tokenizer()
    turns = TurnTokenizer(tok, schemas(), tool_format="text")
    script = [tok.encode(r, add_special_tokens=False) + [turns.end_of_turn] for r in CRASHES[attack]]

    def sample(ids, room, stop):
        out = script.pop(0) if script else tok.encode("bye", add_special_tokens=False) + [turns.end_of_turn]
        return out, [0.0] * len(out)

    run = tmp_path / "run"
    episode = play(Environment(judge, run, use_sandbox=SANDBOX), sample, turns, AFFINE, run,
                   LoopConfig(max_turns=3), 4096)  # raised TypeError / RecursionError / FileExistsError
    assert episode.score == -1


def test_a_tool_call_nested_past_the_recursion_limit_is_an_unreadable_call():
    reply = reply_from(NESTED, [], {})  # raised RecursionError
    assert not reply.tool_calls and reply.malformed
    reply = reply_from('{"name": "glob", "arguments": ' + "[" * 1100 + "}", [], {})
    assert not reply.tool_calls


def test_a_single_turn_reply_cannot_raise_out_of_the_reward_episode(env, tmp_path):
    """What `verl_reward.compute_score` plays: the reply's files written, profiled, re-judged."""
    for reply in (NESTED, "### FILE: model_new.py/x\n```python\nx = 1\n```\n"):
        run = tmp_path / f"run{len(reply)}"
        summary = run_episode(Environment(env.judge, run, use_sandbox=SANDBOX),
                              ScriptedClient([{"role": "assistant", "content": reply}]), AFFINE, run,
                              LoopConfig(single_turn=True))  # raised RecursionError / FileExistsError
        assert summary.reward == -1


def test_file_tools_answer_os_errors_as_errors(env):
    for name, args in [("write_file", {"path": "model_new.py/x", "content": "a"}),
                       ("write_file", {"path": "a" * 300, "content": "a"}),
                       ("read_file", {"path": "a" * 300}),
                       ("grep", {"pattern": "x", "path": "b" * 300}),
                       ("glob", {"pattern": "c" * 300})]:
        result = env.step(name, args)  # raised FileExistsError / OSError(ENAMETOOLONG)
        assert result.info.get("error"), (name, result.observation)


def test_observations_are_valid_utf8(env):
    """The observation is rendered by the tokenizer (rollout) or sent as JSON (openai client): a lone surrogate in it
    raises there."""
    os.close(os.open(os.fsencode(env.workspace / "kernels") + b"/k\xff.cpp", os.O_CREAT | os.O_WRONLY))
    for name, args in [("read_file", {"path": "\udcff"}), ("glob", {"pattern": "kernels/*"}),
                       ("grep", {"pattern": ".*", "path": "kernels"}), ("finish", {"summary": "\udcff"})]:
        observation = env.step(name, args).observation
        observation.encode("utf-8")  # raised UnicodeEncodeError: surrogates not allowed


# ---- R2: grep in the trainer's process: unbounded time (GIL held) and memory -------------------------------------
def _grep_in_a_process(workspace: Path, pattern: str, timeout: float) -> dict:
    code = textwrap.dedent(f"""
        import json, resource, time
        from pathlib import Path
        from cuda_agent.agent.tools import Tools, ToolError
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        began = time.monotonic()
        try:
            Tools(Path({str(workspace)!r}), Path("model.py"), judge=None, use_sandbox=False).call(
                "grep", {{"pattern": {pattern!r}, "path": "kernels"}})
        except ToolError:  # (stopped: said to the model)
            pass
        print(json.dumps({{"s": time.monotonic() - began,
                          "mib": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024}}))
    """)
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONPATH": SRC})
    except subprocess.TimeoutExpired:
        return {"s": float("inf"), "mib": None}
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_grep_with_a_catastrophic_pattern_returns_promptly(tmp_path):
    """`(a+)+b` on 32 a's: 2^32 steps of `re`, which never releases the GIL (every episode, the sampler and verl's
    event loop of the process stop with it); each more `a` doubles it."""
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "k.cpp").write_text("a" * 32 + "\n")
    took = _grep_in_a_process(tmp_path, "(a+)+b", timeout=30)
    assert took["s"] < 20, "grep held the process for minutes"


def test_grep_takes_bounded_memory_whatever_the_workspace_holds(tmp_path):
    """4 MiB of empty lines (under the 16 MiB a file may have): every line a hit, all kept before the first 300 are
    taken: +385 MiB and 11 s measured; 32 GiB of such files are allowed to bash."""
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "k.txt").write_bytes(b"\n" * (4 << 20))
    took = _grep_in_a_process(tmp_path, "", timeout=120)
    assert took["mib"] is not None and took["mib"] < 100, took


def test_glob_with_many_recursive_wildcards_returns_promptly(tmp_path):
    """`**/**/**/**/**/**/**/*.cpp` over 30 nested folders (one write_file): pathlib walks them once per `**` and
    combination (8.5 s at five, x7 per more) in the trainer's process, GIL held, no time limit."""
    code = textwrap.dedent(f"""
        from pathlib import Path
        from cuda_agent.agent.tools import Tools, ToolError
        t = Tools(Path({str(tmp_path)!r}), Path("model.py"), judge=None, use_sandbox=False)
        t.call("write_file", {{"path": "/".join(["d"] * 30) + "/f.cpp", "content": "x"}})
        try:
            t.call("glob", {{"pattern": "/".join(["**"] * 7) + "/*.cpp"}})
        except ToolError:
            pass
    """)
    try:
        subprocess.run([sys.executable, "-c", code], check=True, timeout=30, env={**os.environ, "PYTHONPATH": SRC})
    except subprocess.TimeoutExpired:
        pytest.fail("glob held the process for minutes")


# ---- R3: one reply, any number of tool calls: the episode's time is unbounded by max_turns -----------------------
def test_a_reply_cannot_run_more_tool_calls_than_a_bound(judge, tmp_path):
    """max_turns bounds replies, bash_timeout each call; a reply may hold any number of calls (each `bash sleep`
    runs to its timeout, each `verify` of a changed file is a whole evaluation on the shared pool): 20 s measured
    for 10 calls with bash_timeout 2 and max_turns 1; in a PPO step (20 turns of 1,024 tokens, bash 180 s) ~500
    calls, ~25 h, while every other episode of the step waits."""
    reply = {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": '{"command": "true"}'}}
        for i in range(40)]}
    run = tmp_path / "run"
    run_episode(Environment(judge, run, use_sandbox=SANDBOX, bash_timeout=2), ScriptedClient([reply]), AFFINE, run,
                LoopConfig(max_turns=1))
    records = [json.loads(line) for line in (run / "trajectory.jsonl").read_text().splitlines()]
    ran = [r for r in records if r["type"] == "tool" and not r.get("error")]
    assert len(ran) == LoopConfig.max_calls_per_reply, f"{len(ran)} tool calls ran in one reply"


def test_an_episode_stops_at_its_wall_clock_bound_and_answers_the_calls_it_did_not_run(judge, tmp_path):
    """The open end of R3: bounded turns of bounded calls still allow hours (16 `bash sleep` a reply, each to its
    timeout, for every turn), while every other episode of a PPO step waits. `LoopConfig.time_limit_s` ends the
    episode: checked before each call, the calls left are answered (every call of a reply has its result) and
    the episode stops as `time limit`, not as `invalid tool calls`."""
    sleep = {"id": "", "type": "function", "function": {"name": "bash", "arguments": '{"command": "sleep 0.4"}'}}
    replies = [{"role": "assistant", "content": "", "tool_calls": [{**sleep, "id": f"t{t}c{i}"} for i in range(6)]}
               for t in range(5)]
    run = tmp_path / "run"
    summary = run_episode(Environment(judge, run, use_sandbox=SANDBOX, bash_timeout=2), ScriptedClient(replies),
                          AFFINE, run, LoopConfig(max_turns=5, time_limit_s=1.0))
    records = [json.loads(line) for line in (run / "trajectory.jsonl").read_text().splitlines()]
    tools = [r for r in records if r["type"] == "tool"]
    ran = [r for r in tools if not r.get("error")]
    assert summary.stop == "time limit" and summary.turns == 1, (summary.stop, summary.stop_detail, summary.turns)
    assert len(tools) == 6 and 1 <= len(ran) <= 4, (len(tools), len(ran))
    assert all("time limit" in r["message"]["content"] for r in tools if r.get("error"))
    assert summary.wall_s < 5, summary.wall_s


def test_bash_cannot_fill_the_disk_through_the_workspace(judge, tmp_path, monkeypatch):
    """The other open end of R3: a command wrote up to the sandbox's 32 GiB a file, any number of files, into the
    workspace (the disk every episode and the judge share). Now the workspace is measured while the command runs
    and the command is killed past its budget; what is left over it goes, largest first, and the agent is told
    which; the task and the template stay. (The budget is lowered here to keep the test small.)"""
    from cuda_agent.agent import disk

    monkeypatch.setattr(disk, "WORKSPACE_BYTES", 8 << 20)
    env = Environment(judge, tmp_path / "run", use_sandbox=SANDBOX, bash_timeout=60)
    env.reset(AFFINE)
    fill = "for i in $(seq 1000); do head -c 1048576 /dev/urandom > fill_$i.bin; sleep 0.01; done"
    result = env.step("bash", {"command": f"echo small > keep.txt; {fill}"})
    assert "killed: the workspace holds" in result.observation, result.observation[-500:]
    assert "removed fill_" in result.observation, result.observation[-500:]
    assert disk.usage(env.workspace).bytes <= 8 << 20
    assert (env.workspace / "keep.txt").exists() and (env.workspace / "model.py").exists()
    assert len(list(env.workspace.glob("fill_*.bin"))) < 50


def test_a_workspace_of_too_many_files_is_stopped_and_trimmed(tmp_path, monkeypatch):
    from cuda_agent.agent import disk

    monkeypatch.setattr(disk, "MAX_ENTRIES", 50)
    for i in range(80):
        (tmp_path / f"f{i}").write_text("x")
    (tmp_path / "model.py").write_text("task")
    assert "more than 50 files" in (disk.usage(tmp_path).over() or "")
    removed = disk.enforce(tmp_path, ("model.py",))
    assert len(removed) == 31 and "model.py" not in removed and disk.usage(tmp_path).over() is None


def test_bash_runs_at_the_lowest_cpu_priority_which_it_cannot_raise(env):
    """The last open end of R3: a command spinning on every core slowed whatever ran beside it, a sibling episode's
    candidate being timed included. Its processes now run in a cgroup of low CPU weight where the cpu controller can
    be set (a new session inside stays in it), and at nice 19 in an autogroup at nice 19 (where the kernel groups
    sessions a nice value counts only within its own); none of it can be raised back from inside."""
    from cuda_agent.sandbox.cgroup import LOW_WEIGHT, Cgroup

    probe = ("nice; cat /proc/self/autogroup 2>/dev/null || echo no-autogroup; "
             "renice -n 0 -p $$ >/dev/null 2>&1 && echo RAISED || echo refused; "
             "g=$(setsid cat /proc/self/cgroup | grep -E '^[0-9]+:(cpu|cpu,cpuacct|cpuacct,cpu)?:/cuda-agent' "
             "| head -1 | cut -d: -f3); echo \"group $g\"; "
             "for d in /sys/fs/cgroup/cpu$g /sys/fs/cgroup$g; do for f in cpu.idle cpu.shares cpu.weight; do "
             "[ -f $d/$f ] && echo \"$f $(cat $d/$f)\"; done; done; true")
    lines = env.step("bash", {"command": probe}).observation.splitlines()[1:]
    assert lines[0] == "19", lines
    assert lines[1] == "no-autogroup" or lines[1].endswith("nice 19"), lines
    assert lines[2] == "refused", lines
    layout = Cgroup.layout() if SANDBOX else None
    if layout and Cgroup.cpu_parent(layout[0]):  # in the low group, even from a session of its own
        assert lines[3].startswith("group /cuda-agent-"), lines
        assert f"cpu.shares {LOW_WEIGHT[1]}" in lines[4:] or f"cpu.weight {LOW_WEIGHT[2]}" in lines[4:], lines
def _du_bytes(path: Path) -> int:
    """What a folder holds on disk, measured by `du` (which walks below PATH_MAX by descriptors)."""
    return int(subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True).stdout.split()[0]) << 10


def test_files_below_a_path_longer_than_path_max_count_against_the_workspace(judge, tmp_path, monkeypatch):
    """Red team 2026-12-06: the workspace was measured by whole paths, so a file whose path passes PATH_MAX (4096
    bytes: 18 folders of 250 characters, entered one by one) could not be stat'ed and counted nothing; 6 files of
    250 MiB stayed after a command that measured 0 MiB, never removed, any number of commands (the disk every
    episode and the judge share). (The budget is lowered here to keep the test small.)"""
    from cuda_agent.agent import disk

    monkeypatch.setattr(disk, "WORKSPACE_BYTES", 8 << 20)
    env = Environment(judge, tmp_path / "run", use_sandbox=SANDBOX, bash_timeout=60)
    env.reset(AFFINE)
    deep = "for i in $(seq 18); do mkdir " + "d" * 250 + " && cd " + "d" * 250 + "; done"
    result = env.step("bash", {"command": f"{deep}; for i in $(seq 6); do head -c 4194304 /dev/urandom > f$i; done"})
    assert "the workspace holds" in result.observation, result.observation[-300:]
    assert _du_bytes(env.workspace) <= 9 << 20, _du_bytes(env.workspace)
    assert (env.workspace / "model.py").exists()


def test_files_removed_but_held_open_count_against_the_workspace(judge, tmp_path, monkeypatch):
    """Red team 2026-12-06: a command that opens a file, removes its name and writes on held the disk's space for
    as long as it ran (to its timeout), in no folder the measurement walks: 2 GiB (8 files of 250 MiB) held for the
    whole command, the workspace measured at 0. They count now (the command's processes' descriptors and maps)."""
    import time as _time

    from cuda_agent.agent import disk

    monkeypatch.setattr(disk, "WORKSPACE_BYTES", 8 << 20)
    env = Environment(judge, tmp_path / "run", use_sandbox=SANDBOX, bash_timeout=60)
    env.reset(AFFINE)
    hold = "for i in $(seq 6); do exec {fd}>f$i; rm f$i; head -c 4194304 /dev/urandom >&$fd; done; sleep 20"
    began = _time.monotonic()
    result = env.step("bash", {"command": hold})
    assert _time.monotonic() - began < 10, result.observation[-300:]
    assert "killed: the workspace holds" in result.observation, result.observation[-300:]


def test_a_command_started_just_before_the_episode_s_time_limit_ends_at_it(judge, tmp_path):
    """Red team 2026-12-06: the time limit was checked before each call, and a call started just before it ran to its
    own timeout: a `bash sleep` started at 1,799 s of a 1,800 s episode held it to 1,979 s (bash_timeout 180 s), the
    whole PPO step waiting. A command now ends at the episode's limit (here 2 s; bash's own timeout 30 s)."""
    sleep = {"type": "function", "function": {"name": "bash", "arguments": ""}}
    reply = {"role": "assistant", "content": "", "tool_calls": [
        {**sleep, "id": "c0", "function": {"name": "bash", "arguments": '{"command": "sleep 1.5"}'}},
        {**sleep, "id": "c1", "function": {"name": "bash", "arguments": '{"command": "sleep 25"}'}}]}
    run = tmp_path / "run"
    summary = run_episode(Environment(judge, run, use_sandbox=SANDBOX, bash_timeout=30), ScriptedClient([reply]),
                          AFFINE, run, LoopConfig(max_turns=1, time_limit_s=2.0))
    assert summary.wall_s < 6, (summary.wall_s, summary.stop)


def test_a_judge_call_started_just_before_the_episode_s_time_limit_ends_near_it(judge, tmp_path):
    """Red team 2026-12-06: `verify` at the last moment runs the whole evaluation, and a candidate killed by a signal
    is judged twice: a `model_new.py` that sleeps 3 s and then segfaults held a 2 s episode for ~10 s here (42 s on
    a fresh cache); with the default budgets a 1,800 s episode can run ~20 minutes longer. The judge now takes the
    episode's deadline: its waits on the candidate end there, no phase starts after it, and nothing is judged twice
    past it; the verdict says it ran out of time (and is not kept as the workspace's answer). Here: a 4 s episode,
    `verify` started within its first second or so, a candidate that sleeps 6 s (12 s and more without the deadline)."""
    src = TASKS.parent / "candidates" / "affine_relu_ok"
    judge.compile(load_candidate(src))  # the judge's own once-a-machine work (the precompiled header) done before
    setup = (f"cp -r {src}/kernels . && cp {src}/model_new.py . && printf 'import os, signal, time\\n"
             "time.sleep(6)\\nos.kill(os.getpid(), signal.SIGSEGV)\\n' >> model_new.py")
    reply = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c0", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": setup})}},
        {"id": "c1", "type": "function", "function": {"name": "verify", "arguments": "{}"}}]}
    run = tmp_path / "run"
    summary = run_episode(Environment(judge, run, use_sandbox=SANDBOX, bash_timeout=30), ScriptedClient([reply]),
                          AFFINE, run, LoopConfig(max_turns=1, time_limit_s=4.0))
    assert summary.wall_s < 8, (summary.wall_s, summary.stop)
    records = [json.loads(line) for line in (run / "trajectory.jsonl").read_text().splitlines()]
    verify = next(r for r in records if r.get("tool") == "verify")
    assert "first failure: out of time" in verify["message"]["content"], verify
