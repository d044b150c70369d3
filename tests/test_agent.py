"""The agent: tools, clients, and whole episodes on the CPU backend (a scripted model behind a real HTTP endpoint,
driven through the real `openai` client)."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from conftest import CANDIDATES, TASKS, fast_config
from cuda_agent import sandbox
from cuda_agent.agent import Environment, LoopConfig, OpenAIClient, ScriptedClient, run_episode
from cuda_agent.llm import ContextFull, LLMError, parse_text_tool_calls
from cuda_agent.agent.loop import ReplyCut, parse_files
from cuda_agent.agent.tools import clip
from cuda_agent.task import TaskError
from cuda_agent.cli import app
from cuda_agent.judge import Judge
from cuda_agent.task import import_file

AFFINE = TASKS / "affine_relu.py"
OK = CANDIDATES / "affine_relu_ok"
KERNEL = (OK / "kernels" / "affine_relu.cpp").read_text()
BINDING = (OK / "kernels" / "affine_relu_binding.cpp").read_text()
MODEL_NEW = (OK / "model_new.py").read_text()
BUGGY = KERNEL.replace("* 0.5f;", "* 0.25f;")
SANDBOX = sandbox.probe() is None


@pytest.fixture(scope="module")
def judge(cache_dir):
    return Judge("cpu", fast_config(cache_dir))


@pytest.fixture
def env(judge, tmp_path):
    environment = Environment(judge, tmp_path / "run", use_sandbox=SANDBOX, bash_timeout=60)
    environment.reset(AFFINE)
    return environment


# ---- tools ------------------------------------------------------------------------------------------------
def test_reset_makes_a_fresh_workspace_with_the_task_and_skill(env):
    ws = env.workspace
    assert {p.name for p in ws.iterdir()} == {"model.py", "SKILL.md", "model_new.py", "kernels", "binding.cpp",
                                              "binding_registry.h"}
    opening = env.reset(AFFINE)
    assert opening["messages"][0]["role"] == "system" and "SKILL" in opening["messages"][1]["content"]
    assert "class Model" in opening["messages"][1]["content"]
    assert {t["function"]["name"] for t in opening["tools"]} >= {"bash", "read_file", "write_file", "edit",
                                                                  "multi_edit", "glob", "grep", "compile",
                                                                  "verify", "profile", "finish"}


def test_file_tools_edit_exactly_and_refuse_what_they_must(env):
    assert env.step("write_file", {"path": "kernels/a.cpp", "content": "int a = 1;\nint b = 1;\n"}).observation \
        .startswith("wrote")
    not_unique = env.step("edit", {"path": "kernels/a.cpp", "old": "= 1;", "new": "= 2;"})
    assert not_unique.info["error"] and "found 2 times" in not_unique.observation
    absent = env.step("edit", {"path": "kernels/a.cpp", "old": "int c", "new": "x"})
    assert "not found" in absent.observation
    atomic = env.step("multi_edit", {"path": "kernels/a.cpp", "edits": [{"old": "int a = 1;", "new": "int a = 3;"},
                                                                       {"old": "missing", "new": "x"}]})
    assert atomic.info["error"] and (env.workspace / "kernels/a.cpp").read_text() == "int a = 1;\nint b = 1;\n"
    assert env.step("edit", {"path": "kernels/a.cpp", "old": "int a = 1;", "new": "int a = 3;"}).observation \
        .startswith("applied 1 edit")
    assert env.step("read_file", {"path": "kernels/a.cpp", "start_line": 2}).observation.strip() == "2  int b = 1;"
    for path in ("binding.cpp", "model.py", "SKILL.md"):
        assert "read-only" in env.step("write_file", {"path": path, "content": "x"}).observation
    assert "outside the workspace" in env.step("write_file", {"path": "../evil.py", "content": "x"}).observation
    assert "relative" in env.step("read_file", {"path": "/etc/passwd"}).observation
    assert env.step("glob", {"pattern": "kernels/*.cpp"}).observation == "kernels/a.cpp"
    assert "kernels/a.cpp:1: int a = 3;" in env.step("grep", {"pattern": r"a = \d"}).observation
    assert "unknown tool" in env.step("teleport", {}).observation
    assert "bad arguments" in env.step("read_file", {"file": "x"}).observation


def test_a_reference_the_judge_cannot_run_is_not_answered_as_bad_arguments(env, judge, monkeypatch):
    """Seen on the H100 (the recipe's fifth attempt): a reference worker that died of the device's memory raised
    TaskError out of `verify`, answered as the call's "bad arguments" and counted as the policy's malformed call."""
    def dies(*args, **kwargs):
        raise TaskError("reference affine_relu.py: the reference worker exited with code 0: RuntimeError: "
                        "cuMemCreate failed: CUDA error 2 (out of memory)")

    monkeypatch.setattr(judge, "evaluate", dies)
    step = env.step("verify", {})
    assert step.info.get("error") and "bad arguments" not in step.observation, step.observation
    assert "could not run the task's reference" in step.observation and "out of memory" in step.observation


def test_wrongly_typed_arguments_are_answered_as_bad_arguments_and_limits_hold(env, judge, tmp_path):
    """Held out (red team, 2026-12-05): a line number "x", `edits` as a string, a NUL in a path, a lone surrogate in
    content, a timeout of Infinity raised out of the loop (the episode, a PPO step or a verl rollout ended there,
    and RFT kept the call unrecorded); a bash timeout of 10**6 ran past the episode's limit; the file tools read a
    file of any size into this process."""
    bad = [("read_file", {"path": "model.py", "start_line": "x"}), ("multi_edit", {"path": "model_new.py",
                                                                                   "edits": "oops"}),
           ("multi_edit", {"path": "model_new.py", "edits": ["oops"]}), ("write_file", {"path": "a\0b", "content": ""}),
           ("write_file", {"path": "a.py", "content": "\ud800"}), ("bash", {"command": "true", "timeout": "soon"}),
           ("bash", {"command": "true", "timeout": float("inf")}), ("bash", {"command": "true", "timeout": 1e9})]
    for name, arguments in bad:
        step = env.step(name, arguments)
        assert step.info.get("error") and ("bad arguments" in step.observation or "edit 0" in step.observation), \
            (name, arguments, step.observation)
    short = Environment(judge, tmp_path / "short", use_sandbox=SANDBOX, bash_timeout=2)
    short.reset(AFFINE)
    assert "killed after 2 s" in short.step("bash", {"command": "sleep 20", "timeout": 10**6}).observation
    with open(env.workspace / "big.txt", "wb") as big:
        big.truncate(17 << 20)
    assert "larger than 16 MiB" in env.step("read_file", {"path": "big.txt"}).observation
    assert "big.txt: larger than 16 MiB, not searched" in env.step("grep", {"pattern": "x"}).observation


def test_bash_output_is_clipped_and_a_hang_is_killed(env):
    long = env.step("bash", {"command": "python3 -c \"print('x' * 50000)\""}).observation
    assert "characters cut" in long and len(long) < 13_000
    hang = env.step("bash", {"command": "sleep 30", "timeout": 2}).observation
    assert "killed after 2 s" in hang
    assert clip("short") == "short"


def test_an_interrupted_bash_command_is_not_left_running(judge, tmp_path):
    """Ctrl-C or SIGTERM (KeyboardInterrupt in the main thread) during a bash call kills the command, which runs in
    a session of its own that no terminal's Ctrl-C reaches (here unsandboxed: no cgroup to end it either)."""
    env = Environment(judge, tmp_path / "run", use_sandbox=False, bash_timeout=60)
    env.reset(AFFINE)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGUSR1, interrupt)
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGUSR1)).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            env.step("bash", {"command": "sleep 3; touch late"})
    finally:
        signal.signal(signal.SIGUSR1, previous)
    time.sleep(3)
    assert not (env.workspace / "late").exists()


