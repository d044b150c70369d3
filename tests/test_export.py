"""`cuda-agent export`: a verified kernel into the user's model (export/): the package's drop-in module (the
original's class name, constructor and parameter names) and custom op (torch.compile traces through it), and the
Hugging Face `kernels` build that `get_local_kernel` loads and `kernelize` swaps into a transformers model."""

import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from typer.testing import CliRunner

from conftest import CANDIDATES, TASKS
from cuda_agent import sandbox
from cuda_agent.cli import app
from cuda_agent.task import import_file

kernels = pytest.importorskip("kernels")
transformers = pytest.importorskip("transformers")

LLAMA_MLP_NEW = '''import torch
from torch import nn
from torch.nn import functional as F


class ModelNew(nn.Module):  # the task's LlamaMLP, written out (a kernel would go here)
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(32, 64, bias=False)
        self.up_proj = nn.Linear(32, 64, bias=False)
        self.down_proj = nn.Linear(64, 32, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
'''


class Ops(TorchDispatchMode):
    """The ops a forward dispatches."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def run(*args):
    return CliRunner().invoke(app, [*map(str, args)])


def test_a_transformers_mlp_becomes_a_kernel_that_kernelize_swaps_into_the_whole_model(tmp_path, cache_dir):
    """The issue's path on the cpu backend: a 2-layer Llama, one MLP block made a task, a kernel for it exported,
    checked in the whole model (check-model: both MLPs replaced, outputs and time), loaded by
    kernels.get_local_kernel, swapped into every MLP by kernelize: the whole model's outputs match, the kernel's op
    is what runs, and torch.compile of the model runs with the op inside."""
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")
    made = run("task", "new", "--hf-model", tmp_path / "llama", "--submodule", "model.layers.0.mlp", "--sample",
               "1,5,9,3,7", "--out", tmp_path / "mlp_task.py")
    assert made.exit_code == 0, made.output
    (tmp_path / "mlp_new.py").write_text(LLAMA_MLP_NEW)
    done = run("export", tmp_path / "mlp_new.py", "--task", tmp_path / "mlp_task.py", "--name", "llama_mlp",
               "--out", tmp_path / "exported", "--backend", "cpu", "--cache-dir", cache_dir)
    assert done.exit_code == 0, done.output
    assert "llama_mlp.LlamaMLP is the drop-in module" in done.output and "3 tensors" in done.output

    checked = run("check-model", "--hf-model", tmp_path / "llama", "--replace",
                  f"model.layers.*.mlp={tmp_path / 'exported' / 'llama_mlp'}", "--sample", "1,5,9,3,7,2",
                  "--backend", "cpu", "--fail-on-reject")
    assert checked.exit_code == 0, checked.output
    assert "replaced   2: model.layers.0.mlp, model.layers.1.mlp" in checked.output
    assert "outputs    match" in checked.output and "x (the judge's timing loop, median)" in checked.output

    from kernels import LocalLayerRepository, Mode, kernelize, replace_kernel_forward_from_hub, use_kernel_mapping
    from transformers.models.llama.modeling_llama import LlamaMLP

    loaded = kernels.get_local_kernel(tmp_path / "exported")
    assert hasattr(loaded.layers, "llama_mlp")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "llama").eval()
    ids = torch.tensor([[1, 5, 9, 3, 7, 2]])
    with torch.no_grad():
        want = model(ids).logits
    replace_kernel_forward_from_hub(LlamaMLP, "LlamaMLP")
    with use_kernel_mapping({"LlamaMLP": {"cpu": LocalLayerRepository(tmp_path / "exported",
                                                                       layer_name="llama_mlp")}}):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    with torch.no_grad(), Ops() as ops:
        got = model(ids).logits
    assert sum("cuda_agent_llama_mlp" in op for op in ops.seen) == 2  # both layers' MLPs run on the kernel
    assert torch.allclose(got, want, atol=1e-5)
    with torch.no_grad():
        assert torch.allclose(torch.compile(model)(ids).logits, want, atol=1e-4)
        # the kernel runs on each module's current weights: a weight replaced after the first call is the one used
        mlp, x = model.model.layers[1].mlp, torch.randn(1, 3, 32)
        mlp.up_proj.weight = torch.nn.Parameter(torch.randn(64, 32))
        assert torch.allclose(mlp(x), mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x)),
                              atol=1e-5)


def test_the_package_s_drop_in_module_takes_the_user_s_state_dict_and_runs_a_prebuilt_cpp_kernel(tmp_path,
                                                                                                   cache_dir):
    """A single file's load_inline extension is built at export and shipped: a fresh process imports the package
    and runs the kernel without compiling anything."""
    done = run("export", CANDIDATES / "affine_relu_single.py", "--task", TASKS / "affine_relu.py", "--name",
               "affine_relu", "--out", tmp_path / "out", "--backend", "cpu", "--cache-dir", cache_dir)
    assert done.exit_code == 0, done.output
    assert [p.name for p in (tmp_path / "out" / "affine_relu" / "_ext").iterdir()] == ["affine_relu_inline.so"]
    empty = tmp_path / "no-builds"
    empty.mkdir()
    script = ("import sys, torch; sys.path.insert(0, sys.argv[1]); import affine_relu\n"
              "m = affine_relu.Model(2.0, 0.1); x = torch.randn(4096)\n"
              "assert torch.allclose(m(x), torch.relu(x * 2.0 + 0.1) * 0.5)\n"
              "print('ok')\n")
    ran = subprocess.run([sys.executable, "-c", script, str(tmp_path / "out")], capture_output=True, text=True,
                         env={"TORCH_EXTENSIONS_DIR": str(empty), "PATH": "/usr/bin:/bin"}, timeout=300)
    assert ran.stdout.strip() == "ok", ran.stderr[-2000:]
    assert not any(empty.iterdir())  # nothing was compiled on import


@pytest.mark.skipif(sandbox.probe() is not None, reason=f"sandbox unavailable: {sandbox.probe()}")
def test_the_solution_s_code_runs_at_export_in_a_sandbox_not_in_this_process(tmp_path, visible_dir, cache_dir,
                                                                               monkeypatch):
    """Held out (red team, 2026-12-05): `optimize --module` exported its best kernel by importing it in the CLI's
    process, where the policy's code rewrote the run's verdict files (reward 3 for RFT) and the judge's cached
    baselines, with the user's API key in reach. Its import and the package's check now run sandboxed: no
    credentials, nothing written outside the staging folder, the judge's cache unseen; the export still works."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-must-not-leak")
    target, cache = visible_dir / "verdict.json", visible_dir / "export-judge-cache"  # (visible_dir is shared)
    target.write_text("reward 1")
    cache.mkdir(exist_ok=True)
    (cache / "judge.sqlite").write_text("baselines")
    payload = ("import os, pathlib\n"
               "def _try(act):\n"
               "    try:\n        return str(act())\n"
               "    except OSError as exc:\n        return type(exc).__name__\n"
               f"_found = [os.environ.get('OPENAI_API_KEY'), _try(lambda: open({str(target)!r}, 'w').write('3')),"
               f" _try(lambda: pathlib.Path({str(cache / 'judge.sqlite')!r}).read_text())]\n"
               "_try(lambda: pathlib.Path(__file__).with_name('found.txt').write_text(repr(_found)))\n")
    solution = tmp_path / "solution.py"
    solution.write_text(payload + (CANDIDATES / "affine_relu_single.py").read_text())
    done = run("export", solution, "--task", TASKS / "affine_relu.py", "--name", "affine_relu", "--out",
               tmp_path / "out", "--backend", "cpu", "--cache-dir", cache)
    assert done.exit_code == 0, done.output
    assert target.read_text() == "reward 1" and (cache / "judge.sqlite").read_text() == "baselines"
    found = (tmp_path / "out" / "affine_relu" / "found.txt").read_text()  # (from the package's check)
    assert found == repr([None, "OSError", "FileNotFoundError"]), found


