"""The verl agent loop (`rl/verl_loop.py`) driven by a stand-in for verl's server manager that returns scripted
replies as token ids of SmolLM2's tokenizer: masks, log-prob lengths, the reward on the last token, truncation."""

import asyncio
import json

import pytest

pytest.importorskip("verl", reason="the `train` extra (verl) is not installed")

from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.agent_loop.agent_loop import DictConfigWrap  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from conftest import TASKS, fast_config  # noqa: E402
from cuda_agent.judge.pool import JudgePool  # noqa: E402
from cuda_agent.rl.demo import candidate_files  # noqa: E402
from cuda_agent.rl.verl_loop import CudaAgentLoop  # noqa: E402

transformers = pytest.importorskip("transformers")


class ScriptedServer:
    """verl's server manager replaying fixed replies, each token with log-prob -0.5; records every request."""

    def __init__(self, tokenizer, texts: list[str], end_of_turn: int):
        self.replies = [tokenizer.encode(t, add_special_tokens=False) + [end_of_turn] for t in texts]
        self.requests = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.requests.append({"prompt_ids": list(prompt_ids), **sampling_params})
        ids = self.replies.pop(0)[:sampling_params["max_tokens"]]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids))


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.fixture(scope="module")
def pool(cache_dir):
    with JudgePool("cpu", fast_config(cache_dir)) as pool:
        yield pool


def episode(tokenizer, pool, tmp_path, texts, response_length=8192, prompt_length=4096, server_class=None):
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": prompt_length,
                                                                 "response_length": response_length}},
                               "data": {}})
    loop = CudaAgentLoop(DictConfigWrap(config), None, tokenizer, None, None, DictConfigWrap(config.data),
                         backend="cpu", max_turns=6, episodes_dir=str(tmp_path), pool=pool)
    loop.server_manager = server = (server_class or ScriptedServer)(tokenizer, texts, loop.turns.end_of_turn)
    row = {"extra_info": {"reference": (TASKS / "affine_relu.py").read_text()}}
    return asyncio.run(loop.run({"temperature": 1.0}, **row)), server, loop


def test_a_solved_episode_gives_verl_its_tokens_masks_log_probs_and_reward(smollm2, pool, tmp_path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2)
    files = candidate_files("cpu", ["A"])
    texts = ["I write the kernel.\n" + "\n".join(call("write_file", path=p, content=c) for p, c in files.items()),
             "Checking.\n" + call("verify"), call("finish")]
    out, server, loop = episode(tokenizer, pool, tmp_path, texts)
    assert out.reward_score >= 1 and out.extra_fields["stop"] == "finish" and out.extra_fields["turns"] == 3
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs)
    sampled = [i for i, m in zip(out.response_ids, out.response_mask) if m]
    assert tokenizer.decode(sampled) == "".join(t + "<|im_end|>" for t in texts)
    assert all(lp == -0.5 for lp, m in zip(out.response_logprobs, out.response_mask) if m)
    assert 0 in out.response_mask and out.response_mask[-1] == 1  # tool results in between; ends on the model
    tensors = out.as_dict()  # what verl batches: the reward sits on the last response token
    assert float(tensors["rm_scores"][-1]) == out.reward_score and float(tensors["rm_scores"][:-1].abs().sum()) == 0
    # token in, token out: each request's prompt is the previous prompt + the reply + the tool results
    assert server.requests[1]["prompt_ids"][:len(server.requests[0]["prompt_ids"])] == server.requests[0]["prompt_ids"]
    assert out.prompt_ids == server.requests[0]["prompt_ids"]
    assert all(loop.turns.end_of_turn in r["stop_token_ids"] and r["max_tokens"] > 0 for r in server.requests)


