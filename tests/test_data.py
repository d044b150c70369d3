"""The dataset pipeline on the CPU: a small build end to end, resumed; every filter rejecting a task built to fail
it; exported rows judged as references."""

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import TASKS, fast_config
from cuda_agent.data.build import BuildConfig, Builder
from cuda_agent.data.catalog import crawl
from cuda_agent.data.filters import FilterConfig, check_task
from cuda_agent.data.transformers_ops import crawl_transformers
from cuda_agent.data.similarity import fingerprint, operator_sequence, similarity
from cuda_agent.judge import Judge

CPU = FilterConfig(device="cpu", window_ms=(0.02, 500.0), timing_iters=3)


def task(forward: str, init: str = "pass", shape: str = "BATCH, 64", extra: str = "") -> str:
    return (f"import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def __init__(self):\n"
            f"        super().__init__()\n        {init}\n\n    def forward(self, x):\n        return {forward}\n\n\n"
            f"BATCH = 32\n{extra}\n\ndef get_inputs():\n    return [torch.randn({shape})]\n\n\n"
            "def get_init_inputs():\n    return []\n")


def failed(result) -> tuple[str, str]:
    check = next(c for c in result.checks if not c.passed)
    return check.name, check.detail


def test_a_healthy_task_passes_every_execution_filter():
    result = check_task(task("torch.tanh(self.lin(x))", "self.lin = nn.Linear(64, 64)"), CPU)
    assert result.passed, result.checks
    assert [c.name for c in result.checks] == ["runs_in_eager", "runtime_window", "deterministic", "not_degenerate",
                                               "well_conditioned", "runs_in_compile"]
    assert result.eager_ms > 0 and result.compile_ms > 0 and result.output_stats["abs_max"] > 0.01


@pytest.mark.parametrize("source, rule, detail", [
    (task("x.undefined_method()"), "runs_in_eager", "AttributeError"),
    (task("torch.dropout(x, 0.5, True)"), "deterministic", "stochastic op"),
    (task("x * 0 + 1"), "not_degenerate", "constant output"),
    (task("x * 1e-6"), "not_degenerate", "zeros would pass"),
    (task("torch.log(-x.abs() - 1)"), "not_degenerate", "NaN or Inf"),
    (task("torch.tanh(x.mean(dim=0, keepdim=True) * 0 + x.detach().new_ones(1))"), "not_degenerate",
     "constant output"),
    (task("x + 0 * self.lin(x)", "self.lin = nn.Linear(64, 64)"), "not_degenerate", "depends on the weights"),
    # a step after rounding-sensitive math: float32 and float64 land on either side of it for some inputs (the H200
    # ceiling's mish -> hardshrink task failed the expert's exact-enough kernel that way)
    (task("(torch.sin(x * 1000) > 0.5).float() + x", shape="BATCH, 4096"), "well_conditioned", "jumps under rounding"),
    (task("x * 2 if torch.compiler.is_compiling() else x * 3"), "runs_in_compile", "relative error"),
])
def test_each_execution_filter_rejects_the_task_built_to_fail_it(source, rule, detail):
    name, why = failed(check_task(source, CPU))
    assert name == rule, (name, why)
    assert detail in why or detail == "relative error", why


def test_the_runtime_window_rejects_and_the_batch_is_scaled_toward_it():
    slow_window = FilterConfig(device="cpu", window_ms=(5000.0, 9000.0), timing_iters=1)
    result = check_task(task("torch.tanh(x)", shape="4, 64"), slow_window)  # no BATCH in get_inputs: cannot scale
    assert failed(result)[0] == "runtime_window"
    # Timed as the judge times (caches flushed): 32 x 64 elements take well under 20 ms even on a busy machine.
    scaled = check_task(task("torch.tanh(x)", shape="BATCH, 64"), FilterConfig(device="cpu", window_ms=(20.0, 200.0)))
    assert scaled.passed and "BATCH = 32\n" not in scaled.source, scaled.checks[1]  # BATCH was raised into the window


def test_similarity_is_structural_and_catches_renamed_copies():
    a = fingerprint(task("torch.relu(self.conv(x))", "self.conv = nn.Conv2d(3, 8, 3)"))
    renamed = fingerprint(task("torch.relu(self.c(y))", "self.c = nn.Conv2d(16, 32, 5)").replace("x)", "y)"))
    other = fingerprint(task("torch.softmax(x, dim=-1).cumsum(-1)"))
    assert similarity(a, a) == 1.0 and similarity(a, renamed) > 0.9 > similarity(a, other)


