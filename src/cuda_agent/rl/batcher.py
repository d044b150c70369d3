"""One model serving many episodes at once: the `Sampler` of every episode thread, answered in batches.

Each episode plays in a thread of its own and calls the batcher as its sampler (prompt ids, room, stop ids). A
single serving thread takes every request waiting (after `gather_s`, or as soon as `expected` are waiting), and
runs them as one batch: the prompts left-padded with position ids from the attention mask (so each row is scored at
the positions it would have alone), one prefill, then KV-cache decode steps (for a Llama-architecture model given its
`weights`, over static buffers replayed as one CUDA graph per step: static_decode.py) with sampling and log-probs on
the device, each row ending at its own stop token or room; the host looks at the tokens every `SYNC_EVERY` steps only.
The log-probs are those of the sampled tokens at the batch's temperature, as `response_logprob_fn` recomputes
them. Which requests share a batch depends on timing, so sampling is reproducible from the seed only with one
episode at a time. With `out_of_time`, a batch that is still decoding when it says so is dropped and each of its
episodes hears `TimeoutError` (its caller plays that episode again later), so a time limit holds inside a step.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..agent.loop import ReplyCut
from . import static_decode
from .models import positions

SYNC_EVERY = 8  # decode steps between looks at whether every row has ended


@dataclass
class _Request:
    ids: list[int]
    room: int
    stop: set[int]
    done: threading.Event = field(default_factory=threading.Event)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    error: BaseException | None = None


class BatchSampler:
    def __init__(self, model: torch.nn.Module, pad_id: int | None, temperature: float = 1.0, max_batch: int = 128,
                 gather_s: float = 0.02, seed: int = 0, out_of_time: Callable[[], bool] = lambda: False,
                 weights: Callable[[], dict[str, torch.Tensor]] | None = None):
        """`weights`: the policy's weights as the model computes with them (its state dict, or a LoRA actor's merged
        one: `Actor.decoding_weights`); given, a model `static_decode` supports decodes there (one CUDA graph per
        batch on the GPU), else every step goes through the model."""
        self.model, self.pad_id, self.temperature = model, pad_id or 0, temperature
        self.out_of_time = out_of_time
        self.weights = weights if weights is not None and static_decode.supports(model) is None else None
        self.max_batch, self.gather_s = max_batch, gather_s
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.expected = 1  # episodes playing now: a batch starts at once when this many are waiting
        self.batches = 0
        self._requests: queue.Queue[_Request | None] = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name="batch-sampler", daemon=True)
        self._thread.start()

    def __call__(self, ids: list[int], room: int, stop: set[int]) -> tuple[list[int], list[float]]:
        """The `Sampler` interface: one reply to `ids`, sampled until a stop id (included) or `room` tokens."""
        request = _Request(list(ids), room, set(stop))
        self._requests.put(request)
        request.done.wait()
        if isinstance(request.error, TimeoutError):
            raise ReplyCut(str(request.error))
        if request.error is not None:
            raise RuntimeError(f"the batch sampler failed: {request.error}") from request.error
        return request.tokens, request.logprobs

    def close(self) -> None:
        self._requests.put(None)
        self._thread.join()

    def _serve(self) -> None:
        while True:
            first = self._requests.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < min(self.max_batch, max(1, self.expected)):
                try:
                    item = self._requests.get(timeout=self.gather_s)
                except queue.Empty:
                    break
                if item is None:
                    self._requests.put(None)  # (served after this batch)
                    break
                batch.append(item)
            try:
                self.generate(batch)
            except BaseException as exc:  # every waiting episode hears of it
                for request in batch:
                    request.error = exc
            if self.device.type == "cuda":  # the batch's cache back to the GPU: the judge's workers share it
                torch.cuda.empty_cache()
            for request in batch:
                request.done.set()

    @torch.no_grad()
    def generate(self, batch: list[_Request]) -> None:
        """Sample every request of `batch` together (their tokens and log-probs filled in)."""
        self.batches += 1
        if self.out_of_time():
            raise TimeoutError("time limit reached before this reply")
        width = max(len(r.ids) for r in batch)
        ids = torch.tensor([[self.pad_id] * (width - len(r.ids)) + r.ids for r in batch], device=self.device)
        attention = torch.tensor([[0] * (width - len(r.ids)) + [1] * len(r.ids) for r in batch], device=self.device)
        stops = [sorted(r.stop) or [-1] for r in batch]
        stop = torch.tensor([s + [s[0]] * (max(map(len, stops)) - len(s)) for s in stops], device=self.device)
        room = torch.tensor([r.room for r in batch], device=self.device)
        position = positions(attention)
        out = self.model(input_ids=ids, attention_mask=attention, position_ids=position, use_cache=True,
                         logits_to_keep=1)
        logits = out.logits[:, -1].float()
        decoder = None
        if self.weights is not None:
            decoder = static_decode.StaticDecoder(self.model, self.weights(), len(batch),
                                                  width + max(r.room for r in batch))
            decoder.load_prefill(out.past_key_values, attention, position)
            out = None  # the model's own cache is not needed any more
        position = position[:, -1:]
        ended = torch.zeros(len(batch), dtype=torch.bool, device=self.device)
        tokens, logps, alive = [], [], []
        for step in range(max(r.room for r in batch)):
            logp = torch.log_softmax(logits / self.temperature, dim=-1)
            token = torch.multinomial(logp.exp(), 1, generator=self.generator)
            tokens.append(token[:, 0])
            logps.append(logp.gather(1, token)[:, 0])
            alive.append(~ended)
            ended = ended | (token == stop).any(1) | (step + 1 >= room)
            if (step + 1) % SYNC_EVERY == 0 and bool(ended.all()):
                break
            if (step + 1) % (SYNC_EVERY * 16) == 0 and self.out_of_time():
                raise TimeoutError(f"time limit reached after {step + 1} tokens of this reply")
            if decoder is not None:
                logits = decoder.step(token)
                continue
            attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)
            position = position + 1
            out = self.model(input_ids=token, attention_mask=attention, position_ids=position,
                             past_key_values=out.past_key_values, use_cache=True)
            logits = out.logits[:, -1].float()
        tokens_t, logps_t, alive_t = (torch.stack(x, 1).cpu() for x in (tokens, logps, alive))
        for i, request in enumerate(batch):
            kept = alive_t[i]
            request.tokens = tokens_t[i][kept].tolist()
            request.logprobs = logps_t[i][kept].tolist()
