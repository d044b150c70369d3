"""`cuda-agent task new`: a task from the user's own module (a class in a file, a submodule of a transformers model
folder) that keeps its parameter names, checked before it is written and judged as it is (user_task.py)."""

import pytest
from typer.testing import CliRunner

from cuda_agent.cli import app
from cuda_agent.task import import_file, load_task

MLP = '''import torch
from torch import nn


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, inner: int):
        super().__init__()
        self.gate = nn.Linear(hidden, inner, bias=False)
        self.up = nn.Linear(hidden, inner, bias=False)
        self.down = nn.Linear(inner, hidden, bias=False)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))
'''


def new(*args):
    return CliRunner().invoke(app, ["task", "new", *map(str, args)])


def test_a_class_in_a_file_becomes_a_task_with_its_parameter_names(tmp_path):
    (tmp_path / "mlp.py").write_text(MLP)
    task = tmp_path / "task.py"
    done = new(f"{tmp_path / 'mlp.py'}:GatedMLP", "--init", "[64, 128]", "--inputs", "[torch.randn(8, 64)]",
               "--out", task)
    assert done.exit_code == 0, done.output
    assert "Model = GatedMLP(64, 128); forward on (8, 64) float32 gives (8, 64) float32" in done.output
    module = import_file(load_task(task).path, "made_task")
    assert sorted(module.Model(*module.get_init_inputs()).state_dict()) == ["down.weight", "gate.weight", "up.weight"]
    # (the judge and the agent take such a task as it is: test_agent's optimize --module)
    again = new(f"{tmp_path / 'mlp.py'}:GatedMLP", "--inputs", "[torch.randn(8, 64)]", "--out", task)
    assert again.exit_code == 2 and "exists (--overwrite replaces it)" in again.output


@pytest.mark.parametrize("args,says", [
    (["--init", "[64, 128]", "--inputs", "[torch.randn(8, 32)]"], "GatedMLP.forward on the given inputs failed"),
    (["--init", "[64]", "--inputs", "[torch.randn(8, 64)]"], "GatedMLP(*[64]) with the given inputs failed"),
    (["--init", "[64, 128]"], "needs --inputs"),
])
def test_a_file_task_that_cannot_run_says_why(tmp_path, args, says):
    (tmp_path / "mlp.py").write_text(MLP)
    done = new(f"{tmp_path / 'mlp.py'}:GatedMLP", *args, "--out", tmp_path / "task.py")
    assert done.exit_code == 2 and says in done.output, done.output
    assert not (tmp_path / "task.py").exists()


def test_other_bad_inputs_are_one_clear_line(tmp_path):
    (tmp_path / "mlp.py").write_text(MLP + "\n\ndef get_inputs():\n    return []\n")
    clash = new(f"{tmp_path / 'mlp.py'}:GatedMLP", "--inputs", "[1]", "--out", tmp_path / "t.py")
    assert clash.exit_code == 2 and "defines get_inputs itself" in clash.output
    (tmp_path / "mlp.py").write_text(MLP)
    assert "no class Nope" in new(f"{tmp_path / 'mlp.py'}:Nope", "--inputs", "[1]", "--out", tmp_path / "t.py").output
    assert "give FILE.py:CLASS" in new("--out", tmp_path / "t.py").output
    assert "no config.json" in new("--hf-model", tmp_path, "--submodule", "m", "--sample", "1",
                                   "--out", tmp_path / "t.py").output


@pytest.mark.parametrize("submodule,params", [("model.layers.0.mlp", 3), ("model.layers.1", 9)])
def test_a_submodule_of_a_transformers_model_becomes_a_task_that_reproduces_it(tiny_llama, tmp_path, submodule,
                                                                               params):
    from transformers import AutoModelForCausalLM

    task = tmp_path / "task.py"
    done = new("--hf-model", tiny_llama, "--submodule", submodule, "--sample", "1,5,9,3,7", "--out", task)
    assert done.exit_code == 0, done.output
    assert f"Model takes {params} tensors of the submodule's state dict and gives its output on the sample" \
        in done.output
    module = import_file(load_task(task).path, "made_hf_task")
    model = module.Model(*module.get_init_inputs())
    original = AutoModelForCausalLM.from_pretrained(tiny_llama).get_submodule(submodule)
    model.load_state_dict(original.state_dict(), strict=True)  # the user's weights load as they are
    assert [tuple(x.shape) for x in module.get_inputs()][0] == (1, 5, 32)
    if submodule == "model.layers.1":
        assert "past_key_values (DynamicCache) dropped" in done.output
        assert "super().__init__(_config(), 1)" in task.read_text()  # its layer index


def test_a_submodule_that_is_not_there_or_a_sample_without_a_tokenizer_says_so(tiny_llama, tmp_path):
    missing = new("--hf-model", tiny_llama, "--submodule", "model.layers.7", "--sample", "1,2", "--out",
                  tmp_path / "t.py")
    assert missing.exit_code == 2 and "has no submodule 'model.layers.7'" in missing.output
    text = new("--hf-model", tiny_llama, "--submodule", "model.layers.0.mlp", "--sample", "hello", "--out",
               tmp_path / "t.py")
    assert text.exit_code == 2 and "give --sample as token ids" in text.output