@pytest.mark.skipif(not SANDBOX, reason="sandbox unavailable here")
def test_bash_barriers_as_the_agent_sees_them(env, visible_dir):
    outside = visible_dir / "agent-outside.txt"  # outside /tmp, which the sandbox replaces: only the view can deny it
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    probe = (f"echo hi > {outside}; echo outside-rc=$?; touch kernels/ok && echo ws-ok; "
             "echo x >> binding.cpp; echo binding-rc=$?; "
             "python3 -c \"import socket; print('net', socket.socket().connect_ex(('127.0.0.1', "
             f"{server.getsockname()[1]})))\"; echo key=${{OPENAI_API_KEY:-none}}")
    os.environ["OPENAI_API_KEY"] = "sk-secret-test"
    try:
        obs = env.step("bash", {"command": probe}).observation
        written_inside = outside.exists()
        plain = subprocess.run(["bash", "-c", probe], cwd=env.workspace, capture_output=True, text=True).stdout
    finally:
        del os.environ["OPENAI_API_KEY"]
        server.close()
    assert "outside-rc=0" in plain and "net 0" in plain  # the same command gets through without the sandbox
    outside.unlink()
    assert not written_inside and "outside-rc=1" in obs and "Read-only file system" in obs, obs
    assert "ws-ok" in obs and (env.workspace / "kernels" / "ok").exists()
    assert "binding-rc=1" in obs and obs.count("Read-only file system") >= 2, obs
    assert "net " in obs and "net 0" not in obs, obs
    assert "key=none" in obs


def test_file_tools_never_follow_the_agents_links_out_of_the_workspace(env, tmp_path):
    """grep, glob and read_file run in the judge's process, outside the sandbox: links the agent's bash made to
    hidden files (the judge's cache, other episodes) must not be followed, nor `..` patterns."""
    secret = tmp_path / "private" / "canary.txt"
    secret.parent.mkdir()
    secret.write_text("judge-private canary 7f3a\n")
    env.step("bash", {"command": f"ln -s {secret} canary.txt; ln -s {secret.parent} peek; "
                                 f"ln -s {secret} kernels/k.cpp; ln -s loop loop"})
    for path in (".", "kernels", "canary.txt", "peek"):
        assert "7f3a" not in env.step("grep", {"pattern": "canary", "path": path}).observation, path
    assert "no match" in env.step("grep", {"pattern": "canary"}).observation
    for pattern in ("peek/*", "*", "**/*", "loop"):
        assert "canary" not in env.step("glob", {"pattern": pattern}).observation, pattern
    for pattern in ("../*", "../../private/*", f"{secret.parent}/*"):
        assert env.step("glob", {"pattern": pattern}).info["error"], pattern
    for path in ("canary.txt", "peek/canary.txt", "kernels/k.cpp", "loop"):
        read = env.step("read_file", {"path": path})
        assert read.info["error"] and "symbolic link" in read.observation and "7f3a" not in read.observation
        assert "symbolic link" in env.step("write_file", {"path": path, "content": "x"}).observation
    assert secret.read_text() == "judge-private canary 7f3a\n"
    assert "model_new.py" in env.step("glob", {"pattern": "*.py"}).observation  # plain files still show


