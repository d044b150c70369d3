"""The training stages on the cpu backend with a tiny model (SmolLM2's tokenizer, random weights): episodes played
by the model through the agent loop become token batches whose log-probs the trainer recomputes exactly; warm-up,
agentic PPO, value pretraining and RFT each run, checkpoint, and hand their checkpoint to the next; a run folder keeps
its newest checkpoints, optimizer state only when asked."""

import json
import math
import re
import shutil

import pytest
import torch
from typer.testing import CliRunner

from cuda_agent.agent.environment import Environment
from cuda_agent.agent.loop import LoopConfig
from cuda_agent.agent.tools import SCHEMAS, schemas
from cuda_agent.cli import app
from cuda_agent.llm import assistant_text, with_text_tools
from cuda_agent.rl.batcher import BatchSampler
from cuda_agent.rl.config import StageConfig, TrainConfig
from cuda_agent.rl.probe import closeness, expert_conversations, plan_lines, plan_score, probe_tasks, sampled
from cuda_agent.rl.rollout import batch_of, play, response_logprob_fn
from cuda_agent.rl.stages import run_stage
from cuda_agent.rl.tokens import TurnTokenizer, conversation_ids

from conftest import TASKS

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_model(tiny_smollm2, tmp_path_factory):
    """The tiny config with saved random weights (the stages load a model folder)."""
    folder = tmp_path_factory.mktemp("tiny-weights")
    torch.manual_seed(0)
    config = transformers.AutoConfig.from_pretrained(tiny_smollm2)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    transformers.AutoTokenizer.from_pretrained(tiny_smollm2).save_pretrained(folder)
    return folder


class ScriptedActor:
    """Replays fixed replies as if sampled (log-prob -1 each): the agent loop's tool calls, deterministically."""

    def __init__(self, turns, texts):
        self.turns, self.replies = turns, [turns.tokenizer.encode(t, add_special_tokens=False) for t in texts]

    def __call__(self, prompt, max_new_tokens, stop):
        tokens = self.replies.pop(0)[:max_new_tokens - 1] + [self.turns.end_of_turn]
        return tokens, [-1.0] * len(tokens)


def test_a_played_episode_is_the_conversation_the_template_renders(tiny_model, cpu_judge, tmp_path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model)
    turns = TurnTokenizer(tokenizer, SCHEMAS, tool_format="text")
    replies = ['Look first.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "model.py"}}\n</tool_call>',
               "I am not sure.",
               '<tool_call>\n{"name": "finish", "arguments": {}}\n</tool_call>']
    env = Environment(cpu_judge, tmp_path / "run", use_sandbox=False)
    episode = play(env, ScriptedActor(turns, replies), turns, TASKS / "affine_relu.py", tmp_path / "run",
                   LoopConfig(max_turns=5), max_new_tokens=64)
    assert episode.score == -1 and episode.summary.stop == "finish" and episode.summary.turns == 3
    records = [json.loads(line) for line in (tmp_path / "run" / "trajectory.jsonl").read_text().splitlines()]
    messages = [r["message"] for r in records if r["type"] in ("system", "user", "assistant", "tool")]
    assert [m["role"] for m in messages][2:] == ["assistant", "tool", "assistant", "user", "assistant", "tool"]
    assert "class Model" in messages[3]["content"]  # read_file really ran
    # the ids end with the model's last turn (the reward sits there; the last tool result is never input)
    rendered = tokenizer.apply_chat_template(with_text_tools(messages[:-1], SCHEMAS), tokenize=False)
    t = episode.trajectory
    assert tokenizer.decode(t.ids) == rendered.rstrip("\n")
    sampled = [i for i, m in zip(t.response, t.mask) if m]
    assert tokenizer.decode(sampled) == "".join(r + "<|im_end|>" for r in replies)
    assert sum(t.mask) == len(sampled) and all(lp == -1.0 for lp, m in zip(t.logprobs, t.mask) if m)


