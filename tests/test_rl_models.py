"""Actor and critic on a tiny Llama initialised here: a PPO step moves probability toward the rewarded reply, the
critic's head survives a save and learns, left-padded rows are scored as sampled, a batch that all scored the same
leaves the actor alone. (Sampling and training agreeing on log-probs: test_rl_batcher.py.)"""

import pytest
import torch

from cuda_agent.rl.algorithm import policy_loss
from cuda_agent.rl.models import Actor, Critic

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    return tiny_llama


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


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    """A model with learned absolute positions: a shifted position changes every logit."""
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-gpt2")
    transformers.GPT2LMHeadModel(config).save_pretrained(path)
    return path


def test_a_left_padded_row_is_scored_as_it_was_sampled(tiny_gpt2):
    """Batches left-pad their prompts; the model must see each row's tokens at the positions it sampled them at."""
    from cuda_agent.rl.rollout import response_logprob_fn

    actor, critic = Actor.load(tiny_gpt2), Critic.load(tiny_gpt2)
    torch.nn.init.normal_(critic.head.weight)
    row = [5, 9, 11, 3, 8, 2]
    alone = torch.tensor([row])
    padded = torch.tensor([[0, 0, 0] + row])
    attention = torch.tensor([[0, 0, 0] + [1] * len(row)])
    with torch.no_grad():
        want = actor.logprobs(alone, torch.ones_like(alone))[0][0]
        got = actor.logprobs(padded, attention)[0][0, 3:]
        assert torch.allclose(got, want, atol=1e-5), (got, want)
        response = response_logprob_fn(3 + 3)(actor.model, padded, attention)[0][0]
        assert torch.allclose(response, want[2:], atol=1e-5)
        values = critic(padded, attention)[0, 3:]
        assert torch.allclose(values, critic(alone, torch.ones_like(alone))[0], atol=1e-5)


def _ppo_batch(prompts, replies, scores):
    """Episodes of one-turn replies as a trainer batch (log-probs recomputed by the trainer: zeros here)."""
    from cuda_agent.rl.trainer import Batch

    width = max(len(p) for p in prompts)
    rows = [[0] * (width - len(p)) + p + r for p, r in zip(prompts, replies)]
    attention = [[0] * (width - len(p)) + [1] * (len(p) + len(r)) for p, r in zip(prompts, replies)]
    n = len(replies[0])
    return Batch(torch.tensor(rows), torch.tensor(attention), width, torch.ones(len(rows), n),
                 torch.zeros(len(rows), n), torch.tensor(scores, dtype=torch.float))


def _trainer(tiny, **train):
    from cuda_agent.rl.config import TrainConfig
    from cuda_agent.rl.rollout import response_logprob_fn
    from cuda_agent.rl.trainer import PPOTrainer

    torch.manual_seed(0)
    actor, critic = Actor.load(tiny), Critic.load(tiny)
    return PPOTrainer(actor, critic, TrainConfig(gradient_checkpointing=False, **train), response_logprob_fn(3))


def test_a_batch_that_all_scored_the_same_trains_the_critic_only(tiny):
    """All -1 (a small model's usual batch): whitening would make unit-scale advantages out of the critic's ramp and
    push the actor by them. The actor is left as it was; the critic still learns the -1."""
    from cuda_agent.rl.config import PPOConfig

    batch = _ppo_batch([[5, 9, 11]] * 4, [[20, 21, 22, 23]] * 2 + [[30, 31, 32, 33]] * 2, [-1.0] * 4)
    trainer = _trainer(tiny)
    torch.nn.init.normal_(trainer.critic.head.weight)  # a critic that knows nothing, but not all zero
    actor_before = [p.detach().clone() for p in trainer.actor.parameters()]
    head_before = trainer.critic.head.weight.detach().clone()
    stats = trainer.update(batch)
    assert stats["actor_skipped_uniform_rewards"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(actor_before, trainer.actor.parameters()))
    assert not torch.equal(head_before, trainer.critic.head.weight)
    pushed = _trainer(tiny, ppo=PPOConfig(skip_uniform=False))
    torch.nn.init.normal_(pushed.critic.head.weight)
    assert pushed.update(batch)["actor_skipped_uniform_rewards"] == 0.0
    assert any(not torch.equal(a, b) for a, b in zip(actor_before, pushed.actor.parameters()))


def test_the_critic_learns_which_prompt_pays_within_a_few_updates(tiny):
    """Two prompts, one always +3, one always -1: the critic's values must come to tell them apart. With the
    paper's critic learning rate on the zero-initialised head as well (and a 0.2 value clip), it does not."""
    from cuda_agent.rl.config import PPOConfig

    batch = _ppo_batch([[5, 9, 11], [6, 10, 12]] * 2, [[20, 21, 22, 23]] * 4, [3.0, -1.0, 3.0, -1.0])

    def explained(trainer, updates=8):  # the last update's: how well the critic foresaw the batch after 7
        for _ in range(updates):
            stats = trainer.update(batch, train_actor=False)
        return stats["explained_variance"]

    # (a faster head than the default: this random 32-unit model's hidden states tell the prompts apart far less
    # than SmolLM2's, whose critic at the default 1e-4 foresaw 0.88 of this variance after 9 updates, 0.09 at 6e-6)
    assert explained(_trainer(tiny, value_head_lr=1e-2)) > 0.5
    assert explained(_trainer(tiny, value_head_lr=6e-6, ppo=PPOConfig(value_clip=0.2))) < 0.2