def test_a_candidate_with_linked_kernels_is_refused(env, tmp_path):
    """A `kernels/` linked to another episode's verified kernels is not judged as this episode's."""
    other = tmp_path / "other" / "snapshots" / "000" / "kernels"
    other.mkdir(parents=True)
    (other / "affine_relu.cpp").write_text(KERNEL)
    (other / "affine_relu_binding.cpp").write_text(BINDING)
    env.step("write_file", {"path": "model_new.py", "content": MODEL_NEW})
    env.step("bash", {"command": f"rmdir kernels && ln -s {other} kernels"})
    for tool in ("compile", "verify"):
        step = env.step(tool, {})
        assert step.info.get("error") and "kernels/ is a symbolic link" in step.observation, step.observation
    assert not env.snapshots


@pytest.mark.skipif(not SANDBOX, reason="sandbox unavailable here")
def test_bash_does_not_see_the_episodes_played_beside_it(judge, visible_dir):
    """Rollouts side by side under one root (outside /tmp, which the sandbox replaces): one episode's bash sees
    neither another's workspace nor its snapshots, and its own workspace stays writable."""
    root = visible_dir / "episodes"
    kernel = root / "a" / "run" / "snapshots" / "000" / "kernels" / "k.cpp"
    kernel.parent.mkdir(parents=True)
    kernel.write_text("// verified by episode a\n")
    env = Environment(judge, root / "b" / "run", use_sandbox=True, bash_timeout=60, episodes_root=root)
    env.reset(AFFINE)
    obs = env.step("bash", {"command": f"cat {kernel}; cp -r {root}/a/run/snapshots .; ls {root}; "
                                       "touch kernels/mine && echo ws-ok; echo x >> binding.cpp; echo ro=$?"})
    assert "verified by episode a" not in obs.observation and not (env.workspace / "snapshots").exists()
    assert "ws-ok" in obs.observation and (env.workspace / "kernels" / "mine").exists(), obs.observation
    assert "ro=1" in obs.observation
    for folder in ("/", "/work", "/usr/lib/x"):
        with pytest.raises(ValueError, match="cannot be hidden"):
            Environment(judge, root / "c" / "run", use_sandbox=True, episodes_root=Path(folder))



@pytest.mark.skipif(not SANDBOX, reason="sandbox unavailable here")
def test_a_lone_episode_s_candidate_does_not_see_the_agent_s_files_at_run_time(judge, visible_dir):
    """Held out (thirty-fifth session, open row): a lone episode (`optimize`) named no episodes root, and its
    candidate's process could read the agent's workspace at run time: a kernel whose factor came from a file there
    was judged correct, though the judge's copy of the candidate (and `best/`) lacks that file. The episode's own
    folder is hidden from its candidates now."""
    env = Environment(judge, visible_dir / "lone" / "run", use_sandbox=True, bash_timeout=60)
    env.reset(AFFINE)
    factor = env.workspace / "kernels" / "factor.txt"
    model = MODEL_NEW.replace("class ModelNew", f"FACTOR = open({str(factor)!r}).read()\n\n\nclass ModelNew", 1)
    assert model != MODEL_NEW
    for path, content in {"kernels/affine_relu.cpp": KERNEL, "kernels/affine_relu_binding.cpp": BINDING,
                          "kernels/factor.txt": "0.5", "model_new.py": model}.items():
        env.step("write_file", {"path": path, "content": content})
    obs = env.step("verify", {}).observation
    assert "factor.txt" in obs and "No such file" in obs, obs

