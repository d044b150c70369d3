"""The agent as a verl agent loop (the `train` extra): `CudaAgentLoop`, named "cuda_agent" by the recipe's
`agent_loops.yaml` (with its options). Not also by verl's `@register`: this module is imported by the first
episode's instantiation, after the worker read the yaml, and the decorator would then replace the yaml's entry
(options and all) for every later episode.

verl runs rollouts as coroutines on its agent-loop workers; each episode builds the loop class and awaits `run`.
`run` plays the same episode as `cuda-agent train --stage agentic` (`rollout.play`: `agent.loop.run_episode`
with our Environment, tools, stop rules and judge) in a thread, with a `Sampler` that hands each turn's prompt ids
to verl's server manager (token in, token out) and waits for its ids and log-probs on the event loop. What verl
gets back: the prompt ids, the response ids with mask 1 on sampled tokens and 0 on tool results and template
tokens, the server's log-probs, and `reward_score` = the final verdict's milestone reward, which verl puts on the
last response token. The episode ends once its response reaches `response_length` tokens (nothing later may earn
the reward), and the response is cut to end on the model's last token.

A dataset row carries the task's reference source in `extra_info["reference"]`. Options come
from the agent-loop config file (`name: cuda_agent`, `_target_: cuda_agent.rl.verl_loop.CudaAgentLoop`, then
`backend`, `gpus`, `judge` ("local", or "ray": the judge on Ray actors, `shared_pool`), `max_turns`,
`single_turn`, `episodes_dir`). Each episode's run folder (`episodes_dir`/ID/run) keeps its trajectory, summary,
snapshots and best/; its workspace (the policy's files) is removed after the episode.

A generation the server aborted (weights updated mid-rollout) is sent again from where it stopped, up to
`RESUBMITS` times. An opening prompt longer than `prompt_length` (the dataset filters them: a safeguard) ends the
episode at -1 with its prompt cut to the last `prompt_length` tokens and one untrained token of response, so it
cannot break the batch. `AgentLoopMetrics` gets the seconds spent waiting for generation, and the rest of the
episode's time (its tools and the judge) as `tool_calls`.
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput

from ..agent.environment import Environment
from ..agent.loop import LoopConfig
from ..agent.tools import SCHEMAS
from ..judge.pool import JudgePool, shared_pool
from ..llm import LLMError
from .config import StageConfig
from .rollout import Episode, play
from .tokens import TurnTokenizer

# an episode's thread mostly waits (for the server, for the judge): far more of them than asyncio's default
# executor allows (min(32, cores + 4)), so that a worker's episodes all run at once
_EPISODES = ThreadPoolExecutor(max_workers=1024, thread_name_prefix="episode")
RESUBMITS = 8  # an aborted generation is sent again at most this many times


def _play(env: Environment, *args) -> Episode:
    """`rollout.play`, then the workspace removed (the policy's files, nothing to keep: trajectory, summary, snapshots
    and best/ stay)."""
    try:
        return play(env, *args)
    finally:
        shutil.rmtree(env.run_dir / "workspace", ignore_errors=True)


class CudaAgentLoop(AgentLoopBase):
    def __init__(self, *args, backend: str = "cuda", gpus: list[int] | None = None, judge: str = "local",
                 max_turns: int = 20, single_turn: bool = False, episodes_dir: str = "episodes",
                 episode_time_s: float = StageConfig.episode_time_s,
                 pool: JudgePool | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.pool = pool or shared_pool(backend, gpus, judge)
        self.loop_config = LoopConfig(max_turns=max_turns, single_turn=single_turn, time_limit_s=episode_time_s,
                                      max_context=self.rollout_config.prompt_length
                                      + self.rollout_config.response_length)
        self.turns = TurnTokenizer(self.tokenizer, None if single_turn else SCHEMAS, tool_format="text",
                                   template_kwargs=self.apply_chat_template_kwargs)
        self.episodes_dir = Path(episodes_dir)

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        reference = (kwargs.get("extra_info") or {}).get("reference")
        if not reference:
            raise ValueError("the row has no extra_info['reference'] (the task's source)")
        run_dir = self.episodes_dir / uuid.uuid4().hex[:12]
        run_dir.mkdir(parents=True)
        task = run_dir / "task.py"
        task.write_text(reference)
        loop, request_id = asyncio.get_running_loop(), uuid.uuid4().hex
        seen: dict[str, Any] = {"prompt": None, "logprobs": True, "generating_s": 0.0}
        limit, prompt_limit = self.rollout_config.response_length, self.rollout_config.prompt_length

        def sample(ids: list[int], room: int, stop: set[int]) -> tuple[list[int], list[float] | None]:
            seen["prompt"] = seen["prompt"] or len(ids)
            if seen["prompt"] > prompt_limit:
                raise LLMError(f"the prompt ({seen['prompt']} tokens) is longer than prompt_length ({prompt_limit})")
            room = min(room, limit - (len(ids) - seen["prompt"]))
            if room < 1:  # the episode ends here: nothing after the response length may earn the reward
                raise LLMError(f"response length reached ({limit} tokens)")
            began = time.monotonic()
            tokens, logprobs = self._generate(loop, request_id, ids, room, stop, sampling_params)
            seen["generating_s"] += time.monotonic() - began
            seen["logprobs"] = seen["logprobs"] and logprobs is not None
            return tokens, logprobs

        env = Environment(self.pool, run_dir / "run", use_sandbox=self.pool.sandboxed,
                          episodes_root=self.episodes_dir)  # the rollouts beside it are not its to copy
        began = time.monotonic()
        episode = await loop.run_in_executor(_EPISODES, _play, env, sample, self.turns, task, run_dir / "run",
                                             self.loop_config, limit)
        t = episode.trajectory
        end = max((i + 1 for i, m in enumerate(t.mask[:limit]) if m), default=0)  # the reward on a model token
        summary = episode.summary
        final = summary.final_verdict or {}
        prompt, response, mask = t.ids[:t.prompt_length], t.response[:end], t.mask[:end]
        logprobs = t.logprobs[:end] if seen["logprobs"] else None
        if len(prompt) > prompt_limit:  # never sampled: a placeholder verl can batch, trained on nothing
            prompt, response, mask = prompt[-prompt_limit:], [self.turns.end_of_turn], [0]
            logprobs = [0.0] if logprobs is not None else None
        tools_s = max(0.0, time.monotonic() - began - seen["generating_s"])  # the rest: tools, the judge
        return AgentLoopOutput(
            prompt_ids=prompt, response_ids=response, response_mask=mask, response_logprobs=logprobs,
            reward_score=episode.score if len(t.ids[:t.prompt_length]) <= prompt_limit else -1.0,
            num_turns=1 + 2 * summary.turns,
            metrics=AgentLoopMetrics(generate_sequences=seen["generating_s"], tool_calls=tools_s),
            extra_fields={"turns": summary.turns, "stop": summary.stop, "stop_detail": summary.stop_detail,
                          "best_speedup": final.get("speedup_vs_compile"), "run_dir": str(run_dir)})

    def _generate(self, loop, request_id: str, ids: list[int], room: int, stop: set[int],
                  sampling_params: dict[str, Any]) -> tuple[list[int], list[float] | None]:
        """One turn from verl's server (called from the episode's thread); an aborted generation continues from
        what it had sampled."""
        tokens: list[int] = []
        logprobs: list[float] | None = []
        for _ in range(RESUBMITS + 1):
            params = {**sampling_params, "max_tokens": room - len(tokens),
                      "stop_token_ids": sorted(set(sampling_params.get("stop_token_ids") or []) | stop)}
            out = asyncio.run_coroutine_threadsafe(self.server_manager.generate(
                request_id=request_id, prompt_ids=list(ids) + tokens, sampling_params=params), loop).result()
            tokens += list(out.token_ids)
            logprobs = logprobs + list(out.log_probs) if logprobs is not None and out.log_probs else None
            if out.stop_reason != "aborted" or len(tokens) >= room or (tokens and tokens[-1] in stop):
                return tokens, logprobs
        raise LLMError(f"the server aborted this turn's generation {RESUBMITS + 1} times")