def test_a_tool_result_that_fills_the_context_ends_the_episode_at_its_context_limit(tiny_model, cpu_judge,
                                                                                     tmp_path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model)
    turns = TurnTokenizer(tokenizer, SCHEMAS, tool_format="text")
    look = '<tool_call>\n{"name": "read_file", "arguments": {"path": "model.py"}}\n</tool_call>'

    def episode(name, loop):
        env = Environment(cpu_judge, tmp_path / name, use_sandbox=False)
        return play(env, ScriptedActor(turns, [look, "more"]), turns, TASKS / "affine_relu.py", tmp_path / name,
                    loop, max_new_tokens=64)

    first = len(episode("one", LoopConfig(max_turns=1)).trajectory.ids)  # the prompt and the first reply
    cut = episode("full", LoopConfig(max_turns=5, max_context=first + 4))  # model.py's text is longer than 4
    assert cut.summary.stop == "context limit", (cut.summary.stop, cut.summary.stop_detail)
    assert f"no room for a reply in {first + 4}" in cut.summary.stop_detail and cut.replies == 1


def test_sampled_episodes_batch_up_and_the_trainer_recomputes_their_log_probs(tiny_model, cpu_judge, tmp_path):
    from cuda_agent.rl.models import Actor

    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model)
    actor = Actor.load(tiny_model)
    episodes = []
    for i, (tools, single) in enumerate([(SCHEMAS, False), (None, True)]):  # two prompt lengths
        turns = TurnTokenizer(tokenizer, tools, tool_format="text")
        env = Environment(cpu_judge, tmp_path / f"run{i}", use_sandbox=False)
        sample = BatchSampler(actor.model, tokenizer.pad_token_id, seed=i)
        try:
            episodes.append(play(env, sample, turns, TASKS / "affine_relu.py", tmp_path / f"run{i}",
                                 LoopConfig(max_turns=2, single_turn=single), max_new_tokens=12))
        finally:
            sample.close()
    lengths = [e.trajectory.prompt_length for e in episodes]
    assert lengths[0] != lengths[1]
    batch = batch_of(episodes, tokenizer.pad_token_id)
    assert batch.response_start == max(lengths) and batch.ids.shape[0] == 2
    short = lengths.index(min(lengths))
    assert int(batch.attention[short, :max(lengths) - min(lengths)].sum()) == 0  # left padding
    logp, _ = response_logprob_fn(batch.response_start)(actor.model, batch.ids, batch.attention)
    mask = batch.mask.bool()
    assert torch.allclose(logp[mask], batch.old_logp[mask], atol=2e-4)