# ---- clients ----------------------------------------------------------------------------------------------
def test_text_tool_calls_and_single_turn_files_are_parsed():
    calls = parse_text_tool_calls('Let me look.\n<tool_call>\n{"name": "read_file", "arguments": {"path": '
                                  '"model.py"}}\n</tool_call>\n<tool_call>{bad json}</tool_call>')
    assert [(c.name, c.arguments) for c in calls] == [("read_file", {"path": "model.py"})]
    messy = {  # what real models write: no closing tag, a fence inside the tags, "parameters", a bare JSON reply
        '<tool_call>\n{"name": "glob", "arguments": {"pattern": "*"}}': [("glob", {"pattern": "*"})],
        '<tool_call>\n```json\n{"name": "compile", "arguments": {}}\n```\n</tool_call>': [("compile", {})],
        '<tool_call>{"name": "glob", "parameters": {"pattern": "*.cu"}}</tool_call>': [("glob", {"pattern": "*.cu"})],
        '```json\n{"name": "verify", "arguments": {}}\n```': [("verify", {})],
        '{"name": "finish", "arguments": {"summary": "done"}}': [("finish", {"summary": "done"})],
        'A JSON example: {"name": "x", "arguments": {}} in prose.': [],  # not a call
        '{"name": "Model", "layers": 3}': [],  # a JSON reply that is no call
        '<tool_call>{"name": "glob", "arguments": {"pattern": "*"}}</tool_call> <tool_call>{broken': [
            ("glob", {"pattern": "*"})]}
    for text, expected in messy.items():
        assert [(c.name, c.arguments) for c in parse_text_tool_calls(text)] == expected, text
    files = parse_files("Here:\n### FILE: model_new.py\n```python\nimport torch\n```\n\n### FILE: kernels/k.cpp\n"
                        "```cpp\nint x;\n```\n")
    assert files == {"model_new.py": "import torch\n", "kernels/k.cpp": "int x;\n"}


def test_text_tools_put_the_schemas_in_the_system_message_and_results_in_user_turns():
    from cuda_agent.agent.tools import SCHEMAS
    from cuda_agent.llm import with_text_tools

    conversation = [{"role": "system", "content": "Be fast."}, {"role": "user", "content": "Task."},
                    {"role": "assistant", "content": '<tool_call>{"name": "glob"}</tool_call>', "tool_calls": [
                        call("glob", pattern="*")]},
                    {"role": "tool", "tool_call_id": "a", "content": "model.py"},
                    {"role": "tool", "tool_call_id": "b", "content": "SKILL.md"}]
    sent = with_text_tools(conversation, SCHEMAS)
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert sent[0]["content"].startswith("Be fast.") and '"name": "verify"' in sent[0]["content"]
    assert "<tool_call>" in sent[0]["content"] and "tool_calls" not in sent[2]
    assert sent[3]["content"] == ("<tool_response>\nmodel.py\n</tool_response>\n"
                                  "<tool_response>\nSKILL.md\n</tool_response>")
    assert with_text_tools(conversation[1:2], SCHEMAS)[0]["role"] == "system"  # no system message: one is added