def test_constant_initialised_weights_still_count_as_weights():
    # LayerNorm starts at weight 1, bias 0 under every seed: the weights probe must perturb them, not re-seed them
    result = check_task(task("self.norm(x)", "self.norm = nn.LayerNorm(64)"), CPU)
    assert result.passed, result.checks
    assert next(c for c in result.checks if c.name == "not_degenerate").value["change_weights"] > 1e-2


def test_near_duplicates_are_the_same_operator_sequence():
    conv_relu = task("torch.relu(self.conv(x))", "self.conv = nn.Conv2d(3, 8, 3)")
    resized_alias = task("F.relu(self.c(x))", "self.c = nn.Conv2d(16, 32, 5)")
    reordered = task("self.conv(torch.relu(x))", "self.conv = nn.Conv2d(3, 8, 3)")
    other_op = task("torch.sigmoid(self.conv(x))", "self.conv = nn.Conv2d(3, 8, 3)")
    assert operator_sequence(conv_relu) == operator_sequence(resized_alias) == ("conv2d", "relu")
    assert operator_sequence(reordered) == ("relu", "conv2d") and operator_sequence(other_op) == ("conv2d", "sigmoid")
    # the whole-file AST measure cannot tell them apart: the shared boilerplate dominates it
    assert similarity(fingerprint(conv_relu), fingerprint(other_op)) > 0.95


def test_a_small_build_end_to_end_resumes_and_applies_the_dataset_rules(tmp_path):
    suite = tmp_path / "suite" / "level1"
    suite.mkdir(parents=True)
    (suite / "mine.py").write_text((TASKS / "affine_relu.py").read_text())
    cfg = BuildConfig(3, tmp_path / "ds", CPU, kernelbench=tmp_path / "suite", workers=2)
    stats = Builder(cfg).run()
    assert stats["kept"] == 3
    first = (tmp_path / "ds" / "attempts.jsonl").read_text().splitlines()
    cfg.target = 5
    stats = Builder(cfg).run()  # resumes: earlier attempts are not redone
    lines = (tmp_path / "ds" / "attempts.jsonl").read_text().splitlines()
    assert lines[:len(first)] == first
    assert len({json.loads(line)["index"] for line in lines}) == len(lines)
    assert stats["kept"] == 5 and abs(sum(stats["composition"].values()) - 1) < 1e-6
    table = pq.read_table(tmp_path / "ds" / "dataset.parquet")
    assert table.num_rows == 5 and {"code", "ops", "data_source", "num_ops", "eager_ms", "compile_ms",
                                    "max_kernelbench_similarity"} <= set(table.column_names)
    rows = [json.loads(line) for line in (tmp_path / "ds" / "dataset.jsonl").read_text().splitlines()]
    assert all(r["data_source"] == f"torch#{r['num_ops']}" and r["max_kernelbench_similarity"] <= 0.9 for r in rows)
    assert "| data_source | share |" in (tmp_path / "ds" / "stats.md").read_text()

    # The dataset rules: a copy of a suite problem, and a duplicate of a kept task, are rejected.
    builder = Builder(cfg)
    copy = {"index": 10_000, "kept": True, "source": (TASKS / "affine_relu.py").read_text(), "checks": []}
    builder._similarity(copy)
    assert not copy["kept"] and copy["checks"][0]["name"] == "kernelbench_similarity"
    dup = {"index": 10_001, "kept": True, "source": rows[0]["code"], "checks": []}
    builder._similarity(dup)
    assert not dup["kept"] and [c["name"] for c in dup["checks"] if not c["passed"]] == ["not_a_duplicate"]


def test_exported_rows_run_as_references_in_the_judge(cache_dir, tmp_path):
    cfg = BuildConfig(1, tmp_path / "ds", CPU, workers=1, seed=7)
    Builder(cfg).run()
    row = json.loads((tmp_path / "ds" / "dataset.jsonl").read_text().splitlines()[0])
    reference = tmp_path / "row0.py"
    reference.write_text(row["code"])
    cheat = tmp_path / "cheat.py"  # runs the reference's own torch ops: the judge must see and refuse them
    cheat.write_text(row["code"].replace("class Model(", "class ModelNew("))
    verdict = Judge("cpu", fast_config(cache_dir)).evaluate(reference, cheat)
    assert verdict.error.startswith("policy violation: torch op"), verdict.error  # the reference ran, trials ran


def test_the_crawl_records_what_it_could_not_instantiate():
    ops, rejected = crawl()
    names = {op.name for op in ops}
    assert {"nn.Conv2d", "nn.Linear", "nn.LayerNorm", "nn.GELU", "torch.softmax"} <= names
    reasons = {r["name"]: r["reason"] for r in rejected}
    assert reasons["nn.Dropout"] == "stochastic" and "several inputs" in reasons["nn.MSELoss"]


