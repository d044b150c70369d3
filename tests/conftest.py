import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from cuda_agent.judge import Judge, JudgeConfig

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"
TASKS = DATA / "tasks"
CANDIDATES = DATA / "candidates"


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """One judge cache for the whole run, shared by pytest-xdist's workers (objects, the precompiled header, baselines
    are built once: the cache is made for several judges at once, under its own file locks)."""
    env = os.environ.get("CUDA_AGENT_TEST_CACHE")
    if env:
        return Path(env)
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "judge-cache"
    shared.mkdir(exist_ok=True)
    return shared


def visible_parent() -> str | None:
    """A writable folder the sandbox neither replaces (/tmp) nor hides (home directories)."""
    return next((p for p in ("/var/tmp", str(ROOT))
                 if os.access(p, os.W_OK) and not p.startswith(("/tmp", "/root", "/home"))), None)


VISIBLE_CACHE = "CUDA_AGENT_TEST_VISIBLE_CACHE"


def pytest_configure(config):
    """The run's one judge cache outside /tmp (`visible_cache`), made before pytest-xdist's workers start (they
    inherit its path) and removed when the run ends. Torch in the test processes themselves computes on one thread:
    two workers' OpenMP threads spinning on CI's two cores beside each other and the judges' worker processes made
    the tests that train in-process 3.5x slower (46 vs 13 s, two value-pretraining tests run twice at once on the
    dev machine); what the judges' workers run is theirs to set."""
    import torch

    torch.set_num_threads(1)
    parent = visible_parent()
    if not hasattr(config, "workerinput") and parent and VISIBLE_CACHE not in os.environ:
        os.environ[VISIBLE_CACHE] = config.visible_cache = tempfile.mkdtemp(prefix="cuda-agent-test-cache-",
                                                                             dir=parent)


def pytest_unconfigure(config):
    if getattr(config, "visible_cache", None):
        shutil.rmtree(config.visible_cache, ignore_errors=True)
        os.environ.pop(VISIBLE_CACHE, None)


@pytest.fixture(scope="session")
def visible_cache() -> Path:
    """One judge cache for the sandboxed judges' tests (outside /tmp, which the sandbox replaces), shared by the
    workers: torch's precompiled header and the objects are built once for all of them."""
    if not os.environ.get(VISIBLE_CACHE):
        pytest.skip("no writable folder outside /tmp and the home directories")
    return Path(os.environ[VISIBLE_CACHE])


@pytest.fixture(scope="session")
def visible_dir():
    """Scratch space the sandbox neither replaces (/tmp) nor hides (home directories): a probe denied there is
    denied by the read-only view, not fooled by a file that is simply absent inside."""
    parent = visible_parent()
    if parent is None:
        pytest.skip("no writable folder outside /tmp and the home directories")
    path = Path(tempfile.mkdtemp(prefix="cuda-agent-test-", dir=parent))
    yield path
    shutil.rmtree(path, ignore_errors=True)


# Shorter timing than the defaults' (0.3 s per model, up to 100 calls, 10 eager calls checked around the candidate's,
# a second attempt when noisy): for tests of what is done with verdicts, not of the timings themselves. Baselines are
# cached by these settings, so every test timing this way shares them. (At least 5 warm-up and 10 timed calls: an
# attack test counts more than 20 calls of one evaluation.)
# (the CPU sampler at a quarter of its period: a short timing's ~20 ms of a candidate's calls give it ~80 samples, not
# the ~20 that decide nothing: a red-team candidate passed CI's loaded machine so, 2026-12-07)
FAST_TIMING = {"target_time_s": 0.05, "min_iters": 10, "max_iters": 40, "check_iters": 5, "timing_attempts": 1,
               "cpu_sample_period_us": 250}


def fast_config(cache_dir: Path, **overrides) -> JudgeConfig:
    """The judge of most tests: FAST_TIMING, and one candidate worker started ahead (a judge made for one test
    would otherwise leave a second spare starting up beside the next test)."""
    cfg = JudgeConfig(cache_dir=cache_dir, run_timeout_s=90, spare_candidates=1, **FAST_TIMING)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


@contextmanager
def fast_commands():
    """Commands run in-process (typer's CliRunner) judge with FAST_TIMING meanwhile: every other setting is still the
    command's own (its options and defaults), only the timing loop is shorter."""
    from cuda_agent.cli import common

    config = common.config

    def fast(*args, **kwargs):
        cfg = config(*args, **kwargs)
        for key, value in FAST_TIMING.items():
            setattr(cfg, key, value)
        return cfg

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(common, "config", fast)
        yield


@pytest.fixture
def fast_cli():
    """fast_commands() for one test."""
    with fast_commands():
        yield


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The real SmolLM2-135M-Instruct folder (fetched into the default cache once, as the README's first use)."""
    pytest.importorskip("gguf", reason="the `serve` extra is not installed")
    from cuda_agent.local_model import fetch

    return fetch()


@pytest.fixture(scope="session")
def tiny_smollm2(smollm2, tmp_path_factory) -> Path:
    """SmolLM2's tokenizer and chat template with a 2-layer, 64-wide config (weights: `--random-init`)."""
    import json

    folder = tmp_path_factory.mktemp("tiny-smollm2")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copyfile(smollm2 / name, folder / name)
    config = json.loads((smollm2 / "config.json").read_text())
    config.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_smollm2, tmp_path_factory) -> Path:
    """tiny_smollm2 with seeded random weights saved beside its tokenizer: a model folder any command loads."""
    import torch
    import transformers

    folder = tmp_path_factory.mktemp("tiny-checkpoint")
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(tiny_smollm2)) \
        .save_pretrained(folder)
    transformers.AutoTokenizer.from_pretrained(tiny_smollm2).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """A 2-layer, 32-wide Llama of a 64-token vocabulary with seeded random weights (no tokenizer)."""
    import torch
    import transformers

    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-llama")
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def cpu_judge(cache_dir) -> Judge:
    return Judge("cpu", fast_config(cache_dir))