def call(name: str, **arguments) -> dict:
    call.n = getattr(call, "n", 0) + 1
    return {"id": f"call_{call.n}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


EPISODE = [  # a model that writes a kernel with a bug, sees verify fail, fixes it, profiles, finishes
    {"role": "assistant", "content": "Reading the task.", "tool_calls": [call("read_file", path="model.py")]},
    {"role": "assistant", "content": "Fused kernel, binding and ModelNew.", "tool_calls": [
        call("write_file", path="kernels/affine_relu.cpp", content=BUGGY),
        call("write_file", path="kernels/affine_relu_binding.cpp", content=BINDING),
        call("write_file", path="model_new.py", content=MODEL_NEW)]},
    {"role": "assistant", "content": "", "tool_calls": [call("compile")]},
    {"role": "assistant", "content": "", "tool_calls": [call("verify")]},
    {"role": "assistant", "content": "The factor is wrong.", "tool_calls": [
        call("edit", path="kernels/affine_relu.cpp", old="* 0.25f;", new="* 0.5f;")]},
    {"role": "assistant", "content": "", "tool_calls": [call("verify")]},
    {"role": "assistant", "content": "", "tool_calls": [call("profile")]},
    {"role": "assistant", "content": "Done.", "tool_calls": [call("finish", summary="fused affine+relu")]},
]


class ScriptedEndpoint:
    """A chat-completions server on loopback that answers with the next scripted assistant message (or, given a
    function, with its answer to the request)."""

    def __init__(self, replies):
        self.replies, self.requests = replies if callable(replies) else list(replies), []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, body: dict, status: int = 200) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send({"object": "list", "data": [{"id": "scripted", "object": "model", "created": 0,
                                                        "owned_by": "test"}]})

            def do_POST(self):
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                endpoint.requests.append(request)
                if callable(endpoint.replies):
                    message = endpoint.replies(request)
                    if "status" in message:  # an error the endpoint answers with
                        return self._send({"error": message["error"]}, message["status"])
                elif endpoint.replies:
                    message = endpoint.replies.pop(0)
                else:
                    return self._send({"error": {"message": "script exhausted"}}, 500)
                prompt = sum(len(json.dumps(m)) for m in request["messages"]) // 4
                self._send({"id": f"chatcmpl-{len(endpoint.requests)}", "object": "chat.completion", "created": 0,
                            "model": request["model"], "choices": [{
                                "index": 0, "message": message,
                                "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
                            "usage": {"prompt_tokens": prompt, "completion_tokens": 50, "total_tokens": prompt + 50}})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_whole_episode_over_http_through_the_openai_client(judge, tmp_path):
    endpoint = ScriptedEndpoint(EPISODE)
    run_dir = tmp_path / "run"
    states = []
    try:
        client = OpenAIClient("scripted", endpoint.url, api_key="test", max_retries=0)
        client.check()
        env = Environment(judge, run_dir, use_sandbox=SANDBOX)
        summary = run_episode(env, client, AFFINE, run_dir, LoopConfig(max_turns=20), states.append)
    finally:
        endpoint.close()
    assert summary.stop == "finish" and summary.turns == len(EPISODE)
    final = summary.final_verdict
    assert final["correct"] and final["reward"] >= 1, final["error"]
    assert summary.snapshots == 1 and (run_dir / "best" / "model_new.py").exists()
    assert "0.5f" in (run_dir / "best" / "kernels" / "affine_relu.cpp").read_text()
    assert summary.best_single_file == str(run_dir / "best_single_file.py")
    # The model saw the failure it had to fix, with its numbers.
    verify_results = [m["content"] for r in endpoint.requests for m in r["messages"] if m["role"] == "tool"
                      and "correct:" in m["content"]]
    assert any("correct: False" in c and "first failure: incorrect" in c for c in verify_results)
    records = [json.loads(line) for line in (run_dir / "trajectory.jsonl").read_text().splitlines()]
    kinds = [r["type"] for r in records]
    assert kinds[:2] == ["system", "user"] and kinds[-1] == "result"
    tools = [r["tool"] for r in records if r["type"] == "tool"]
    assert tools == ["read_file", "write_file", "write_file", "write_file", "compile", "verify", "edit", "verify",
                     "profile", "finish"]
    assert all(r["usage"]["total_tokens"] > 0 for r in records if r["type"] == "assistant")
    verdicts = [r["verdict"] for r in records if r.get("verdict")]
    assert [v["correct"] for v in verdicts] == [False, True, True]
    assert states[-1].best_reward >= 1 and states[-1].last_tool == "finish"
    assert json.loads((run_dir / "summary.json").read_text())["final_verdict"]["reward"] == final["reward"]


def test_an_endpoint_s_refusal_of_a_conversation_longer_than_its_context_is_told_apart():
    refusals = {"vllm": "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens.",
                "sglang": "The input (9000 tokens) is longer than the model's context length (8192 tokens).",
                "other": "Invalid value for 'temperature'."}
    endpoint = ScriptedEndpoint(lambda request: {"status": 400, "error": {
        "message": refusals[request["messages"][-1]["content"]], "type": "BadRequestError", "code": 400}})
    try:
        client = OpenAIClient("scripted", endpoint.url, api_key="test", max_retries=0)
        for server in ("vllm", "sglang", "other"):
            with pytest.raises(LLMError) as refused:
                client.complete([{"role": "user", "content": server}], None)
            assert isinstance(refused.value, ContextFull) == (server != "other"), refused.value
    finally:
        endpoint.close()
    # (the loop ends an episode at its context limit on a ContextFull: tests/test_rl_stages.py's rollout test)


def test_single_turn_mode_judges_the_files_of_one_reply(judge, tmp_path):
    reply = (f"### FILE: model_new.py\n```python\n{MODEL_NEW}```\n\n### FILE: kernels/affine_relu.cpp\n```cpp\n"
             f"{KERNEL}```\n\n### FILE: kernels/affine_relu_binding.cpp\n```cpp\n{BINDING}```\n")
    client = ScriptedClient([{"role": "assistant", "content": reply}])
    run_dir = tmp_path / "single"
    summary = run_episode(Environment(judge, run_dir, use_sandbox=SANDBOX), client, AFFINE, run_dir,
                          LoopConfig(single_turn=True))
    assert summary.stop == "single turn" and summary.final_verdict["reward"] >= 1
    replay = ScriptedClient.from_trajectory(str(run_dir / "trajectory.jsonl"))
    assert replay.messages[0]["content"] == reply


def test_a_malformed_tool_call_is_answered_with_its_parse_error_not_as_no_call(judge, tmp_path):
    """A small model's typical slip: a raw newline inside a JSON string. It is told what did not parse, not that
    it called no tool."""
    broken = '<tool_call>{"name": "write_file", "arguments": {"path": "a.py", "content": "x = 1\ny = 2"}}</tool_call>'
    client = ScriptedClient([{"role": "assistant", "content": broken}] * 2)
    run_dir = tmp_path / "malformed"
    run_episode(Environment(judge, run_dir, use_sandbox=SANDBOX), client, AFFINE, run_dir, LoopConfig(max_invalid=2))
    told = [json.loads(line)["message"]["content"] for line in (run_dir / "trajectory.jsonl").read_text().splitlines()
            if json.loads(line).get("type") == "user" and json.loads(line).get("turn")]
    assert told[0].startswith("Your tool call could not be read: <tool_call> block 1: invalid JSON"), told
    assert "Invalid control character" in told[0] and "No tool was called" not in told[0], told


def test_an_unreadable_block_beside_a_call_that_parsed_is_told_counted_and_refused_by_rft(judge, tmp_path):
    """Held out (red team, 2026-12-05): a reply with one good `<tool_call>` and one unreadable block dropped the
    unreadable one unseen: the model was never told, `train eval` counted no malformed call and RFT kept the
    trajectory."""
    from cuda_agent.rl.evaluation import record_of
    from cuda_agent.rl.rft import RFTFilter, read_trajectory, rejection

    mixed = ('<tool_call>{"name": "read_file", "arguments": {"path": "model.py"}}</tool_call>\n'
             '<tool_call>{"name": "write_file", "arguments": {"path": "a.py", "content": "x\ny"}}</tool_call>')
    client = ScriptedClient([{"role": "assistant", "content": mixed},
                             {"role": "assistant", "content": '<tool_call>{"name": "finish", "arguments": {}}'
                                                              '</tool_call>'}])
    run_dir = tmp_path / "mixed"
    run_episode(Environment(judge, run_dir, use_sandbox=SANDBOX), client, AFFINE, run_dir, LoopConfig())
    records = read_trajectory(run_dir / "trajectory.jsonl")
    told = [r for r in records if r.get("type") == "user" and r.get("turn") == 1]
    assert len(told) == 1 and told[0]["malformed"] == 1, told
    assert told[0]["message"]["content"].startswith("Your tool call could not be read: <tool_call> block 2")
    assert record_of(AFFINE, 0, run_dir).malformed == 1
    assert rejection(records, RFTFilter(min_reward=-1)) == "an unreadable tool call"


def test_a_compact_episode_offers_fewer_tools_leaves_the_skill_in_the_workspace_and_cuts_tool_output(judge, tmp_path):
    """For a small model's context: six tools, SKILL.md read on demand, every tool result cut to its head and tail."""
    client = ScriptedClient([
        {"role": "assistant", "content": "", "tool_calls": [call("bash", command="ls")]},
        {"role": "assistant", "content": "", "tool_calls": [call("read_file", path="SKILL.md")]},
        {"role": "assistant", "content": "", "tool_calls": [call("finish")]}])
    run_dir = tmp_path / "compact"
    env = Environment(judge, run_dir, use_sandbox=SANDBOX, compact=True)
    run_episode(env, client, AFFINE, run_dir, LoopConfig(tool_output_chars=300))
    records = [json.loads(line) for line in (run_dir / "trajectory.jsonl").read_text().splitlines()]
    opening = next(r["message"]["content"] for r in records if r["type"] == "user")
    assert "SKILL.md (read it first)" in opening and (run_dir / "workspace" / "SKILL.md").read_text() not in opening
    assert len(env.reset(AFFINE)["tools"]) == 6
    bash, skill = [r["message"]["content"] for r in records if r["type"] == "tool"][:2]
    assert bash.startswith("error: unknown tool 'bash'")
    assert "characters cut" in skill and len(skill) < 400


def test_replies_without_tool_calls_end_the_episode(judge, tmp_path):
    client = ScriptedClient([{"role": "assistant", "content": "Thinking..."}] * 3)
    run_dir = tmp_path / "idle"
    summary = run_episode(Environment(judge, run_dir, use_sandbox=SANDBOX), client, AFFINE, run_dir,
                          LoopConfig(max_invalid=3))
    assert summary.stop == "no tool call" and summary.stop_detail == "3 replies in a row without a tool call"
    assert summary.final_verdict is None and summary.reward == -1


def test_optimize_with_an_unreachable_endpoint_is_one_clear_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    run = subprocess.run([sys.executable, "-m", "cuda_agent", "optimize", str(AFFINE), "--model", "m",
                          "--base-url", f"http://127.0.0.1:{port}/v1", "--backend", "cpu", "--out",
                          str(tmp_path / "run")], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "CUDA_AGENT_CACHE": str(tmp_path / "cache")})
    assert run.returncode == 2
    lines = [line for line in run.stderr.strip().splitlines() if line.strip()]
    assert len(lines) <= 2 and "unusable" in run.stderr and "Connection" in run.stderr, run.stderr


def test_the_best_workspace_exported_as_one_file_passes_the_judge(judge, tmp_path):
    from cuda_agent.workspace.candidate import load_candidate
    from cuda_agent.workspace.single_file import to_single_file

    single = tmp_path / "affine_relu_single_export.py"
    single.write_text(to_single_file(load_candidate(OK), "cpu"))
    verdict = judge.evaluate(AFFINE, single)
    assert verdict.candidate["kind"] == "single_file" and verdict.correct and verdict.reward >= 1, verdict.error


def test_optimize_command_runs_the_episode_and_reports_the_best(cache_dir, tmp_path, fast_cli):
    """In-process (the judge times briefly): the episode's progress on stderr, the result on stdout."""
    thinking = {"role": "assistant", "content": "Let me think about the layout first.", "tool_calls": []}
    endpoint = ScriptedEndpoint([EPISODE[0], thinking, *EPISODE[1:]])  # a turn without a tool call, then the rest
    try:
        run = CliRunner().invoke(app, ["optimize", str(AFFINE), "--model", "scripted", "--base-url", endpoint.url,
                                       "--backend", "cpu", "--out", str(tmp_path / "run"), "--cache-dir",
                                       str(cache_dir), "--max-turns", "20"])
    finally:
        endpoint.close()
    assert run.exit_code == 0, run.output[-2000:]
    assert "turn   9  finish" in run.stderr  # live progress, one line per tool call
    assert "turn   2  model      50 tokens in" in run.stderr  # and one per reply, also without a tool call
    assert "no tool call" in next(line for line in run.stderr.splitlines() if line.startswith("turn   2  model"))
    assert "stopped: finish after 9 turn(s); 1 verified candidate(s)" in run.stdout
    assert "best: reward" in run.stdout and (tmp_path / "run" / "best_single_file.py").exists()


def test_optimize_a_module_makes_its_task_runs_the_agent_and_exports_the_best_kernel(cache_dir, tmp_path, fast_cli):
    """`optimize --module`: the user's class becomes the run's task, the episode solves it, and the best kernel is
    exported as a drop-in module of the user's class (docs/drop-in.md)."""
    user_module = AFFINE.read_text().split("\n\nN = ")[0].replace("class Model(", "class AffineReLU(")
    (tmp_path / "blocks.py").write_text(user_module)
    solved = [{"role": "assistant", "content": "", "tool_calls": [
        call("write_file", path="kernels/affine_relu.cpp", content=KERNEL),
        call("write_file", path="kernels/affine_relu_binding.cpp", content=BINDING),
        call("write_file", path="model_new.py", content=MODEL_NEW)]},
        {"role": "assistant", "content": "", "tool_calls": [call("profile")]},
        {"role": "assistant", "content": "Done.", "tool_calls": [call("finish", summary="fused")]}]
    endpoint = ScriptedEndpoint(solved)
    try:
        run = CliRunner().invoke(app, ["optimize", "--module", f"{tmp_path / 'blocks.py'}:AffineReLU", "--init",
                                       "[2.0, 0.1]", "--inputs", "[torch.randn(1 << 16)]", "--model", "scripted",
                                       "--base-url", endpoint.url, "--backend", "cpu", "--out", str(tmp_path / "run"),
                                       "--cache-dir", str(cache_dir)])
    finally:
        endpoint.close()
    assert run.exit_code == 0, run.output[-2000:]
    assert "best: reward" in run.stdout and "exported: " in run.stdout, run.stdout
    record = json.loads((tmp_path / "run" / "module.json").read_text())
    assert record["export"]["class"] == "AffineReLU" and record["check"] is None
    package = import_file(Path(record["export"]["package"]) / "__init__.py", "optimized_affine_relu")
    x = torch.randn(4096)
    assert torch.allclose(package.AffineReLU(2.0, 0.1)(x), torch.relu(x * 2.0 + 0.1) * 0.5)
    page = CliRunner().invoke(app, ["report", str(tmp_path / "run"), "--out", str(tmp_path / "run.html")])
    assert page.exit_code == 0, page.output
    html = (tmp_path / "run.html").read_text()  # one page: the episode, then the export
    assert "Your module: the kernel, exported" in html and record["export"]["package"] in html
    both = CliRunner().invoke(app, ["optimize", str(AFFINE), "--module", "x.py:C", "--model", "m", "--backend", "cpu"])
    assert both.exit_code == 2 and "give one of REFERENCE, --module" in both.output


def test_the_agent_is_judged_by_the_strict_policy_only(cache_dir, tmp_path):
    lenient = Judge("cpu", fast_config(cache_dir, policy="kernelbench", sandbox="none"))
    with pytest.raises(ValueError, match="strict policy"):
        Environment(lenient, tmp_path / "run", use_sandbox=False)
    with pytest.raises(ValueError, match="sandboxed judge"):
        Environment(Judge("cpu", fast_config(cache_dir, sandbox="none")), tmp_path / "run", use_sandbox=True)


def test_optimize_suite_runs_every_task_at_once_resumes_and_exports_what_eval_suite_judges(cache_dir, tmp_path,
                                                                                           fast_cli):
    """In-process (the judge times briefly); every command's JSON on stdout."""
    suite = tmp_path / "suite"
    (suite / "level1").mkdir(parents=True)
    (suite / "level1" / "1_affine_relu.py").write_text(AFFINE.read_text())
    (suite / "level1" / "2_linear_gelu.py").write_text((TASKS / "linear_gelu.py").read_text())
    solved = [{"role": "assistant", "content": "", "tool_calls": [
        call("write_file", path="kernels/affine_relu.cpp", content=KERNEL),
        call("write_file", path="kernels/affine_relu_binding.cpp", content=BINDING),
        call("write_file", path="model_new.py", content=MODEL_NEW)]},
        {"role": "assistant", "content": "", "tool_calls": [call("verify")]}, EPISODE[-1]]
    gave_up = [{"role": "assistant", "content": "Too hard.", "tool_calls": [call("finish", summary="none")]}]

    def reply(request):  # each episode by its task, whatever order the two episodes' turns arrive in
        script = solved if "self.shift" in request["messages"][1]["content"] else gave_up
        return script[sum(m["role"] == "assistant" for m in request["messages"])]

    endpoint = ScriptedEndpoint(reply)
    out = tmp_path / "out"
    command = ["optimize-suite", str(suite), "--model", "scripted", "--base-url", endpoint.url, "--backend", "cpu",
               "--out", str(out), "--cache-dir", str(cache_dir), "--concurrency", "2", "--sandbox", "auto", "--json"]
    try:
        first = CliRunner().invoke(app, command)
        asked = len(endpoint.requests)
        again = CliRunner().invoke(app, command)
    finally:
        endpoint.close()
    assert first.exit_code == 0 and again.exit_code == 0, first.output[-2000:] + again.output[-2000:]
    assert asked == len(solved) + len(gave_up) and len(endpoint.requests) == asked  # the rerun asked nothing
    report = json.loads(first.stdout)
    assert json.loads(again.stdout)["overall"] == report["overall"] == json.loads((out / "report.json").read_text())[
        "overall"]
    assert report["overall"]["n"] == 2 and report["overall"]["pass_rate"] == 0.5
    by_task = {r["task"]: r for r in report["tasks"]}
    assert by_task["level1/1_affine_relu.py"]["verdict"]["reward"] >= 1
    assert by_task["level1/2_linear_gelu.py"]["episode"]["stop"] == "finish"
    assert (out / "solutions" / "level1" / "1_affine_relu" / "model_new.py").exists()
    assert not (out / "solutions" / "level1" / "2_linear_gelu").exists()
    assert (out / "runs" / "level1" / "2_linear_gelu" / "trajectory.jsonl").exists()
    rejudged = CliRunner().invoke(app, ["eval-suite", str(suite), "--solutions", str(out / "solutions"), "--backend",
                                        "cpu", "--cache-dir", str(cache_dir), "--json", "--db",
                                        str(tmp_path / "db.sqlite")])
    assert rejudged.exit_code == 0, rejudged.output[-2000:]
    assert json.loads(rejudged.stdout)["overall"]["pass_rate"] == 0.5
    # the run folder as a page: each task with its episode's turns and stop reason
    from cuda_agent.report import write_report

    page = write_report(out, tmp_path / "suite.html")[0].read_text()
    assert "<th>turns</th>" in page.replace(' class=""', "") and "<th>stop</th>" in page.replace(' class=""', "")
    assert ">finish<" in page and ">2_linear_gelu.py<" in page


def test_an_interrupted_episode_says_so_and_optimize_suite_plays_it_again(judge, tmp_path):
    """Ctrl-C or SIGTERM mid-episode: its summary says "interrupted" (not a finished episode with no verdict), and
    optimize-suite's rerun starts that task over instead of resuming it as done."""
    from cuda_agent.suite.evaluate import SuiteTask
    from cuda_agent.suite.optimize import _episode, run_dir_of

    class Interrupted(ScriptedClient):
        def complete(self, messages, tools):
            if self.calls == 1:
                raise KeyboardInterrupt
            return super().complete(messages, tools)

    task, out = SuiteTask("level1", AFFINE), tmp_path / "out"
    read = [{"role": "assistant", "content": "", "tool_calls": [call("read_file", path="model.py")]}]
    with pytest.raises(KeyboardInterrupt):
        _episode(judge, task, out, lambda: Interrupted(read * 2), LoopConfig(max_turns=3))
    summary = json.loads((run_dir_of(out, task) / "summary.json").read_text())
    assert summary["stop"] == "interrupted" and summary["turns"] == 2
    again, resumed = _episode(judge, task, out, lambda: ScriptedClient(EPISODE[-1:]), LoopConfig(max_turns=3))
    assert not resumed and again.stop == "finish" and again.turns == 1


def test_profile_says_no_speedup_was_credited_where_the_timing_was_too_noisy(env):
    from cuda_agent.judge.verdict import Verdict

    noisy = Verdict(reward=1, compiled=True, correct=True, times_us={"eager": 10.0, "compile": 8.0, "candidate": 5.0},
                    warnings=["timing too noisy to credit any speedup (a spread of 90%): reward for correctness only"])
    text = env.tools._speed(noisy)
    assert "no speedup credited (timing too noisy" in text and "reward: 1" in text, text


def test_an_episode_cut_by_the_caller_s_clock_is_not_judged_again_nor_summarised(judge, tmp_path, monkeypatch):
    """A batch sampler out of time raises TimeoutError mid-episode: the episode is dropped and played again, so its
    best snapshot is not re-judged (work after the time limit) and no summary says it ended."""
    class Cut(ScriptedClient):
        def complete(self, messages, tools):
            if self.calls == 2:
                raise ReplyCut("time limit reached after 128 tokens of this reply")
            return super().complete(messages, tools)

    env = Environment(judge, tmp_path / "run", use_sandbox=SANDBOX)
    rejudged = []
    monkeypatch.setattr(env, "result", lambda: rejudged.append(1))
    good = [{"role": "assistant", "content": "", "tool_calls": [
        call("write_file", path="kernels/affine_relu.cpp", content=KERNEL),
        call("write_file", path="kernels/affine_relu_binding.cpp", content=BINDING),
        call("write_file", path="model_new.py", content=MODEL_NEW)]},
        {"role": "assistant", "content": "", "tool_calls": [call("verify")]}]
    with pytest.raises(ReplyCut):
        run_episode(env, Cut(good + EPISODE[-1:]), AFFINE, tmp_path / "run", LoopConfig(max_turns=5))
    assert env.best() is not None  # a verified snapshot existed when the clock cut the episode
    assert not rejudged and not (tmp_path / "run" / "summary.json").exists()
    last = json.loads((tmp_path / "run" / "trajectory.jsonl").read_text().splitlines()[-1])
    assert last["event"] == "cut" and last["turn"] == 3
