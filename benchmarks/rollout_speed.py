"""Rollout and trainer speed, side by side in one run (issue 31): tokens per second of the batch sampler at
several batch sizes, stepping the model and with the static decoder, against one sequence at a time (the sampler
before it), and of a PPO forward+backward in fp32 and under bf16 autocast (with the model's own RMSNorm and with the
trainer's fused one); and the gap between the sampler's log-probs and the trainer's recompute of them. A model of
SmolLM2-135M's config with fresh weights (speed does not depend on the weights), or `--model` an HF folder.
Prints one JSON line per measurement; `--out` keeps them all. `--profile` adds, per trainer row, the GPU kernels
that took most of one more (untimed) step, to say where the time goes (attention's kernel, the head, elementwise).

    python3 benchmarks/rollout_speed.py [--device cuda] [--batches 1,32,64,128] [--tokens 256] [--profile]
        [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from copy import deepcopy
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cuda_agent.rl.batcher import BatchSampler  # noqa: E402
from cuda_agent.rl.models import fuse_norms  # noqa: E402
from cuda_agent.rl.rollout import response_logprob_fn  # noqa: E402

SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
                    tie_word_embeddings=True)
PROMPT = 512  # tokens of each prompt
NEVER = {-5}  # a stop id no row samples: every row runs to its room


def model_of(args) -> torch.nn.Module:
    import transformers

    if args.model:
        return transformers.AutoModelForCausalLM.from_pretrained(args.model).to(args.device).eval()
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMOLLM2_135M)).to(args.device).eval()


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@torch.no_grad()
def one_at_a_time(model, prompt: list[int], tokens: int, device: str) -> float:
    """The sampler before the batcher: one sequence, the KV cache, a host sync per token. Tokens per second."""
    began = time.perf_counter()
    out = model(input_ids=torch.tensor([prompt], device=device), use_cache=True)
    for _ in range(tokens):
        logp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
        token = int(torch.multinomial(logp.exp().cpu(), 1))
        out = model(input_ids=torch.tensor([[token]], device=device), past_key_values=out.past_key_values,
                    use_cache=True)
    sync(device)
    return tokens / (time.perf_counter() - began)


def batched(model, prompts: list[list[int]], tokens: int, device: str, static: bool) -> tuple[float, list]:
    """Every prompt answered by the batcher at once, from threads as episodes call it (with `static`, decoded by
    the static decoder's CUDA graph). Tokens per second, and each row's (prompt, tokens, log-probs)."""
    sampler = BatchSampler(model, pad_id=0, gather_s=0.5,
                           weights=(lambda: dict(model.state_dict())) if static else None)
    sampler.expected = len(prompts)
    out = []
    threads = [threading.Thread(target=lambda p=p: out.append((p, *sampler(p, tokens, NEVER)))) for p in prompts]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sync(device)
    seconds = time.perf_counter() - began
    sampler.close()
    assert sampler.batches == 1, sampler.batches
    return sum(len(t) for _, t, _ in out) / seconds, out


@torch.no_grad()
def logprob_gap(model, rows: list, device: str, bf16: bool) -> dict:
    """The sampler's log-probs against the trainer's recompute of the same tokens (fp32, or under bf16 autocast)."""
    gaps = []
    for prompt, tokens, sampled in rows[:16]:
        ids = torch.tensor([prompt + tokens], device=device)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
            logp, _ = response_logprob_fn(len(prompt))(model, ids, torch.ones_like(ids))
        gaps.append((logp[0].float() - torch.tensor(sampled, device=device)).abs())
    gap = torch.cat(gaps)
    return {"rows": len(gaps), "tokens": gap.numel(), "max_abs": gap.max().item(), "mean_abs": gap.mean().item()}


def trainer_step(model, rows: int, length: int, device: str, bf16: bool, profile: bool = False) -> dict:
    """A PPO-style forward (log-probs of a response) and backward over `rows` x `length` tokens, prompts left-padded
    to one length as the trainer's batches are (row i has 16 i padding tokens): tokens per second, and with
    `profile` the kernels of one more step. (Under bf16 the trainer rolls each row's tokens to column 0 and runs
    without a mask: `models.last_hidden`; fp32 on CUDA keeps the mask.)"""
    ids = torch.randint(0, 49152, (rows, length), device=device)
    attention = torch.ones_like(ids)
    for row in range(rows):
        attention[row, :16 * row] = 0
    fn = response_logprob_fn(PROMPT)
    model.train()

    def step() -> None:
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
            logp, _ = fn(model, ids, attention)
        (-logp.mean()).backward()
        model.zero_grad(set_to_none=True)
        sync(device)

    step()  # a warm-up
    began = time.perf_counter()
    step()
    out = {"tokens_per_s": rows * (length - PROMPT) / (time.perf_counter() - began)}
    if profile:
        out["kernels"] = kernels_of(step)
    model.eval()
    return out


def kernels_of(step, top: int = 12) -> list[dict]:
    """The GPU kernels (on a machine without one, the ops) that took most of one `step`, by their own time: name,
    ms, share of the step's total."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA if torch.cuda.is_available() else ProfilerActivity.CPU]) as prof:
        step()
    own = [(e.key, getattr(e, "self_device_time_total", 0) or getattr(e, "self_cpu_time_total", 0))
           for e in prof.key_averages()]
    own = sorted(((k, t) for k, t in own if t > 0), key=lambda kt: -kt[1])
    total = sum(t for _, t in own) or 1
    return [{"kernel": k[:100], "ms": round(t / 1e3, 2), "share": round(t / total, 3)} for k, t in own[:top]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", type=Path)
    parser.add_argument("--batches", default="1,32,64,128")
    parser.add_argument("--tokens", type=int, default=256, help="tokens sampled per row")
    parser.add_argument("--train-rows", type=int, default=8)
    parser.add_argument("--train-length", type=int, default=5000)
    parser.add_argument("--profile", action="store_true", help="the trainer step's top GPU kernels")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    model = model_of(args)
    gen = torch.Generator().manual_seed(0)
    prompt = lambda: torch.randint(1, 49152, (PROMPT,), generator=gen).tolist()  # noqa: E731
    rows = []

    def report(**row):
        rows.append(row)
        print(json.dumps(row), flush=True)

    report(what="one sequence at a time (before)", batch=1, tokens_per_s=one_at_a_time(model, prompt(), args.tokens,
                                                                                          args.device))
    for static in (False, True):
        for size in [int(b) for b in args.batches.split(",")]:
            speed, sampled = batched(model, [prompt() for _ in range(size)], args.tokens, args.device, static)
            report(what=f"batch sampler, {'static decoder (CUDA graph)' if static else 'model steps'}", batch=size,
                   tokens_per_s=speed)
        for bf16 in (False, True):
            report(what=f"log-prob gap, sampler ({'static' if static else 'model steps'}) vs trainer "
                        f"{'bf16 autocast' if bf16 else 'fp32'}", **logprob_gap(model, sampled, args.device, bf16))
    fused = fuse_norms(deepcopy(model))  # the trainer's models (Actor, Critic) have the fused norms
    for name, bf16, trained in (("fp32", False, model), ("bf16 autocast, the model's own RMSNorm", True, model),
                                ("bf16 autocast, fused RMSNorm (the trainer's)", True, fused)):
        try:
            speed = trainer_step(trained, args.train_rows, args.train_length, args.device, bf16, args.profile)
        except torch.OutOfMemoryError as exc:
            trained.zero_grad(set_to_none=True)
            speed = {"error": str(exc).splitlines()[0]}
        report(what=f"trainer forward+backward, {name}", rows=args.train_rows, length=args.train_length, **speed)
    if args.out:
        args.out.write_text(json.dumps({"device": args.device, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
