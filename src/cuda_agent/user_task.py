"""Reference tasks from a user's own module (`cuda-agent task new`, issue 34): the block of their model they want a
kernel for, written in KernelBench format so that the judge, `optimize` and `export` take it as is.

- From a file: `FILE.py:Class` with `--init` and `--inputs` (Python expressions, evaluated in the file's namespace:
  the constructor's arguments and one sample of `forward`'s). The task is the file's source, unchanged, then
  `class Model(Class)` and the two functions.
- From a transformers model folder: `--hf-model DIR --submodule NAME --sample TEXT`: the model runs once on the
  sample and a forward pre-hook records what the submodule is called with; the task builds the submodule's class
  from the model's config (constructors taking `config` and, where they have one, `layer_idx`), and `get_inputs()`
  makes tensors of the recorded shapes and dtypes (integer tensors up to 4,096 values as recorded, e.g. position
  ids; floating ones random; a cache argument is dropped: the task is one forward without one).

Either way `Model` keeps the class's parameter names, so the user's state dict loads into it and into what
`export` makes of the kernel. The task is checked before it is written: it imports, builds, and (from a model)
takes the submodule's state dict strictly and gives its outputs on the recorded inputs.
"""

from __future__ import annotations

import inspect
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .task import import_file

TASK_NAMES = ("Model", "get_inputs", "get_init_inputs")
LITERAL_INTS = 4096  # integer inputs up to this many values are written as recorded


class UserTaskError(ValueError):
    """The module, its arguments or the submodule cannot make a task; the message says which."""


@dataclass
class Made:
    source: str
    class_name: str  # the module's class (what the task's Model subclasses)
    notes: list[str] = field(default_factory=list)


def from_file(path: Path, class_name: str, init: str, inputs: str) -> Made:
    """A task whose `Model` is `class_name` of the file at `path`."""
    source = Path(path).read_text()
    if f"\nclass {class_name}(" not in f"\n{source}" and f"\nclass {class_name}:" not in f"\n{source}":
        raise UserTaskError(f"{path} has no class {class_name}")
    clashes = [name for name in TASK_NAMES if name != class_name and f"\n{_defines(name)}" in f"\n{source}"]
    if clashes:
        raise UserTaskError(f"{path} defines {', '.join(clashes)} itself: rename it, or point at a task file")
    head = "" if class_name == "Model" else \
        f"\n\nclass Model({class_name}):  # unchanged: its parameter names are the state dict's\n    pass\n"
    task = (f"{source.rstrip()}\n\n\n# ---- cuda-agent task new {Path(path).name}:{class_name} ----{head}\n\n"
            f"def get_init_inputs():\n    return list({init})\n\n\ndef get_inputs():\n    return list({inputs})\n")
    made = Made(task, class_name)
    module = _imported(task, path.parent)
    model, args = _built(module, f"{class_name}(*{init})")
    try:
        with torch.no_grad():
            out = model(*args)
    except Exception as exc:
        raise UserTaskError(f"{class_name}.forward on the given inputs failed: {type(exc).__name__}: {exc}") from exc
    made.notes.append(f"Model = {class_name}({_describe(module.get_init_inputs())}); forward on "
                      f"{_describe(args)} gives {_describe([out])}")
    return made


