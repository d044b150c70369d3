"""Episodes of the agent played by the model being trained, recorded as tokens.

`PolicyClient` stands where an OpenAI-compatible endpoint stands in `agent.loop.run_episode`: the same loop, the
same Environment, the same tools and stop rules. Each `complete` appends what the loop added since the model's last
turn (tool results, nudges) to the episode's `TokenTrajectory` as the chat template renders it, samples the next
turn token in, token out (`Sampler`: the batcher here, an inference server under verl), and
returns the decoded text as the reply (tool calls parsed from `<tool_call>` tags, as for any text-tools model).
The ids stay exactly what was sampled.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

from ..agent.environment import Environment
from ..agent.loop import LoopConfig, run_episode
from ..agent.summary import EpisodeSummary
from ..llm import ContextFull, LLMError, Reply, reply_from
from .models import last_hidden
from .tokens import TokenTrajectory, TurnTokenizer
from .trainer import Batch


HEAD_CHUNK = 512  # response positions per chunk of the output head's log-probs (and the entropy statistic)

Sampler = Callable[[list[int], int, set[int]], tuple[list[int], list[float]]]
"""(prompt ids, most new tokens, stop ids) -> (sampled ids, ending with a stop id unless cut; their log-probs)."""


class PolicyClient:
    model = "policy"

    def __init__(self, sample: Sampler, turns: TurnTokenizer, max_new_tokens: int, max_context: int):
        self.sample, self.turns = sample, turns
        self.max_new_tokens, self.max_context = max_new_tokens, max_context
        self.trajectory: TokenTrajectory | None = None
        self._seen = 0  # messages of the conversation already in the trajectory
        self.replies = self.cut = 0  # model turns, and those cut at their room (max_new_tokens or the context)

    def complete(self, messages: list[dict], tools: list[dict] | None) -> Reply:
        if self.trajectory is None:
            self.trajectory = self.turns.start(messages)
        else:
            self.turns.observations(self.trajectory, messages[self._seen:])
        room = min(self.max_new_tokens, self.max_context - len(self.trajectory.ids))
        if room < 1:
            raise ContextFull(f"{len(self.trajectory.ids)} tokens leave no room for a reply in "
                              f"{self.max_context}")
        tokens, logprobs = self.sample(self.trajectory.ids, room, {self.turns.end_of_turn})
        if not tokens:
            raise LLMError("the sampler returned no tokens")
        self.turns.model_turn(self.trajectory, tokens, logprobs)
        self._seen = len(messages) + 1  # and the assistant message the loop appends next
        cut = tokens[-1] != self.turns.end_of_turn
        self.replies, self.cut = self.replies + 1, self.cut + cut
        text = self.turns.tokenizer.decode(tokens[:-1] if not cut else tokens, skip_special_tokens=False,
                                          clean_up_tokenization_spaces=False)
        return reply_from(text, [], {"prompt_tokens": len(self.trajectory.ids) - len(tokens),
                                      "completion_tokens": len(tokens), "total_tokens": len(self.trajectory.ids)},
                           "length" if cut else "stop")


@dataclass
class Episode:
    trajectory: TokenTrajectory
    score: float  # the milestone reward of the final verdict (-1 when nothing was verified)
    summary: EpisodeSummary
    replies: int = 0  # model turns
    cut: int = 0  # of them, cut at the length limit


def play(env: Environment, sample: Sampler, turns: TurnTokenizer, reference: Path, run_dir: Path, loop: LoopConfig,
         max_new_tokens: int) -> Episode:
    """One episode of `run_episode` with the model behind `sample` (e.g. a `batcher.BatchSampler`) as the client."""
    client = PolicyClient(sample, turns, max_new_tokens, loop.max_context)
    summary = run_episode(env, client, reference, run_dir, loop)
    if client.trajectory is None:
        raise RuntimeError(f"the episode on {reference} ended before the model's first turn: {summary.stop} "
                           f"({summary.stop_detail})")
    return Episode(client.trajectory, summary.reward, summary, client.replies, client.cut)


SPEEDUP_CAP = 3.0  # the raw-speedup reward is clipped to the milestone reward's top


def speedup_reward(summary: EpisodeSummary) -> float:
    """The paper's raw-speedup ablation: the speedup over torch.compile, clipped to [0, 3], when the final verdict
    is correct (0 where no speed was credited: a timing too noisy to trust); -1 otherwise."""
    final = summary.final_verdict or {}
    speedup = final.get("speedup_vs_compile")
    if not final.get("correct"):
        return -1.0
    return min(max(float(speedup), 0.0), SPEEDUP_CAP) if speedup is not None else 0.0


def batch_of(episodes: list[Episode], pad_id: int | None) -> Batch:
    """Episodes padded into one batch: prompts left-padded to one length (so every response starts at the same
    column; rotary positions only shift), responses right-padded with mask 0. Pads are never attended to, so a
    tokenizer without a pad token pads with id 0."""
    pad_id = 0 if pad_id is None else pad_id
    start = max(e.trajectory.prompt_length for e in episodes)
    width = max(len(e.trajectory.response) for e in episodes)
    ids, attention, mask, logp = [], [], [], []
    for e in episodes:
        t = e.trajectory
        left, right = start - t.prompt_length, width - len(t.response)
        ids.append([pad_id] * left + t.ids + [pad_id] * right)
        attention.append([0] * left + [1] * len(t.ids) + [0] * right)
        mask.append(t.mask + [0] * right)
        logp.append(t.logprobs + [0.0] * right)
    return Batch(torch.tensor(ids), torch.tensor(attention), start, torch.tensor(mask),
                 torch.tensor(logp), torch.tensor([e.score for e in episodes], dtype=torch.float))


def response_logprob_fn(response_start: int, temperature: float = 1.0, entropy_grad: bool = False):
    """Log-probs over the full vocabulary of a batch's response tokens (what the sampler drew) and their entropies.
    Without `entropy_grad` (no entropy bonus) the output head runs in chunks of HEAD_CHUNK positions, each
    recomputed in the backward pass (activation checkpointing), and the entropy is a statistic without a graph:
    the [batch, tokens, vocab] logits are never held whole (in fp32 8 GB for 8 x 5,000 tokens of a 49k
    vocabulary, and under bf16 autocast their fp32 copy is most of a step's memory traffic)."""

    def fn(model, ids, attention):
        chosen = ids[:, response_start:]
        hidden = last_hidden(model.get_decoder(), ids, attention)[:, response_start - 1:-1]
        if entropy_grad:
            logp = torch.log_softmax(model.get_output_embeddings()(hidden).float() / temperature, dim=-1)
            return logp.gather(-1, chosen.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)
        head = partial(_head_chunk, model.get_output_embeddings(), temperature)
        parts = [checkpoint(head, h, c, use_reentrant=False) if torch.is_grad_enabled() else head(h, c)
                 for h, c in zip(hidden.split(HEAD_CHUNK, dim=1), chosen.split(HEAD_CHUNK, dim=1))]
        return torch.cat([p[0] for p in parts], dim=1), torch.cat([p[1] for p in parts], dim=1)

    return fn


def _head_chunk(head: torch.nn.Module, temperature: float, hidden: torch.Tensor, chosen: torch.Tensor):
    """One chunk's log-probs of the chosen tokens and (without a graph) the distribution's entropy."""
    scaled = head(hidden).float() / temperature  # position t scores token t + 1
    norm = torch.logsumexp(scaled, dim=-1)
    logp = scaled.gather(-1, chosen.unsqueeze(-1)).squeeze(-1) - norm
    with torch.no_grad():
        probs = (scaled - norm.unsqueeze(-1)).exp_()
        token_entropy = norm - (probs * scaled).sum(-1)
    return logp, token_entropy
