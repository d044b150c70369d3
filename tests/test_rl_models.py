"""Actor and critic on a tiny Llama initialised here: sampling and training agree on log-probs, a PPO step moves
probability toward the rewarded reply, the critic's head survives a save."""

import pytest
import torch

from cuda_agent.rl.algorithm import policy_loss
from cuda_agent.rl.models import Actor, Critic

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-llama")
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return path


def test_sampled_log_probs_are_what_training_recomputes(tiny):
    actor = Actor.load(tiny)
    prompt = [5, 9, 11, 3]
    tokens, logprobs = actor.sample(prompt, 12, stop={7}, temperature=0.8, generator=torch.Generator().manual_seed(1))
    assert 1 <= len(tokens) <= 12 and (tokens[-1] == 7 or len(tokens) == 12)
    ids = torch.tensor([prompt + tokens])
    again, ent = actor.logprobs(ids, torch.ones_like(ids), temperature=0.8, with_entropy=True)
    assert torch.allclose(again[0, len(prompt) - 1:], torch.tensor(logprobs), atol=1e-4)
    assert ent.shape == again.shape and bool((ent > 0).all())


def test_a_ppo_step_moves_probability_to_the_rewarded_reply(tiny):
    actor = Actor.load(tiny)
    prompt, good, bad = [5, 9, 11], 20, 21
    ids = torch.tensor([prompt + [good], prompt + [bad]])
    mask = torch.tensor([[0, 0, 1], [0, 0, 1]], dtype=torch.float32)  # only the reply token is a step

    def probabilities():
        with torch.no_grad():
            return actor.logprobs(ids, torch.ones_like(ids))[0][:, -1].exp()

    before = probabilities()
    old = actor.logprobs(ids, torch.ones_like(ids))[0].detach()
    optimizer = torch.optim.Adam(actor.parameters(), lr=1e-2)
    for _ in range(3):
        logp, _ = actor.logprobs(ids, torch.ones_like(ids))
        loss, _ = policy_loss(logp, old, torch.tensor([[0, 0, 1.0], [0, 0, -1.0]]), mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = probabilities()
    assert after[0] > before[0] and after[1] < before[1], (before, after)


def test_the_critic_starts_at_zero_and_its_head_survives_a_save(tiny, tmp_path):
    critic = Critic.load(tiny)
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.equal(critic(ids, torch.ones_like(ids)), torch.zeros(1, 3))
    torch.nn.init.normal_(critic.head.weight)
    values = critic(ids, torch.ones_like(ids))
    critic.save(tmp_path / "critic")
    assert torch.allclose(Critic.load(tmp_path / "critic")(ids, torch.ones_like(ids)), values, atol=1e-6)