def test_the_entropy_statistic_is_the_same_in_chunks_without_a_graph(tiny, monkeypatch):
    from cuda_agent.rl import rollout

    monkeypatch.setattr(rollout, "HEAD_CHUNK", 2)
    actor = Actor.load(tiny)
    ids = torch.tensor([[5, 9, 11, 3, 8, 2, 7], [0, 0, 4, 6, 8, 1, 2]])
    attention = torch.tensor([[1] * 7, [0, 0, 1, 1, 1, 1, 1]])
    chunked = rollout.response_logprob_fn(3, temperature=0.7)(actor.model, ids, attention)
    whole = rollout.response_logprob_fn(3, temperature=0.7, entropy_grad=True)(actor.model, ids, attention)
    assert torch.allclose(chunked[0], whole[0], atol=1e-5) and torch.allclose(chunked[1], whole[1], atol=1e-5)
    assert chunked[0].requires_grad and not chunked[1].requires_grad and whole[1].requires_grad
    # the chunked head's gradient (recomputed in the backward pass) is the whole head's
    grads = []
    for whole_head in (False, True):
        actor.model.zero_grad()
        rollout.response_logprob_fn(3, temperature=0.7, entropy_grad=whole_head)(
            actor.model, ids, attention)[0].sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in actor.model.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-5)


def test_rows_rolled_to_run_without_a_mask_have_the_masked_models_hidden_states(tiny):
    """`last_hidden` runs rows whose tokens are one block with no mask (rolled to start at column 0: SDPA's fast
    kernel under bf16); a row with a hole in its mask keeps the mask. Either way the real tokens' states are the
    masked model's."""
    from cuda_agent.rl.models import last_hidden, positions

    decoder = Actor.load(tiny).model.get_decoder()
    masks = []

    def recorded(**kwargs):
        masks.append(kwargs.get("attention_mask"))
        return decoder(**kwargs)

    ids = torch.tensor([[5, 9, 11, 3, 8, 2, 7, 4], [0, 0, 4, 6, 8, 1, 2, 0], [0, 3, 4, 6, 8, 1, 0, 0]])
    for attention, unmasked in (
            (torch.tensor([[1] * 8, [0, 0, 1, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1, 0, 0]]), True),
            (torch.tensor([[1] * 8, [0, 0, 1, 1, 0, 1, 1, 0], [0, 1, 1, 1, 1, 1, 0, 0]]), False)):  # a hole
        masks.clear()
        got = last_hidden(recorded, ids, attention)
        assert (masks == [None]) == unmasked
        masked = decoder(input_ids=ids, attention_mask=attention, position_ids=positions(attention),
                         use_cache=False).last_hidden_state
        real = attention.bool()
        assert torch.allclose(got[real], masked[real], atol=1e-5), (got[real] - masked[real]).abs().max()


def test_fused_norms_match_the_model_s_own_under_autocast_and_change_nothing_without_it(tiny, tmp_path):
    """The trainer's RMSNorms run torch's `rms_norm` under autocast (one fused kernel on CUDA): the same numbers
    and gradients as the model's own norm there; without autocast (fp32, the sampler) bit for bit the model's own;
    the state dict, a deep copy and `save_pretrained` see a plain model."""
    from cuda_agent.rl.models import fuse_norms

    plain = transformers.AutoModelForCausalLM.from_pretrained(tiny)
    fused = Actor.load(tiny).model
    norms = [m for m in fused.modules() if type(m).__name__.endswith("RMSNorm")]
    assert len(norms) == 5 and all(type(m).__name__ == "FusedLlamaRMSNorm" for m in norms)
    assert fuse_norms(fused) is fused and type(norms[0]).__name__ == "FusedLlamaRMSNorm"  # twice: no second wrap
    torch.manual_seed(1)
    with torch.no_grad():  # norm weights that are not all ones, the same in both models
        for mine, theirs in zip(norms, [m for m in plain.modules() if type(m).__name__.endswith("RMSNorm")]):
            theirs.weight.copy_(mine.weight.copy_(torch.rand_like(mine.weight) + 0.5))
    ids = torch.tensor([[5, 9, 11, 3, 8, 2, 7, 4]])
    assert torch.equal(plain(input_ids=ids).logits, fused(input_ids=ids).logits)
    calls = []
    original = torch.nn.functional.rms_norm
    try:
        torch.nn.functional.rms_norm = lambda *a, **k: calls.append(1) or original(*a, **k)
        grads = []
        for model in (plain, fused):
            model.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(input_ids=ids).logits
            logits.float().logsumexp(-1).sum().backward()
            grads.append((logits.detach().float(), model.model.norm.weight.grad.clone()))
    finally:
        torch.nn.functional.rms_norm = original
    assert len(calls) == 5  # every norm of the fused model, none of the plain one's
    assert torch.allclose(grads[0][0], grads[1][0], atol=0.05), (grads[0][0] - grads[1][0]).abs().max()
    assert torch.allclose(grads[0][1], grads[1][1], rtol=0.05, atol=0.05)
    assert list(fused.state_dict()) == list(plain.state_dict())
    from copy import deepcopy
    assert type(deepcopy(fused).model.norm).__name__ == "FusedLlamaRMSNorm"
    fused.save_pretrained(tmp_path / "saved")
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    assert type(again.model.norm).__name__ == "LlamaRMSNorm"
    assert torch.equal(again(input_ids=ids).logits, plain(input_ids=ids).logits)
