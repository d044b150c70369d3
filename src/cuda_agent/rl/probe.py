"""The imitation probe: how closely a policy would write the expert's first reply on tasks it never trained on,
measured teacher-forced (no sampling, no judge), so a supervised stage can say whether it learns the expert's craft
or its training conversations.

A held-out evaluation samples whole episodes and asks the judge; with a small model it reads 0% pass for every
checkpoint until the model is good, and says nothing about why. The probe reads the expert's first reply on each
validation task (the task's opening messages, then the expert's `direct` reply: every file written, about 1,700
SmolLM2 tokens on a pointwise task, 3,500 on a rows task) and reports, over the reply's tokens: the mean negative
log-likelihood, the share the policy's greedy choice gets wrong, and the share of replies it gets wholly right.
Greedy-exact is what a policy must do to write the expert's kernel at a low temperature; at temperature 1 every
token's tail is sampled too (docs/training.md, sixth attempt: a 0.01-nat-a-token imitator drifts within a reply),
which `sampled` measures: a reply sampled to each task's opening, compared with the expert's first replies.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..agent.environment import opening_messages
from ..llm import assistant_text
from .batcher import BatchSampler
from .expert.episodes import SHAPES, script
from .expert.formulas import Unsupported
from .expert.trace import trace
from .tokens import TokenTrajectory, TurnTokenizer, conversation_ids


@dataclass
class ProbeTask:
    """A task's opening messages and each of the expert's shapes' first reply to them."""
    opening: list[dict]
    replies: dict[str, dict]

    @property
    def conversation(self) -> list[dict]:
        """The opening and the `direct` reply: what `imitation` scores."""
        return [*self.opening, self.replies["direct"]]


def probe_tasks(tasks: list[Path], backend: str, compact: bool) -> list[ProbeTask]:
    """The probe's tasks (those the expert cannot fuse are left out)."""
    out = []
    for task in tasks:
        source = Path(task).read_text()
        try:
            program = trace(source)
        except Unsupported:
            continue
        replies = {shape: script(program, backend, shape)[0] for shape in SHAPES}
        out.append(ProbeTask(opening_messages(source, backend, compact), replies))
    return out


def expert_conversations(tasks: list[Path], backend: str, compact: bool) -> list[list[dict]]:
    """Each task's opening messages and the expert's first (`direct`) reply."""
    return [t.conversation for t in probe_tasks(tasks, backend, compact)]


@torch.no_grad()
def imitation(model: torch.nn.Module, turns: TurnTokenizer, conversations: list[list[dict]]) -> dict[str, float]:
    """The probe's numbers for `model` on `conversations` (one at a time: a 3,500-token reply's fp32 logits over a
    49k vocabulary are 0.7 GB)."""
    nll = wrong = tokens = exact = 0.0
    training = model.training
    model.eval()
    for messages in conversations:
        trajectory: TokenTrajectory = conversation_ids(turns, messages)
        device = next(model.parameters()).device
        ids = torch.tensor([trajectory.ids], device=device)
        with torch.autocast(device.type, enabled=False):
            logits = model(input_ids=ids).logits[0, trajectory.prompt_length - 1:-1].float()
        target = ids[0, trajectory.prompt_length:]
        mask = torch.tensor(trajectory.mask, device=device, dtype=torch.bool)  # the reply's own tokens
        logp = torch.log_softmax(logits, -1).gather(-1, target[:, None])[:, 0]
        misses = int(((logits.argmax(-1) != target) & mask).sum())
        nll += float(-(logp * mask).sum())
        wrong += misses
        tokens += int(mask.sum())
        exact += misses == 0
    model.train(training)
    n = max(len(conversations), 1)
    return {"probe_nll": nll / max(tokens, 1), "probe_greedy_wrong": wrong / max(tokens, 1),
            "probe_greedy_exact": exact / n, "probe_replies": float(len(conversations))}


def closeness(text: str, replies: list[str]) -> float:
    """1.0 when `text` is one of `replies`, else the longest share of one of them that it starts with (< 1)."""
    if text in replies:
        return 1.0
    return max(min(len(os.path.commonprefix([text, r])) / max(len(r), 1), 0.999) for r in replies)


def plan_lines(reply: str) -> list[str]:
    """The expert's plan in a reply (expert/episodes.py's `_plan`): a line per op with the values it makes, then the
    output's and the parameters' line; the task's semantics, apart from the code that repeats them."""
    return [line for line in reply.splitlines() if line.startswith(("- ", "The output: "))]


def plan_score(text: str, reply: str) -> float:
    """The share of `reply`'s plan lines that `text` holds, word for word (1.0 where it has none)."""
    expected = plan_lines(reply)
    held = set(text.splitlines())
    return sum(line in held for line in expected) / len(expected) if expected else 1.0


def sampled(model: torch.nn.Module, turns: TurnTokenizer, tasks: list[ProbeTask], temperature: float, room: int,
            weights: Callable[[], dict[str, torch.Tensor]] | None = None, seed: int = 0) -> dict[str, float]:
    """One reply sampled to each task's opening at `temperature` (all at once, through the batch sampler;
    `weights`: the model's as it computes with them, for the static decoder) and compared with the expert's first
    replies of every shape: the share that is one of them (the kernel, its binding and model_new.py exactly as the
    expert writes them), the mean `closeness`, and how much of the expert's plan each holds (`plan_score`: the mean,
    and the share with the whole plan: the op -> formula mapping, the part a small imitator gets wrong)."""
    sampler = BatchSampler(model, turns.tokenizer.pad_token_id, temperature, seed=seed, weights=weights)
    sampler.expected = len(tasks)

    def reply(task: ProbeTask) -> str:
        ids, _ = sampler(turns.start(task.opening).ids, room, {turns.end_of_turn})
        return turns.tokenizer.decode(ids[:-1] if ids and ids[-1] == turns.end_of_turn else ids)
    try:
        with ThreadPoolExecutor(max(len(tasks), 1)) as threads:
            texts = list(threads.map(reply, tasks))
    finally:
        sampler.close()
    scores = [closeness(text, [assistant_text(r) for r in task.replies.values()]) for text, task in zip(texts, tasks)]
    plans = [plan_score(text, task.replies["direct"]["content"]) for text, task in zip(texts, tasks)]
    n = max(len(scores), 1)
    return {"sampled_expert": sum(s == 1.0 for s in scores) / n, "sampled_closeness": sum(scores) / n,
            "sampled_plan": sum(plans) / n, "sampled_plan_whole": sum(p == 1.0 for p in plans) / n,
            "sampled_temperature": temperature, "sampled_replies": float(len(scores))}
