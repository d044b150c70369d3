"""Constrained replies: the model answers with one token per slot, each drawn from that slot's allowed tokens.

A reply such as `A3` (kernel A, launch option 3) is sampled token by token from the model's distribution
renormalised over the slot's options, and training computes the log-probs the same way, so PPO's ratios compare
like with like. The reply then closes with the chat template's end-of-turn token (mask 0, as in rl/tokens.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .models import positions
from .tokens import TokenTrajectory, TurnTokenizer


@dataclass
class Slot:
    name: str
    options: dict[str, str]  # the token's text -> what choosing it means (shown to the model)


class ChoiceReply:
    def __init__(self, turns: TurnTokenizer, slots: list[Slot], temperature: float = 1.0):
        self.turns, self.slots, self.temperature = turns, slots, temperature
        self.allowed: list[list[int]] = []
        for slot in slots:
            ids = []
            for text in slot.options:
                encoded = turns.tokenizer.encode(text, add_special_tokens=False)
                if len(encoded) != 1:
                    raise ValueError(f"option {text!r} of slot {slot.name!r} is not one token of this tokenizer")
                ids.append(encoded[0])
            if len(set(ids)) != len(ids):
                raise ValueError(f"slot {slot.name!r} has options that share a token")
            self.allowed.append(ids)

    def instructions(self) -> str:
        lines = [f"Answer with exactly {len(self.slots)} characters and nothing else:"]
        for i, slot in enumerate(self.slots, 1):
            lines.append(f"{i}. the {slot.name}:")
            lines += [f"   {text}: {meaning}" for text, meaning in slot.options.items()]
        return "\n".join(lines)

    def texts(self, choice: list[int]) -> list[str]:
        """Option texts of a choice given as option indices."""
        return [list(slot.options)[i] for slot, i in zip(self.slots, choice)]

    def _slot_logp(self, logits: torch.Tensor, slot: int) -> torch.Tensor:
        """[..., vocab] logits -> [..., options] log-probs renormalised over the slot's options."""
        allowed = torch.tensor(self.allowed[slot], device=logits.device)
        return torch.log_softmax(logits.float().index_select(-1, allowed) / self.temperature, dim=-1)

    @torch.no_grad()
    def sample(self, model: torch.nn.Module, prompt: list[int], batch: int,
               generator: torch.Generator | None = None) -> tuple[list[list[int]], torch.Tensor]:
        """`batch` replies: option indices [batch][slots] and their log-probs [batch, slots]."""
        device = next(model.parameters()).device
        ids = torch.tensor([prompt] * batch, device=device)
        choices = torch.zeros(batch, 0, dtype=torch.long)
        logps = []
        for slot in range(len(self.slots)):
            logp = self._slot_logp(model(input_ids=ids, logits_to_keep=1).logits[:, -1], slot).cpu()
            pick = torch.multinomial(logp.exp(), 1, generator=generator)
            logps.append(logp.gather(1, pick))
            choices = torch.cat([choices, pick], dim=1)
            token = torch.tensor(self.allowed[slot], device=device)[pick.to(device)]
            ids = torch.cat([ids, token], dim=1)
        return choices.tolist(), torch.cat(logps, dim=1)

    @torch.no_grad()
    def distribution(self, model: torch.nn.Module, prompt: list[int]) -> list[float]:
        """The first slot's option probabilities after the prompt."""
        device = next(model.parameters()).device
        logits = model(input_ids=torch.tensor([prompt], device=device), logits_to_keep=1).logits[0, -1]
        return self._slot_logp(logits, 0).exp().tolist()

    def trajectory(self, prompt: list[int], choice: list[int], logp: list[float]) -> TokenTrajectory:
        trajectory = TokenTrajectory(list(prompt), len(prompt))
        tokens = [self.allowed[slot][i] for slot, i in enumerate(choice)]
        self.turns.model_turn(trajectory, tokens, logp)
        return trajectory

    def logprob_fn(self, prompt_length: int):
        """Log-probs and entropies of the slot tokens of trajectories from `trajectory` (the end-of-turn token
        after them gets 0: it is not the model's)."""
        slots = len(self.slots)

        def fn(model, ids, attention):
            kept = ids.shape[1] - prompt_length + 1  # logits from the prompt's last position on (not the prompt's)
            logits = model(input_ids=ids, attention_mask=attention, position_ids=positions(attention),
                           logits_to_keep=kept, use_cache=False).logits
            logps, entropies = [], []
            for slot in range(slots):
                logp = self._slot_logp(logits[:, slot], slot)  # the logits that score the slot's token
                token = ids[:, prompt_length + slot]
                option = (token.unsqueeze(1) == torch.tensor(self.allowed[slot], device=ids.device)).float().argmax(1)
                logps.append(logp.gather(1, option.unsqueeze(1)))
                entropies.append(-(logp.exp() * logp).sum(1, keepdim=True))
            pad = torch.zeros(ids.shape[0], ids.shape[1] - prompt_length - slots, device=ids.device)
            return torch.cat(logps + [pad], dim=1), torch.cat(entropies + [pad], dim=1)

        return fn
