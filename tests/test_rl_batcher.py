"""The batch sampler on a tiny Llama initialised here: requests of different prompt lengths answered together
carry the log-probs that training recomputes for each alone, each row ends at its own stop or room, and episode
threads calling at once are served in shared batches."""

import threading

import pytest
import torch

from cuda_agent.rl.batcher import BatchSampler
from cuda_agent.rl.models import Actor

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def actor(tiny_llama):
    return Actor.load(tiny_llama)


@pytest.mark.parametrize("static", [False, True], ids=["model-steps", "static-decoder"])
def test_rows_sampled_together_carry_the_log_probs_each_has_alone(actor, static):
    sampler = BatchSampler(actor.model, pad_id=0, temperature=0.8, seed=3,
                           weights=actor.decoding_weights if static else None)
    assert (sampler.weights is not None) == static
    try:
        prompts = [[5, 9, 11, 3], [7, 2], [4, 4, 8, 9, 10, 12, 13], [6]]
        rooms, stops = [20, 6, 20, 20], [{63}, {63}, {1, 2}, {63}]
        sampler.expected = len(prompts)
        replies = [None] * len(prompts)

        def play(i):
            replies[i] = sampler(prompts[i], rooms[i], stops[i])

        threads = [threading.Thread(target=play, args=(i,)) for i in range(len(prompts))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert sampler.batches == 1  # all four answered by one batch
        for prompt, room, stop, (tokens, logprobs) in zip(prompts, rooms, stops, replies):
            assert 1 <= len(tokens) == len(logprobs) <= room
            assert tokens[-1] in stop or len(tokens) == room, (tokens, stop, room)
            assert not set(tokens[:-1]) & stop  # nothing sampled after a stop
            ids = torch.tensor([prompt + tokens])
            with torch.no_grad():
                alone = actor.logprobs(ids, torch.ones_like(ids), temperature=0.8)[0][0, len(prompt) - 1:]
            assert torch.allclose(alone, torch.tensor(logprobs), atol=1e-4), (alone, logprobs)
    finally:
        sampler.close()


def test_many_episode_threads_share_batches_and_a_failure_reaches_every_caller(actor):
    sampler = BatchSampler(actor.model, pad_id=0, seed=1, gather_s=0.2)
    try:
        sampler.expected = 16
        results = []
        threads = [threading.Thread(target=lambda: results.append(sampler([5, 6, 7], 4, {63}))) for _ in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(results) == 16 and sampler.batches < 16
        with pytest.raises(RuntimeError, match="the batch sampler failed"):
            sampler([5, 6, 1000], 4, {63})  # an id outside the vocabulary
        assert sampler([5, 6], 2, {63})[0]  # and it serves on
    finally:
        sampler.close()


def test_a_reply_asked_for_after_the_time_limit_raises_timeout_and_the_sampler_serves_on(actor):
    late = [True]
    sampler = BatchSampler(actor.model, pad_id=0, seed=1, out_of_time=lambda: late[0])
    try:
        with pytest.raises(TimeoutError, match="time limit"):
            sampler([5, 6, 7], 4, {63})
        late[0] = False
        assert sampler([5, 6], 2, {63})[0]
    finally:
        sampler.close()


def test_the_static_decoder_computes_the_model_s_next_token_logits_step_by_step(actor):
    """Left-padded rows prefilled by the model, then ten tokens fed through the static decoder and through the
    model's own cache: the same logits at every step."""
    from cuda_agent.rl import static_decode
    from cuda_agent.rl.models import positions

    assert static_decode.supports(actor.model) is None
    ids = torch.tensor([[0, 0, 5, 9, 11], [7, 2, 3, 4, 8]])
    attention = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    position = positions(attention)
    with torch.no_grad():
        out = actor.model(input_ids=ids, attention_mask=attention, position_ids=position, use_cache=True)
        decoder = static_decode.StaticDecoder(actor.model, actor.decoding_weights(), 2, 5 + 10)
        decoder.load_prefill(out.past_key_values, attention, position)
        past, position = out.past_key_values, position[:, -1:]
        for step in range(10):
            token = torch.tensor([[step + 1], [60 - step]])
            attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)
            position = position + 1
            out = actor.model(input_ids=token, attention_mask=attention, position_ids=position, past_key_values=past,
                              use_cache=True)
            past = out.past_key_values
            assert torch.allclose(decoder.step(token), out.logits[:, -1].float(), atol=1e-5), step


def test_the_static_decoder_reads_a_lora_actor_s_merged_weights_and_refuses_what_it_does_not_know(tiny_llama):
    from cuda_agent.rl import static_decode

    actor = Actor.load(tiny_llama)
    actor.add_lora(rank=2, alpha=4)
    for b in actor.lora.B.values():
        torch.nn.init.normal_(b)  # updates that change the outputs
    sampler = BatchSampler(actor.model, pad_id=0, temperature=0.8, seed=5, weights=actor.decoding_weights)
    try:
        prompt = [5, 9, 11, 3]
        tokens, logprobs = sampler(prompt, 8, {63})
        ids = torch.tensor([prompt + tokens])
        with torch.no_grad():
            alone = actor.logprobs(ids, torch.ones_like(ids), temperature=0.8)[0][0, len(prompt) - 1:]
        assert torch.allclose(alone, torch.tensor(logprobs), atol=1e-4), (alone, logprobs)
    finally:
        sampler.close()
    actor.model.config.rope_parameters = {"rope_type": "llama3", "rope_theta": 10000.0}
    assert "rope type 'llama3'" in static_decode.supports(actor.model)
    actor.model.config.model_type = "gpt2"
    assert "only llama" in static_decode.supports(actor.model)