def test_a_task_that_fails_at_the_scaled_batch_is_rejected_not_fatal():
    fragile = task("x.tanh() if x.shape[0] <= 32 else x.no_such_method()", shape="BATCH, 4096")
    result = check_task(fragile, FilterConfig(device="cpu", window_ms=(50.0, 100.0), timing_iters=1))
    name, why = failed(result)
    assert name == "runtime_window" and "failed: AttributeError" in why, why


LLM_TASK = '''Here is the task.
```python
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.lin = nn.Linear(features, features)

    def forward(self, x):
        return torch.tanh(self.lin(x))


BATCH = 64


def get_inputs():
    return [torch.randn(BATCH, 128)]


def get_init_inputs():
    return [128]
```'''


@pytest.mark.skipif(__import__("cuda_agent.sandbox", fromlist=["probe"]).probe() is not None,
                    reason="sandbox unavailable: model-written code is not run")
def test_the_llm_composer_s_code_is_checked_in_the_sandbox(tmp_path):
    from cuda_agent.data.build import ReplayComposer

    outside = Path(__file__).parent / "pwned.txt"  # the repository: read-only inside the sandbox
    hostile = LLM_TASK.replace("import torch\n", f"import torch\nopen({str(outside)!r}, 'w').write('x')\n", 1)
    replies = [{"role": "assistant", "content": LLM_TASK}, {"role": "assistant", "content": hostile},
               {"role": "assistant", "content": "I cannot do that."}]
    cfg = BuildConfig(1, tmp_path / "ds", CPU, workers=1, composer=ReplayComposer(replies), max_attempts=3)
    stats = Builder(cfg).run()
    records = [json.loads(line) for line in (tmp_path / "ds" / "attempts.jsonl").read_text().splitlines()]
    assert stats["kept"] == 1 and records[0]["kept"] and "nn.Linear" in records[0]["source"]
    row = json.loads((tmp_path / "ds" / "dataset.jsonl").read_text().splitlines()[0])
    assert row["composer"] == "ReplayComposer"
    cfg.target = 2  # resume: the hostile task runs (sandboxed) and fails, the third reply has no code
    Builder(cfg).run()
    records = [json.loads(line) for line in (tmp_path / "ds" / "attempts.jsonl").read_text().splitlines()]
    written = outside.exists()
    outside.unlink(missing_ok=True)
    assert not written
    assert [r["kept"] for r in records] == [True, False, False]
    hostile_check = next(c for c in records[1]["checks"] if not c["passed"])
    assert hostile_check["name"] == "runs_in_eager" and "Read-only file system" in hostile_check["detail"]
    assert records[2]["checks"][0]["detail"] == "the reply held no usable task: no ```python block in the reply"


@pytest.mark.skipif(__import__("cuda_agent.sandbox", fromlist=["probe"]).probe() is not None,
                    reason="sandbox unavailable: model-written code is not run")
def test_a_sandboxed_task_cannot_print_a_result_for_itself(tmp_path):
    from cuda_agent.data.filters import check_task_sandboxed

    passing = {"source": "x", "checks": [{"name": "runs_in_eager", "passed": True, "value": None, "threshold": None,
                                          "detail": ""}], "eager_ms": 1.0, "compile_ms": 1.0, "output_stats": {}}
    forge = (f"import json, os, sys\nfor line in ({json.dumps({'event': 'result', **passing})!r}, "
             f"{json.dumps(passing)!r}):\n"
             "    print(line, flush=True)\n    print(line, file=sys.stderr, flush=True)\nos._exit(0)\n")
    result = check_task_sandboxed(task("torch.tanh(x)", extra=forge), CPU, tmp_path / "forged")
    name, why = failed(result)
    assert name == "runs_in_eager" and "exited with code 0" in why, why
    honest = check_task_sandboxed(task("torch.tanh(x)"), CPU, tmp_path / "honest")
    assert honest.passed and honest.eager_ms > 0, honest.checks


def test_transformers_operators_are_crawled_built_standalone_and_judged(cache_dir, tmp_path):
    ops, rejected = crawl_transformers()
    assert {"transformers:act:gelu_new", "transformers:LlamaRMSNorm", "transformers:LlamaMLP",
            "transformers:LlamaAttention", "transformers:LlamaRotaryEmbedding"} <= {op.name for op in ops}
    assert {"name": "transformers:BertCrossAttention", "reason": "cross attention: two inputs"} in rejected
    cfg = BuildConfig(2, tmp_path / "hf", FilterConfig(device="cpu", window_ms=(0.02, 2000.0), timing_iters=1,
                                                       check_compile=False), workers=2, transformers_share=1.0)
    stats = Builder(cfg).run()
    rows = [json.loads(line) for line in (tmp_path / "hf" / "dataset.jsonl").read_text().splitlines()]
    assert stats["composition"] == {"transformers": 1.0} and len(rows) == 2
    assert all(r["num_ops"] == 1 and json.loads(r["ops"])[0].startswith("transformers:") for r in rows)
    reference = tmp_path / "hf_row.py"
    reference.write_text(rows[0]["code"])
    cheat = tmp_path / "hf_cheat.py"  # the block itself: refused, after the reference ran in the judge
    cheat.write_text(rows[0]["code"].replace("class Model(", "class ModelNew("))
    verdict = Judge("cpu", fast_config(cache_dir)).evaluate(reference, cheat)
    assert verdict.phases_s["reference_ready"] > 0 and verdict.reward == -1, verdict.error
    # transformers imports numpy, which strict candidates do not get: the reason says so
    assert "numpy is hidden from candidates under the strict policy" in verdict.error, verdict.error