def test_the_four_stages_run_and_hand_over_their_checkpoints(tiny_model, cache_dir, tmp_path):
    common = ["--backend", "cpu", "--data", str(TASKS / "affine_relu.py"), "--steps", "1", "--batch", "2",
              "--max-turns", "2", "--max-new-tokens", "8", "--cache-dir", str(cache_dir)]
    warm = tmp_path / "warmup"
    result = CliRunner().invoke(app, ["train", "--stage", "warmup", "--model", str(tiny_model), "--out", str(warm),
                                      *common])
    assert result.exit_code == 0, result.output
    row = json.loads((warm / "metrics.jsonl").read_text())
    assert row["step"] == 1 and row["reward_mean"] == -1 and math.isfinite(row["value_loss"])
    assert row["rollout_logp_gap"] < 1e-3
    episodes = [json.loads(line) for line in (warm / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 2 and all(e["stop"] in ("single turn", "no files") for e in episodes)

    agentic = tmp_path / "agentic"
    result = CliRunner().invoke(app, ["train", "--stage", "agentic", "--model", str(warm / "checkpoint" / "actor"),
                                      "--out", str(agentic), *common])
    assert result.exit_code == 0, result.output
    row = json.loads((agentic / "metrics.jsonl").read_text())
    assert row["tokens"] > 0 and math.isfinite(row["policy_loss"]) and row["rollout_logp_gap"] < 1e-3
    assert (agentic / "episodes" / "step_0001" / "00" / "trajectory.jsonl").is_file()

    _value_pretraining_with_lora_goes_on_from_what_travels(agentic, tmp_path / "value", common)


def _value_pretraining_with_lora_goes_on_from_what_travels(agentic, value, common):
    """Value pretraining with LoRA (`--lora-rank 2`) trains the critic's updates and head, never the actor; its
    checkpoint stripped to what travels from the device machine (scripts/recipe_h200.sh: adapters, the value head,
    trainer.pt) is enough to go on with the stage from the critic it started from."""
    from safetensors.torch import load_file

    args = ["train", "--stage", "value", "--model", str(agentic / "checkpoint" / "actor"), "--out", str(value),
            *common, "--lora-rank", "2", "--critic-lr", "1e-2"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    actor_before = transformers.AutoModelForCausalLM.from_pretrained(agentic / "checkpoint" / "actor")
    actor_after = transformers.AutoModelForCausalLM.from_pretrained(value / "checkpoint" / "actor")
    for (name, a), (_, b) in zip(actor_before.named_parameters(), actor_after.named_parameters()):
        assert torch.equal(a, b), f"value pretraining changed the actor's {name}"
    critic = value / "checkpoint" / "critic"
    head_before = torch.load(agentic / "checkpoint" / "critic" / "value_head.pt")
    assert not torch.equal(head_before["bias"], torch.load(critic / "value_head.pt")["bias"])  # the head learned
    before, after = (load_file(folder / "model.safetensors") for folder in (agentic / "checkpoint" / "critic", critic))
    assert any(not torch.equal(before[k], after[k]) for k in before)  # and the backbone's updates
    assert json.loads((critic / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"] == str(
        (agentic / "checkpoint" / "critic").resolve())
    step = (value / "checkpoint").resolve()
    (value / "checkpoint").unlink()
    travels = {"trainer.pt", "value_head.pt", "adapter_config.json", "adapter_model.safetensors"}
    for path in step.rglob("*"):
        if path.is_file() and path.name not in travels:
            path.unlink()
    at = args.index("--steps") + 1
    again = CliRunner().invoke(app, [*args[:at], "2", *args[at + 1:-1], "0"])  # (critic lr 0: its updates kept)
    assert again.exit_code == 0, again.output
    assert "afresh" in again.output  # (no optimizer state travels)
    rows = [json.loads(line) for line in (value / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    resumed = load_file(value / "checkpoint" / "critic" / "model.safetensors")
    assert all(torch.allclose(after[k], resumed[k], atol=1e-6) for k in after)  # the adapter went on, not afresh


def write_run(folder, reward):
    """An episode's run folder with one model turn (a finish call) and its final reward."""
    folder.mkdir(parents=True)
    call = {"id": "c", "type": "function", "function": {"name": "finish", "arguments": "{}"}}
    records = [{"type": "system", "message": {"role": "system", "content": "S"}},
               {"type": "user", "message": {"role": "user", "content": "Optimise it."}},
               {"type": "assistant", "turn": 1, "message": {"role": "assistant", "content": "Done already.",
                                                             "tool_calls": [call]}},
               {"type": "tool", "turn": 1, "message": {"role": "tool", "tool_call_id": "c", "content": "ok"}},
               {"type": "result", "summary": {"reference": "t.py", "final_verdict": {
                   "reward": reward, "policy_violations": [], "speedup_vs_compile": 1.1}}}]
    (folder / "trajectory.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_rft_fine_tunes_on_the_kept_trajectories_only(tiny_model, tmp_path):
    write_run(tmp_path / "runs" / "good", 3)
    write_run(tmp_path / "runs" / "failed", -1)
    out = tmp_path / "rft"
    result = CliRunner().invoke(app, ["train", "--stage", "rft", "--model", str(tiny_model), "--runs",
                                      str(tmp_path / "runs"), "--out", str(out), "--steps", "4", "--batch", "1",
                                      "--actor-lr", "1e-3", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "1 of 2 trajectories kept" in result.output
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all(r["reward_mean"] == 3 for r in rows)
    assert rows[-1]["sft_loss"] < rows[0]["sft_loss"] and rows[0]["tokens"] > 5
    kept = [json.loads(line) for line in (out / "rft" / "rft.jsonl").read_text().splitlines()]
    assert len(kept) == 1 and kept[0]["reward"] == 3


def test_a_stage_keeps_its_newest_checkpoints_and_resumes_with_or_without_optimizer_state(tiny_model, tmp_path):
    write_run(tmp_path / "runs" / "good", 3)
    out = tmp_path / "rft"

    def train(steps, *options):
        result = CliRunner().invoke(app, ["train", "--stage", "rft", "--model", str(tiny_model), "--runs",
                                          str(tmp_path / "runs"), "--out", str(out), "--steps", str(steps), "--batch",
                                          "1", "--device", "cpu", "--save-every", "1", *options])
        assert result.exit_code == 0, result.output
        return result.output.replace("\n", "")

    output = train(3, "--keep-checkpoints", "2")
    assert sorted(p.name for p in out.glob("checkpoint*")) == ["checkpoint", "checkpoint-000002", "checkpoint-000003"]
    assert (out / "checkpoint").resolve() == (out / "checkpoint-000003").resolve()
    assert re.search(r"checkpoint step 3: \d+\.\d MB in \S+checkpoint-000003 \(optimizer state not kept\)", output)
    assert "actor_optim" not in torch.load(out / "checkpoint" / "trainer.pt", weights_only=False)  # the default

    output = train(4, "--save-optimizer")  # no optimizer state to resume: fresh optimizers, said so
    assert "no optimizer state" in output and "afresh" in output
    assert sorted(p.name for p in out.glob("checkpoint*")) == ["checkpoint", "checkpoint-000004"]  # default: 1 kept
    assert "checkpoint step 4:" in output and "(optimizer state kept)" in output
    assert "actor_optim" in torch.load(out / "checkpoint" / "trainer.pt", weights_only=False)

    output = train(5)  # resumes with the optimizer state it has
    assert "no optimizer state" not in output and "checkpoint step 5:" in output
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]


def test_stage_options_are_checked(tiny_model, tmp_path):
    result = CliRunner().invoke(app, ["train", "--stage", "sft", "--model", str(tiny_model), "--out", str(tmp_path)])
    assert result.exit_code == 2 and "Invalid value for '--stage'" in result.output
    result = CliRunner().invoke(app, ["train", "--stage", "agentic", "--model", str(tiny_model), "--out",
                                      str(tmp_path)])
    assert result.exit_code == 2 and "needs --data" in result.output
    result = CliRunner().invoke(app, ["train", "--stage", "rft", "--model", str(tiny_model), "--out", str(tmp_path)])
    assert result.exit_code == 2 and "needs --runs" in result.output
    result = CliRunner().invoke(app, ["train", "--stage", "agentic", "--model", str(tiny_model), "--data",
                                      str(tmp_path / "none.py"), "--out", str(tmp_path / "o"), "--backend", "cpu"])
    assert result.exit_code == 2 and "not a task file" in result.output
    if not shutil.which("nvidia-smi"):  # the default backend is cuda, for rft's training too: one line, no traceback
        (tmp_path / "runs").mkdir()
        result = CliRunner().invoke(app, ["train", "--stage", "rft", "--model", str(tiny_model), "--runs",
                                          str(tmp_path / "runs"), "--out", str(tmp_path / "g")])
        assert result.exit_code == 2 and "no CUDA GPU found" in result.output, result.output


def test_the_scripted_expert_solves_the_demo_task_and_its_run_passes_the_rft_filter(cache_dir, tmp_path):
    from conftest import fast_config
    from cuda_agent.judge.pool import JudgePool
    from cuda_agent.rl.demo import expert_runs
    from cuda_agent.rl.rft import RFTFilter, export

    with JudgePool("cpu", fast_config(cache_dir)) as pool:
        [summary] = expert_runs(pool, tmp_path / "expert", count=1)
    assert summary.stop == "finish" and summary.final_verdict["reward"] >= 1, summary
    counts = export([tmp_path / "expert" / "00"], tmp_path / "rft", RFTFilter())
    assert counts["kept"] == 1, counts


def test_a_corpus_conversation_learns_the_first_reply_and_the_verify_call_after_what_the_writes_answer(tiny_model):
    """A corpus task's conversation (expert/corpus.py) goes on past the first reply: the workspace's answer to each
    write (read, not learnt), then the expert's call to `verify` (learnt): on first replies alone SmolLM2 wrote
    kernels it never verified (docs/training.md, eighth attempt)."""
    from cuda_agent.rl.expert import corpus

    [conversation] = corpus.conversations([TASKS / "affine_relu.py"], "cuda", True)
    first, answers, check = conversation[2], conversation[3:-1], conversation[-1]
    assert [m["role"] for m in conversation] == ["system", "user", "assistant", "tool", "tool", "tool", "assistant"]
    for call, answer in zip(first["tool_calls"], answers, strict=True):
        written = json.loads(call["function"]["arguments"])
        assert answer["tool_call_id"] == call["id"]
        assert answer["content"] == f"wrote {written['path']} ({len(written['content'].splitlines())} lines)"
    assert [c["function"]["name"] for c in check["tool_calls"]] == ["verify"]
    turns = TurnTokenizer(transformers.AutoTokenizer.from_pretrained(tiny_model), SCHEMAS, tool_format="text")
    trajectory = conversation_ids(turns, conversation)
    learnt = turns.tokenizer.decode([t for t, m in zip(trajectory.response, trajectory.mask) if m])
    read = turns.tokenizer.decode([t for t, m in zip(trajectory.response, trajectory.mask) if not m])
    assert '"name": "write_file"' in learnt and '"name": "verify"' in learnt and "wrote kernels/" not in learnt
    assert read.count("wrote ") == 3


def test_the_imitation_probe_scores_the_expert_s_first_reply_and_follows_what_sft_teaches(tiny_model, tmp_path):
    """The probe's conversations are a task's opening messages and the expert's first reply (a task the expert
    cannot fuse is left out); a supervised stage scores them at its first step and at each checkpoint; training on
    that very reply (from a run folder and as an `extra` conversation) lowers its nll (the probe reads the policy
    being trained, not a copy)."""
    unfusable = tmp_path / "conv.py"
    unfusable.write_text((TASKS / "affine_relu.py").read_text().replace(
        "super().__init__()\n", "super().__init__()\n        self.register_buffer('b', torch.zeros(1))\n"))  # (buffers)
    conversations = expert_conversations([TASKS / "affine_relu.py", unfusable], "cuda", True)
    assert len(conversations) == 1
    opening, reply = conversations[0][:2], conversations[0][2]
    assert opening[1]["content"].endswith(f"```python\n{(TASKS / 'affine_relu.py').read_text()}\n```")
    assert [c["function"]["name"] for c in reply["tool_calls"]] == ["write_file"] * 3
    records = [{"type": m["role"], "message": m} for m in conversations[0]]
    records += [{"type": "tool", "message": {"role": "tool", "tool_call_id": "c", "content": "wrote it"}}] * 3
    records.append({"type": "result", "summary": {"reference": "t.py", "final_verdict": {
        "reward": 3, "policy_violations": [], "speedup_vs_compile": 1.2}}})
    (tmp_path / "runs" / "expert").mkdir(parents=True)
    (tmp_path / "runs" / "expert" / "trajectory.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    config = StageConfig(stage="rft", steps=4, batch=2, save_every=3, compact=True, max_new_tokens=4096,
                         train=TrainConfig(actor_lr=3e-3))
    run_stage(config, tiny_model, [], tmp_path / "rft", None, "cpu", [tmp_path / "runs" / "expert"],
              log=lambda m: None, probe=conversations, extra=[(conversations[0], None)])  # (unjudged)
    rows = [json.loads(line) for line in (tmp_path / "rft" / "metrics.jsonl").read_text().splitlines()]
    turns = TurnTokenizer(transformers.AutoTokenizer.from_pretrained(tiny_model), schemas(True), tool_format="text")
    assert rows[0]["tokens"] == 2 * sum(conversation_ids(turns, conversations[0]).mask)  # the run's and the extra
    assert rows[0]["reward_mean"] == 3  # the judged conversation's: the unjudged one has none
    assert ["probe_nll" in r for r in rows] == [True, False, True, True]
    assert all(r["probe_replies"] == 1 and 0 <= r["probe_greedy_wrong"] <= 1 for r in rows if "probe_nll" in r)
    assert rows[-1]["probe_nll"] < rows[0]["probe_nll"] - 0.5, rows


def test_sft_reads_a_staged_shape_s_first_reply_as_context_and_learns_what_follows(tiny_model, tmp_path):
    """The expert's `fix` and `improve` episodes open with a staged reply (a planted error, slow knobs): SFT trains
    on the turns after it, not on it, so every prompt has one first reply to learn (the `direct` shape's)."""
    task = probe_tasks([TASKS / "affine_relu.py"], "cuda", True)[0]
    opening, first = task.opening, task.replies["fix"]  # (its kernel lacks a semicolon)
    after = [*({"role": "tool", "tool_call_id": f"c{i}", "content": "written"} for i in range(3)),
             {"role": "assistant", "content": "Fixed.", "tool_calls": [{"id": "f", "type": "function", "function": {
                 "name": "finish", "arguments": json.dumps({"summary": "the semicolon it lacked, added"})}}]}]
    for name in ("direct-0", "fix-0"):
        records = [{"type": m["role"], "message": m} for m in [*opening, first, *after]]
        records.append({"type": "result", "summary": {"reference": "t.py", "final_verdict": {
            "reward": 2, "policy_violations": [], "speedup_vs_compile": 1.1}}})
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "trajectory.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    config = StageConfig(stage="rft", steps=1, batch=2, compact=True, train=TrainConfig(actor_lr=1e-3))
    run_stage(config, tiny_model, [], tmp_path / "sft", None, "cpu",
              [tmp_path / "runs" / "direct-0", tmp_path / "runs" / "fix-0"], log=lambda m: None)
    turns = TurnTokenizer(transformers.AutoTokenizer.from_pretrained(tiny_model), schemas(True), tool_format="text")
    whole, staged = (conversation_ids(turns, [*opening, first, *after], k) for k in (0, 1))
    assert whole.ids == staged.ids and 0 < sum(staged.mask) < sum(whole.mask)
    row = json.loads((tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["tokens"] == sum(whole.mask) + sum(staged.mask)  # direct's two replies, fix's second only


def test_a_sampled_reply_is_scored_against_each_of_the_expert_s_first_replies(tiny_model):
    """`closeness`: 1 only for one of the expert's replies (any shape's), else how much of one it starts with;
    `sampled` plays a reply to each task's opening through the batch sampler (a random model: nothing of them)."""
    task = probe_tasks([TASKS / "affine_relu.py"], "cuda", True)[0]
    replies = [assistant_text(r) for r in task.replies.values()]
    assert sorted(task.replies) == ["direct", "fix", "improve", "repair"] and len(set(replies)) == 4
    assert closeness(replies[1], replies) == 1.0
    assert 0.45 < closeness(replies[0][:len(replies[0]) // 2], replies) < 0.55
    assert closeness(replies[0] + " ", replies) < 1.0 and closeness("nothing alike", replies) == 0
    turns = TurnTokenizer(transformers.AutoTokenizer.from_pretrained(tiny_model), schemas(True), tool_format="text")
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model)
    encoded = turns.tokenizer.encode(replies[0], add_special_tokens=False)
    assert closeness(turns.tokenizer.decode(encoded), replies) == 1.0  # a reply sampled token for token is one
    row = sampled(model, turns, [task, task], 1.0, 16, weights=model.state_dict)
    assert row["sampled_replies"] == 2 and row["sampled_expert"] == 0 and row["sampled_closeness"] < 0.01
    assert row["sampled_plan"] == row["sampled_plan_whole"] == 0
    # the plan: a line per op and the output's, each held word for word or not at all
    direct = task.replies["direct"]["content"]
    lines = plan_lines(direct)
    assert len(lines) == 5 and plan_score(replies[0], direct) == 1.0  # (mul, add, relu, mul; the output)
    garbled = direct.replace(lines[2], lines[2].replace("0.f", "1.f"))
    assert plan_score(garbled, direct) == 0.8 and plan_score(direct.replace(lines[0] + "\n", ""), direct) == 0.8
