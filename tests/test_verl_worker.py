"""verl's own `AgentLoopWorker` running our agent loop, served by the batcher: the configuration the recipe writes,
verl's worker class and its post-processing, our `CudaAgentLoop` for every row, and one `BatchSampler` with a tiny
model standing in for verl's inference server (which cannot run here). What verl hands its trainer comes out: the
padded prompts and responses, the response masks, the sampler's log-probs and the reward on the last model token."""

import asyncio

import numpy as np
import pytest

pytest.importorskip("verl", reason="the `train` extra (verl) is not installed")

from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from conftest import TASKS  # noqa: E402
from cuda_agent.rl.batcher import BatchSampler  # noqa: E402
from cuda_agent.rl.verl_recipe import Recipe, prepare  # noqa: E402

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


class BatcherServer:
    """verl's server manager as the batcher: every episode's request joins the batch of whatever is waiting."""

    def __init__(self, batcher: BatchSampler):
        self.batcher, self.requests = batcher, 0

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.requests += 1
        stop = set(sampling_params.get("stop_token_ids") or [])
        tokens, logprobs = await asyncio.get_running_loop().run_in_executor(
            None, self.batcher, list(prompt_ids), sampling_params["max_tokens"], stop)
        return TokenOutput(token_ids=tokens, log_probs=logprobs)


def test_verls_agent_loop_worker_runs_our_loop_on_the_batcher(tiny_checkpoint, tmp_path):
    model_dir = tiny_checkpoint
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    recipe = Recipe("agentic", model_dir, tmp_path / "run", backend="cpu", gpus_per_node=1, steps=1, batch=4,
                    max_turns=2, max_prompt=4096, max_response=256)
    prepare(recipe, tasks=[TASKS / "affine_relu.py"])
    config = OmegaConf.load(tmp_path / "run" / "verl_agentic.yaml")
    loops = OmegaConf.load(config.actor_rollout_ref.rollout.agent.agent_loop_config_path)
    assert loops[0].backend == "cpu"  # the yaml's options reach every episode (not only the first)

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    batcher = BatchSampler(model, tokenizer.pad_token_id, temperature=1.0, gather_s=0.2)
    batcher.expected = 4
    server = BatcherServer(batcher)
    worker = AgentLoopWorker(config, server)
    reference = (TASKS / "affine_relu.py").read_text()
    rows = 4
    batch = DataProto.from_dict(non_tensors={
        "agent_name": np.array(["cuda_agent"] * rows, dtype=object),
        "extra_info": np.array([{"reference": reference}] * rows, dtype=object),
        "raw_prompt": np.array([[{"role": "user", "content": "task"}]] * rows, dtype=object),
        "index": np.arange(rows)})
    try:
        out = asyncio.run(worker.generate_sequences(batch))
    finally:
        batcher.close()

    length = config.actor_rollout_ref.rollout.response_length
    assert out.batch["responses"].shape == (rows, length) and out.batch["response_mask"].shape == (rows, length)
    assert out.batch["prompts"].shape == (rows, config.actor_rollout_ref.rollout.prompt_length)
    mask = out.batch["response_mask"]
    assert mask.sum() > 0 and torch.all(mask.sum(1) <= length)
    logprobs = out.batch["rollout_log_probs"]
    assert torch.all(logprobs[mask == 0] == 0) and torch.all(logprobs[mask == 1] < 0)  # the sampler's, per token
    scores = out.batch["rm_scores"]
    last = mask.shape[1] - 1 - mask.flip(1).int().argmax(1)  # each row's last model token
    assert torch.allclose(scores[torch.arange(rows), last], torch.full((rows,), -1.0))  # no kernel: -1 on it
    assert float(scores.abs().sum()) == rows  # and nothing elsewhere
    assert server.requests >= rows and batcher.batches < server.requests  # turns of several episodes shared batches