def test_an_episode_past_the_response_length_is_cut_on_a_model_token(smollm2, pool, tmp_path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2)
    texts = [call("read_file", path="model.py"), call("read_file", path="model.py"), call("finish")]
    out, server, _ = episode(tokenizer, pool, tmp_path, texts, response_length=200)
    # model.py's text (the first tool result) fills the 200 tokens: no second turn, the result is cut off
    assert len(server.requests) == 1 and "response length reached" in out.extra_fields["stop_detail"]
    assert out.response_mask == [1] * len(out.response_ids) and len(out.response_ids) < 200
    assert out.reward_score == -1  # nothing verified


def test_a_workers_episodes_all_run_at_once(smollm2, pool, tmp_path):
    # verl awaits many episodes per worker; each waits on the server most of its life. The server here answers
    # nobody until all 40 are waiting: with asyncio's default executor (min(32, cores + 4) threads) this hangs.
    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2)
    count = 40

    class Gate(ScriptedServer):
        async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
            self.requests.append(request_id)
            if len(self.requests) == count:
                self.all_waiting.set()
            await asyncio.wait_for(self.all_waiting.wait(), 60)
            ids = tokenizer.encode(call("finish"), add_special_tokens=False) + [self.end]
            return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids))

    async def main():
        config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": 4096, "response_length": 512}},
                                   "data": {}})
        server = Gate(tokenizer, [], 0)
        server.all_waiting = asyncio.Event()
        loops = [CudaAgentLoop(DictConfigWrap(config), server, tokenizer, None, None, DictConfigWrap(config.data),
                               backend="cpu", episodes_dir=str(tmp_path / str(i)), pool=pool) for i in range(count)]
        server.end = loops[0].turns.end_of_turn
        row = {"extra_info": {"reference": (TASKS / "affine_relu.py").read_text()}}
        return await asyncio.gather(*(loop.run({}, **row) for loop in loops))

    outputs = asyncio.run(main())
    assert len(outputs) == count and all(o.extra_fields["stop"] == "finish" for o in outputs)


def test_an_aborted_generation_goes_on_from_where_it_stopped(smollm2, pool, tmp_path):
    """verl aborts generations when it updates the weights mid-rollout: the turn is sent again with what was sampled
    so far, not ended at -1."""
    class Aborting(ScriptedServer):
        async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
            if len(self.requests) == 0:
                self.requests.append({"prompt_ids": list(prompt_ids), **sampling_params})
                ids = self.replies[0][:5]
                self.replies[0] = self.replies[0][5:]
                return TokenOutput(token_ids=ids, log_probs=[-0.5] * 5, stop_reason="aborted")
            return await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)

    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2)
    texts = ["Done here.\n" + call("finish")]
    out, server, _ = episode(tokenizer, pool, tmp_path, texts, server_class=Aborting)
    assert out.extra_fields["stop"] == "finish", out.extra_fields
    first, again = server.requests
    assert again["prompt_ids"] == first["prompt_ids"] + out.response_ids[:5]
    assert again["max_tokens"] == first["max_tokens"] - 5
    assert tokenizer.decode([i for i, m in zip(out.response_ids, out.response_mask) if m]) == texts[0] + "<|im_end|>"
    assert out.metrics.generate_sequences > 0 and out.metrics.tool_calls > 0


def test_a_prompt_longer_than_verl_allows_cannot_break_the_batch(smollm2, pool, tmp_path):
    """One overlong prompt used to crash the whole rollout batch in verl's torch.cat: it now ends its episode at -1
    with a prompt of prompt_length tokens and one untrained response token, and never reaches the server."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2)
    out, server, loop = episode(tokenizer, pool, tmp_path, [call("finish")], prompt_length=256)
    assert server.requests == [] and out.reward_score == -1
    assert len(out.prompt_ids) == 256 and out.response_ids == [loop.turns.end_of_turn] and out.response_mask == [0]
    assert "longer than prompt_length" in out.extra_fields["stop_detail"]
    tensors = out.as_dict()
    assert float(tensors["rm_scores"][-1]) == -1