def test_a_solution_whose_parameters_are_named_otherwise_is_refused_and_names_must_be_packages(tmp_path, cache_dir):
    (tmp_path / "task.py").write_text(
        "import torch\n\n\nclass Model(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.linear = torch.nn.Linear(8, 8)\n\n    def forward(self, x):\n        return self.linear(x)\n\n\n"
        "def get_inputs():\n    return [torch.randn(2, 8)]\n\n\ndef get_init_inputs():\n    return []\n")
    (tmp_path / "new.py").write_text(
        "import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.w = torch.nn.Linear(8, 8)\n\n    def forward(self, x):\n        return self.w(x)\n")
    refused = run("export", tmp_path / "new.py", "--task", tmp_path / "task.py", "--name", "lin", "--out",
                  tmp_path / "out", "--backend", "cpu", "--cache-dir", cache_dir)
    assert refused.exit_code == 2 and "ModelNew's parameters (w.weight, w.bias) are not Model's" in refused.output
    assert not (tmp_path / "out" / "lin").exists()
    no_model_new = run("export", tmp_path / "task.py", "--task", tmp_path / "task.py", "--name", "lin", "--out",
                       tmp_path / "out", "--backend", "cpu")
    assert no_model_new.exit_code == 2 and "ModelNew" in no_model_new.output, no_model_new.output
    bad = run("export", tmp_path / "new.py", "--task", tmp_path / "task.py", "--name", "My-Kernel", "--out",
              tmp_path / "out", "--backend", "cpu")
    assert bad.exit_code == 2 and "a Python package name" in bad.output
    module = import_file(tmp_path / "task.py", "export_refusal_task")
    assert list(module.Model().state_dict()) == ["linear.weight", "linear.bias"]
