"""The batch sampler on a tiny Llama initialised here: requests of different prompt lengths answered together
carry the log-probs that training recomputes for each alone, each row ends at its own stop or room, and episode
threads calling at once are served in shared batches."""

import threading

import pytest
import torch

from conftest import sampled_logprobs_are_the_trainer_s, static_decoder_follows_the_model
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
            sampled_logprobs_are_the_trainer_s(actor, prompt, tokens, logprobs, 0.8, atol=1e-4)
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
    static_decoder_follows_the_model(actor, "cpu", steps=10, atol=1e-5)


def test_the_static_decoder_attends_the_slots_in_use_in_buckets_and_still_follows_the_model(actor):
    """A step attends the cache's first slots in multiples of `bucket` (here SPLIT's 256): past one, the next; a
    prompt longer than a block of the block-major cache is laid in two."""
    from cuda_agent.rl.static_decode import SPLIT

    static_decoder_follows_the_model(actor, "cpu", steps=300, atol=1e-5, bucket=SPLIT)
    static_decoder_follows_the_model(actor, "cpu", steps=230, atol=1e-5, bucket=SPLIT, prompt=SPLIT + 44)


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
        sampled_logprobs_are_the_trainer_s(actor, prompt, tokens, logprobs, 0.8, atol=1e-4)
    finally:
        sampler.close()
    actor.model.config.rope_parameters = {"rope_type": "llama3", "rope_theta": 10000.0}
    assert "rope type 'llama3'" in static_decode.supports(actor.model)
    actor.model.config.model_type = "gpt2"
    assert "only llama" in static_decode.supports(actor.model)
