"""The imitation probe: how closely a policy would write the expert's first reply on tasks it never trained on,
measured teacher-forced (no sampling, no judge), so a supervised stage can say whether it learns the expert's craft
or its training conversations.

A held-out evaluation samples whole episodes and asks the judge; with a small model it reads 0% pass for every
checkpoint until the model is good, and says nothing about why. The probe reads the expert's first reply on each
validation task (the task's opening messages, then the expert's `direct` reply: every file written, about 1,700
SmolLM2 tokens on a pointwise task, 3,500 on a rows task) and reports, over the reply's tokens: the mean negative
log-likelihood, the share the policy's greedy choice gets wrong, and the share of replies it gets wholly right.
Greedy-exact is what a policy must do to write the expert's kernel at a low temperature; at temperature 1 every
token's tail is sampled too (docs/training.md, sixth attempt: a 0.01-nat-a-token imitator drifts within a reply).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..agent.environment import opening_messages
from .expert.episodes import script
from .expert.formulas import Unsupported
from .expert.trace import trace
from .tokens import TokenTrajectory, TurnTokenizer, conversation_ids


def expert_conversations(tasks: list[Path], backend: str, compact: bool) -> list[list[dict]]:
    """Each task's opening messages and the expert's first reply (tasks the expert cannot fuse are left out)."""
    out = []
    for task in tasks:
        source = Path(task).read_text()
        try:
            first = script(trace(source), backend, "direct")[0]
        except Unsupported:
            continue
        out.append([*opening_messages(source, backend, compact), first])
    return out


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