@pytest.fixture
def make_workspace(tmp_path):
    """Copy a candidate workspace from tests/data and apply exact text edits {file: [(old, new), ...]}."""

    def make(base: str = "affine_relu_ok", edits: dict[str, list[tuple[str, str]]] | None = None) -> Path:
        dest = tmp_path / f"{base}-{len(list(tmp_path.iterdir()))}"
        shutil.copytree(CANDIDATES / base, dest)
        for rel, pairs in (edits or {}).items():
            path = dest / rel
            text = path.read_text()
            for old, new in pairs:
                assert old in text, f"{old!r} not in {rel}"
                text = text.replace(old, new)
            path.write_text(text)
        return dest

    return make


def kept_processes(*judges) -> set[str]:
    """Process ids a judge keeps between evaluations (warm reference workers, spare candidate workers) and all
    their descendants (a sandboxed spare's worker runs under unshare and sh)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[stat.parent.name] = stat.read_text().rsplit(")", 1)[1].split()[1]
        except (OSError, IndexError):
            continue
    found = {str(w.process.proc.pid) for j in judges for w in j.references.workers.values()} | \
        {str(slot.worker.proc.pid) for j in judges for slot in j.spares._ready}
    while True:
        more = {pid for pid, parent in parents.items() if parent in found} - found
        if not more:
            return found
        found |= more


def not_another_workers(pids: set[str]) -> set[str]:
    """`pids` but those another pytest-xdist worker started (their judges may share this one's cache, so a pattern
    on its path finds their workers too): a process is this worker's when this worker is among its ancestors, and an
    orphan (reparented to init or a subreaper) when no pytest process is."""
    def ancestors(pid: str):
        while pid not in ("0", "1"):
            try:
                pid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
            except (OSError, IndexError):
                return
            yield pid

    def anothers(pid: str) -> bool:
        for parent in ancestors(pid):
            if parent == str(os.getpid()):
                return False
            try:
                if b"pytest" in Path(f"/proc/{parent}/cmdline").read_bytes():
                    return True
            except OSError:
                return False
        return False
    return {pid for pid in pids if not anothers(pid)}


def static_decoder_follows_the_model(actor, device: str, steps: int, atol: float, bucket: int | None = None,
                                     prompt: int = 5) -> None:
    """Two rows of `prompt` tokens, one left-padded by two, prefilled by the model, then `steps` tokens fed through
    the static decoder and through the model's own cache: the same next-token logits at every step (the decoder's
    CUDA graphs on a GPU: one for each `bucket` of cache slots the rows reach)."""
    import torch

    from cuda_agent.rl import static_decode
    from cuda_agent.rl.models import positions

    assert static_decode.supports(actor.model) is None
    ids = torch.tensor([[(7 * j + 3 * row) % 60 + 1 for j in range(prompt)] for row in range(2)], device=device)
    attention = torch.ones_like(ids)
    ids[0, :2], attention[0, :2] = 0, 0
    position = positions(attention)
    with torch.no_grad():
        out = actor.model(input_ids=ids, attention_mask=attention, position_ids=position, use_cache=True)
        decoder = static_decode.StaticDecoder(actor.model, actor.decoding_weights(), 2, prompt + steps,
                                              bucket or static_decode.BUCKET)
        decoder.load_prefill(out.past_key_values, attention, position)
        past, position = out.past_key_values, position[:, -1:]
        for step in range(steps):
            token = torch.tensor([[step % 60 + 1], [60 - step % 60]], device=device)
            attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)
            position = position + 1
            out = actor.model(input_ids=token, attention_mask=attention, position_ids=position, past_key_values=past,
                              use_cache=True)
            past = out.past_key_values
            assert torch.allclose(decoder.step(token), out.logits[:, -1].float(), atol=atol), step
    reached = -(-(prompt + steps) // decoder.bucket) - (prompt // decoder.bucket)  # (the attended lengths reached)
    assert decoder.next == prompt + steps and len(decoder.graphs) == (reached if device == "cuda" else 0)


def sampled_logprobs_are_the_trainer_s(actor, prompt: list[int], tokens: list[int], logprobs: list[float],
                                       temperature: float, atol: float) -> None:
    """A sampled reply's log-probs equal the trainer's recompute of the whole sequence at once."""
    import torch

    ids = torch.tensor([prompt + tokens], device=next(actor.model.parameters()).device)
    with torch.no_grad():
        alone = actor.logprobs(ids, torch.ones_like(ids), temperature=temperature)[0][0, len(prompt) - 1:]
    assert torch.allclose(alone.cpu(), torch.tensor(logprobs), atol=atol), (alone, logprobs)