def from_hf(model_dir: Path, submodule: str, sample: str) -> Made:
    """A task whose `Model` is the class of `submodule` of the transformers model in `model_dir`, called with what it
    was called with on `sample` (text, or comma-separated token ids for a folder without a tokenizer)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    try:
        target = model.get_submodule(submodule)
    except AttributeError as exc:
        names = [n for n, _ in model.named_modules() if n.count(".") <= 3][:12]
        raise UserTaskError(f"{model_dir} has no submodule {submodule!r} (e.g. {', '.join(names)})") from exc
    seen: dict[str, Any] = {}
    handle = target.register_forward_pre_hook(lambda m, args, kwargs: seen.setdefault("call", (args, kwargs)),
                                              with_kwargs=True)
    with torch.no_grad():
        model(sample_ids(model_dir, sample))
    handle.remove()
    if "call" not in seen:
        raise UserTaskError(f"{submodule} was not called on the sample")
    args, kwargs = seen["call"]
    cls, config = type(target), model.config
    made = Made("", cls.__name__)
    params, call, inputs = _forward_plan(args, kwargs, made.notes, _positional_names(cls, len(args)))
    construct = _constructor(cls, target)
    made.source = "\n".join([
        f'"""{submodule} of {Path(model_dir).name} ({cls.__name__}) as a task: cuda-agent task new --hf-model."""',
        "import json", "", "import torch", f"from {type(config).__module__} import {type(config).__name__}",
        f"from {cls.__module__} import {cls.__name__}", "",
        f"CONFIG = json.loads(r'''{json.dumps(config.to_dict(), default=str)}''')",
        f"ATTENTION = {getattr(config, '_attn_implementation', None)!r}  # the model's attention implementation", "",
        "", f"def _config() -> {type(config).__name__}:",
        f"    config = {type(config).__name__}.from_dict(CONFIG)",
        "    config._attn_implementation = ATTENTION",
        "    return config", "", "",
        f"class Model({cls.__name__}):  # its parameter names are {submodule}'s",
        "    def __init__(self):",
        f"        super().__init__(_config(){construct})", "",
        f"    def forward(self, {', '.join(params)}):",
        f"        return super().forward({call})", "", "",
        "def get_init_inputs():", "    return []", "", "",
        "def get_inputs():", f"    return [{', '.join(inputs)}]", ""])
    _check_against(made, target, args, kwargs, model_dir)
    return made


def _defines(name: str) -> str:
    return f"class {name}" if name == "Model" else f"def {name}"


def _imported(source: str, folder: Path):
    """The task imported as a module (its folder on the path, for the file's own imports)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "user_task.py"
        path.write_text(source)
        try:
            return import_file(path, "cuda_agent_user_task")
        except Exception as exc:
            raise UserTaskError(f"the task does not import: {type(exc).__name__}: {exc}") from exc


def _built(module, what: str):
    try:
        model = module.Model(*module.get_init_inputs()).eval()
        return model, module.get_inputs()
    except Exception as exc:
        raise UserTaskError(f"{what} with the given inputs failed: {type(exc).__name__}: {exc}") from exc


def sample_ids(model_dir: Path, sample: str) -> torch.Tensor:
    """The sample as token ids: text through the folder's tokenizer, or comma-separated ids without one."""
    if (Path(model_dir) / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(model_dir)(sample, return_tensors="pt")["input_ids"]
    try:
        return torch.tensor([[int(x) for x in sample.split(",")]])
    except ValueError as exc:
        raise UserTaskError(f"{model_dir} has no tokenizer: give --sample as token ids, e.g. '1,2,3'") from exc


def _tensor_expr(x: torch.Tensor) -> str:
    shape = tuple(x.shape)
    if x.is_floating_point():
        return f"torch.randn({shape}, dtype={x.dtype})"
    if x.dtype == torch.bool or x.numel() <= LITERAL_INTS:
        return f"torch.tensor({x.tolist()}, dtype={x.dtype})"
    return f"torch.randint({int(x.min())}, {int(x.max()) + 1}, {shape}, dtype={x.dtype})"


def _positional_names(cls: type, count: int) -> list[str]:
    """The names of the class's `forward` parameters that took the recorded positional arguments (so that the
    task's `forward` reads as the class's: `kernels.kernelize` compares them)."""
    names = [p.name for p in list(inspect.signature(cls.forward).parameters.values())[1:]
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return names[:count] + [f"arg{i}" for i in range(len(names), count)]


def _forward_plan(args: tuple, kwargs: dict, notes: list[str], positional: list[str]
                  ) -> tuple[list[str], str, list[str]]:
    """`forward`'s parameters, the call to the class's own forward and `get_inputs()`'s expressions."""
    params, call, inputs = [], [], []
    named = [(positional[i], value, None) for i, value in enumerate(args)] + [(k, v, k) for k, v in kwargs.items()]
    for name, value, keyword in named:
        prefix = f"{keyword}=" if keyword else ""
        if isinstance(value, torch.Tensor):
            params.append(name)
            inputs.append(_tensor_expr(value))
            call.append(f"{prefix}{name}")
        elif isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value):
            parts = [f"{name}_{i}" for i in range(len(value))]
            params += parts
            inputs += [_tensor_expr(v) for v in value]
            call.append(f"{prefix}({', '.join(parts)},)")
        elif value is None or isinstance(value, (bool, int, float, str)):
            call.append(f"{prefix}{value!r}")
        elif keyword:
            notes.append(f"{keyword} ({type(value).__name__}) dropped: the task is one forward without it")
        else:
            raise UserTaskError(f"positional argument {name} is a {type(value).__name__}: not a tensor")
    return params, ", ".join(call), inputs


def _constructor(cls: type, instance: torch.nn.Module) -> str:
    """The constructor's arguments after the config: `, layer_idx` where it takes one."""
    names = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    if not names or names[0] != "config" or any(n not in ("config", "layer_idx") for n in names
                                                  if inspect.signature(cls.__init__).parameters[n].default
                                                  is inspect.Parameter.empty):
        raise UserTaskError(f"{cls.__name__}({', '.join(names)}): cannot tell how to build it from the model's "
                            "config; write a file that builds it and use FILE.py:Class with --init")
    if "layer_idx" not in names:
        return ""
    found = [m.layer_idx for m in instance.modules() if isinstance(getattr(m, "layer_idx", None), int)]
    if not found:
        raise UserTaskError(f"{cls.__name__} takes a layer_idx and none of its modules says which it is")
    return f", {found[0]}"


def _check_against(made: Made, target: torch.nn.Module, args: tuple, kwargs: dict, model_dir: Path) -> None:
    """The task takes the submodule's state dict strictly and gives its outputs on the recorded inputs."""
    module = _imported(made.source, Path(model_dir))
    model, _ = _built(module, "Model()")
    try:
        model.load_state_dict(target.state_dict(), strict=True)
    except RuntimeError as exc:
        raise UserTaskError(f"the task's Model does not take the submodule's state dict: {exc}") from exc
    recorded: list = []
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor):
            recorded.append(value)
        elif isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value):
            recorded += list(value)
    with torch.no_grad():
        ours = model(*recorded)
        theirs = target(*args, **{k: v for k, v in kwargs.items() if not _dropped(v)})
    first = lambda out: out[0] if isinstance(out, (tuple, list)) else out  # noqa: E731
    if not torch.allclose(first(ours), first(theirs), atol=1e-5, rtol=1e-5):
        raise UserTaskError("the task's Model does not reproduce the submodule's output on the sample")
    made.notes.append(f"Model takes {sum(1 for _ in target.state_dict())} tensors of the submodule's state dict and "
                      f"gives its output on the sample ({_describe([first(theirs)])}); inputs "
                      f"{_describe(recorded)}")


def _dropped(value: Any) -> bool:
    return not (value is None or isinstance(value, (torch.Tensor, tuple, list, bool, int, float, str)))


def _describe(values: list) -> str:
    return ", ".join(f"{tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}" if isinstance(v, torch.Tensor)
                     else repr(v) for v in values) or "nothing"
