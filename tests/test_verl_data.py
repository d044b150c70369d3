"""Tasks exported as verl's RL dataset rows load with verl's own dataset class (the `train` extra)."""

import pytest

pytest.importorskip("verl", reason="the `train` extra (verl) is not installed")

from omegaconf import OmegaConf  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402

from conftest import TASKS  # noqa: E402
from cuda_agent.agent.environment import opening_messages  # noqa: E402
from cuda_agent.agent.tools import SCHEMAS  # noqa: E402
from cuda_agent.llm import with_text_tools  # noqa: E402
from cuda_agent.rl.tokens import TurnTokenizer  # noqa: E402
from cuda_agent.rl.verl_data import verl_rows, write_parquet  # noqa: E402

transformers = pytest.importorskip("transformers")


def test_exported_tasks_load_with_verls_dataset_and_overlong_prompts_are_filtered(smollm2, tmp_path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2)
    tasks = [TASKS / "affine_relu.py", TASKS / "linear_gelu.py"]
    path = write_parquet(verl_rows(tasks, "cuda"), tmp_path / "train.parquet")

    def dataset(max_prompt_length):
        config = OmegaConf.create({"max_prompt_length": max_prompt_length, "filter_overlong_prompts": True,
                                   "cache_dir": str(tmp_path / "cache"), "filter_overlong_prompts_workers": 1})
        return RLHFDataset(data_files=[str(path)], tokenizer=tokenizer, config=config)

    data = dataset(8192)
    assert len(data) == 2
    row = data[1]
    assert row["agent_name"] == "cuda_agent" and row["data_source"] == "cuda_agent"
    assert row["extra_info"]["reference"] == tasks[1].read_text() and row["extra_info"]["backend"] == "cuda"
    assert list(row["raw_prompt"]) == with_text_tools(opening_messages(tasks[1].read_text(), "cuda"), SCHEMAS)
    # the prompt verl measures is the one the model reads (the tools' descriptions too): exactly its length
    read = [len(TurnTokenizer(tokenizer, SCHEMAS).start(opening_messages(t.read_text(), "cuda")).ids) for t in tasks]
    for limit in (max(read), min(read), min(read) - 1):
        assert len(dataset(limit)) == sum(n <= limit for n in read), (limit, read)