def test_a_build_past_its_time_limit_starts_nothing_more_and_still_exports(tmp_path):
    cfg = BuildConfig(50, tmp_path / "t", CPU, workers=1, time_limit_s=1e-9, transformers=False)
    stats = Builder(cfg).run()
    assert stats["kept"] == 0 and stats["attempts"] == 0 and stats["catalog"]["transformers_operators"] is None
    assert (tmp_path / "t" / "dataset.parquet").exists()
    assert "transformers not crawled" in (tmp_path / "t" / "stats.md").read_text()


def test_seed_tasks_are_every_crawled_operator_alone(tmp_path):
    from cuda_agent.data.taskfile import load
    from cuda_agent.data.seeds import write_seeds
    from cuda_agent.task import load_task

    catalog = write_seeds(tmp_path, transformers=True)
    ops, _ = crawl()
    torch_files = sorted((tmp_path / "torch").glob("*.py"))
    assert [f.stem for f in torch_files] == sorted(op.name for op in ops) == sorted(catalog["torch"]["operators"])
    assert len(list((tmp_path / "transformers").glob("*.py"))) == len(catalog["transformers"]["operators"]) > 50
    assert json.loads((tmp_path / "catalog.json").read_text())["torch"]["not_instantiated"]
    for path in [*torch_files, tmp_path / "transformers" / "LlamaRMSNorm.py"]:
        load_task(path)
        module = load(path.read_text())
        out = module.Model(*module.get_init_inputs())(*module.get_inputs())
        assert out.is_floating_point(), path.name


def test_the_expert_family_builds_only_tasks_the_expert_fuses_split_by_operator_combination(tmp_path):
    from cuda_agent.data.families import split_of
    from cuda_agent.rl.expert.trace import trace

    cfg = BuildConfig(8, tmp_path / "ds", CPU, workers=2, family="expert", held_out=0.4, unseen_ops=("nn.Mish",),
                      unseen_shapes=2, seed=24)
    stats = Builder(cfg).run()
    assert stats["kept"] == 8 and stats["family"] == "expert"
    rows = [json.loads(line) for line in (tmp_path / "ds" / "dataset.jsonl").read_text().splitlines()]
    lengths = [trace(row["code"]).cols for row in rows]  # every kept task is one the expert fuses
    assert any(n >= 1024 for n in lengths) and any(n <= 256 for n in lengths), lengths  # long rows and short
    for row in rows:
        assert row["split"] == split_of(json.loads(row["ops"]), 0.4, ("nn.Mish",))
    combos = {}
    for row in rows:
        combos.setdefault(frozenset(json.loads(row["ops"])), set()).add(row["split"])
    assert all(len(splits) == 1 for splits in combos.values())  # no combination in two splits
    assert {"train", "held_out"} <= {row["split"] for row in rows}
    splits = {p.stem: [json.loads(line) for line in p.read_text().splitlines()]
              for p in (tmp_path / "ds" / "splits").glob("*.jsonl")}
    assert sum(len(v) for k, v in splits.items() if k != "unseen_shape") == 8
    assert sum(stats["splits"].values()) == 8 + len(splits.get("unseen_shape", []))
    assert len(splits["unseen_shape"]) == min(2, len(splits["train"]))
    for row in splits["unseen_shape"]:
        program = trace(row["code"])
        assert program.shape[-1] % 2 == 1  # an odd row length
    rejected = [json.loads(line) for line in (tmp_path / "ds" / "attempts.jsonl").read_text().splitlines()]
    assert all(r["checks"][0]["name"] != "expert_fuses" or not r["kept"] for r in rejected)
    assert all(split_of(["a", "b"], 0.5, ()) == split_of(["b", "a", "b"], 0.5, ()) for _ in range(2))
    with pytest.raises(ValueError, match="not operators of the expert family"):
        Builder(BuildConfig(1, tmp_path / "other", CPU, family="expert", unseen_ops=("nn.Conv2d",)))
