"""The whole recipe in miniature (`cuda-agent train recipe`, issue 32): the expert's episodes on the train tasks ->
SFT on them -> RFT on the model's own positive episodes mixed with the expert's -> value pretraining (then the
critic's explained variance on the RFT model's held-out episodes, which it never trained on) -> PPO on the train
tasks, the held-out set evaluated after each model stage with the same seeds. Here the SFT data comes from
the expert (a program); the paper's RFT data came from its own warmed-up model.

An arm changes one thing (`ARMS`): `paper` lambda 0.95 for actor and critic, `no_value` no value pretraining,
`speedup` the raw-speedup reward, `no_rft` PPO from the base model (no SFT, no RFT), `single_turn` the warm-up's
one-reply loop instead of the agent loop. The controls (controls.py) run after PPO. Every step writes its own
folder under `out` and `done.json` when it ends; a rerun skips the steps that have one (and the stages resume from
their checkpoints). With a time limit the recipe stops at the first step boundary past it (a stage after the
training step that passes it, an evaluation after its batch of episodes) and `recipe.json` says where: the same
command continues.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from ..judge.pool import JudgePool
from . import checkpoints, rft
from .config import EvalConfig, PPOConfig, StageConfig
from .controls import CONTROLS, best_of, expert_records, samples_per_task
from .critic_check import critic_explained_variance
from .evaluation import evaluate, local_player
from .probe import expert_conversations
from .expert.corpus import TURNS as CORPUS_TURNS
from .expert.corpus import compose_corpus, tasks_in, write_tasks
from .expert.corpus import conversations as corpus_conversations
from .expert.episodes import SCRIPT_VERSION, SHAPES, STAGED, play_expert
from .scores import EpisodeRecord, paired_difference, summary
from .recipe_steps import Steps
from .stages import run_stage
from .step_keys import key, model_key, stage_settings, tasks_key

ARMS = ("full", "paper", "no_value", "speedup", "no_rft", "single_turn")


@dataclass
class Made:
    """How a stage's actor was made: its folder, the model it started from, whether it was supervised (its critic:
    the start's unchanged), its steps, and (a full-weight supervised stage) how to train it again."""
    folder: Path
    start: Path
    supervised: bool
    steps: int
    replay: Callable[[], None] | None = None


@dataclass
class RecipeConfig:
    arm: str = "full"
    seed: int = 0
    expert_shapes: tuple[str, ...] = SHAPES
    sft_shapes: tuple[str, ...] = ()  # the expert's shapes SFT and RFT train on (empty: every shape it played)
    sft_corpus: int = 0  # tasks composed beyond the train split whose expert first replies SFT trains on too
    # (expert/corpus.py: unjudged; no operator set of a held-out or validation task)
    sft_repeat: int = 1  # with a corpus: SFT's judged episodes (whole conversations: verdicts read and answered, a
    # failed one repaired) counted this many times in its pool beside the corpus's first replies
    sft_steps: int = 30
    sft_lora_rank: int | None = None  # SFT's LoRA rank (None: the other stages'); 0 below their rank > 0: SFT trains
    # every weight and the stages after it adapters on it (full weights do not travel: a machine without SFT's trains
    # it again from its seed, its inputs having travelled)
    rft_samples: int = 2  # episodes of the SFT model per train task, its positives kept for RFT
    rft_steps: int = 10
    value_steps: int = 5
    value_epochs: int = 8  # passes over each value-pretraining batch (the critic alone learns: no policy ratio to
    # keep near 1, and a pass costs seconds where the batch's rollouts cost minutes)
    ppo_steps: int = 20
    rollout_temperature: float | None = None  # value pretraining's and PPO's sampling temperature (None: the
    # stage's, as every other episode's): a policy that SFT made near-deterministic explores at a higher one, its
    # held-out evaluations staying at theirs
    sft_batch: int = 8  # conversations per supervised step
    sft_lr: float | None = None  # the supervised stages' (SFT, RFT, filter-and-fine-tune) learning rate; None: actor_lr
    # episodes and their limits: a turn long enough for the expert's (its first, every file written, was up to 3,658
    # SmolLM2 tokens on docs/data/expert_tasks_h200; with the register kernels its files alone are 3,186 at the
    # median of the rows tasks, 4,027 at p95, 4,353 at most), else SFT teaches replies that are cut mid-call
    stage: StageConfig = field(default_factory=lambda: StageConfig(batch=16, compact=True, max_new_tokens=4096))
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(compact=True, max_new_tokens=4096))
    controls: tuple[str, ...] = CONTROLS
    time_limit_s: float | None = None  # the whole recipe's; then it stops at a step boundary (rerun continues)

    def __post_init__(self):
        if self.arm not in ARMS:
            raise ValueError(f"unknown arm {self.arm!r} (choose from {', '.join(ARMS)})")
        if self.sft_lora_rank is not None and self.sft_lora_rank < 0:
            raise ValueError(f"--sft-lora-rank {self.sft_lora_rank}: a rank (0: every weight)")
        if self.rollout_temperature is not None and self.rollout_temperature <= 0:
            raise ValueError(f"--rollout-temperature {self.rollout_temperature}: a temperature above 0")
        if self.sft_corpus < 0:
            raise ValueError(f"--sft-corpus {self.sft_corpus}: a number of tasks (0: none)")
        if self.sft_repeat < 1:
            raise ValueError(f"--sft-repeat {self.sft_repeat}: times each episode counts (>= 1)")
        if set(self.sft_shapes) - set(self.expert_shapes):
            raise ValueError(f"--sft-shapes {','.join(self.sft_shapes)}: the expert plays only "
                             f"{','.join(self.expert_shapes)}")
        unknown = set(self.controls) - set(CONTROLS)
        if unknown:
            raise ValueError(f"unknown control {sorted(unknown)[0]!r} (choose from {', '.join(CONTROLS)})")

    def stage_config(self, stage: str, steps: int, batch: int | None = None,
                     lora_rank: int | None = None) -> StageConfig:
        """The arm's settings for one stage (`lora_rank`: in place of the stages' own)."""
        ppo = PPOConfig(lam=0.95, critic_lam=0.95) if self.arm == "paper" else self.stage.train.ppo
        train = replace(self.stage.train, ppo=ppo)
        if lora_rank is not None:
            train = replace(train, lora_rank=lora_rank)
        save_every = self.stage.save_every
        if stage == "value":
            train = replace(train, epochs=self.value_epochs)
        rl = stage != "rft" and self.rollout_temperature is not None
        temperature = self.rollout_temperature if rl else self.stage.temperature
        if stage == "rft":  # supervised: steps of about a second, checkpoints (the whole model) of several
            train = replace(train, actor_lr=self.sft_lr if self.sft_lr is not None else train.actor_lr)
            save_every = max(save_every, steps // 4)
        return replace(self.stage, stage=stage, steps=steps, seed=self.seed, batch=batch or self.stage.batch,
                       reward="speedup" if self.arm == "speedup" else self.stage.reward, train=train,
                       save_every=save_every, temperature=temperature)


def of_shapes(runs: list[str], shapes: tuple[str, ...]) -> list[str]:
    """The expert's run folders (TASK/SHAPE-K) of `shapes`; all of them when `shapes` is empty."""
    return [r for r in runs if not shapes or Path(r).name.rsplit("-", 1)[0] in shapes]


class Recipe:
    def __init__(self, config: RecipeConfig, base: Path, train: list[Path], held_out: list[Path], out: Path,
                 pool: JudgePool, device: str, log: Callable[[str], None] = print,
                 clock: Callable[[], float] = time.monotonic, reuse: list[Path] = (), validation: list[Path] = ()):
        """`reuse`: run folders (e.g. other arms of this seed) whose steps of the same key are linked, not run;
        `validation`: tasks neither trained on nor evaluated, the supervised stages' imitation probe (probe.py)."""
        self.config, self.base, self.train, self.held_out = config, Path(base), train, held_out
        self.validation = list(validation)
        shared = {p.read_text() for p in self.validation} & {p.read_text() for p in [*train, *held_out]}
        if shared:
            raise ValueError(f"{len(shared)} validation task(s) are also train or held-out tasks: the imitation probe "
                             "would not measure what the model learnt beyond its training")
        self.out, self.pool, self.device, self.log = Path(out), pool, device, log
        self.evals: dict[str, list[EpisodeRecord]] = {}
        self.notes: dict[str, str] = {}  # what a control could not do
        self.steps = Steps(self.out, reuse, config.time_limit_s, log, clock)
        self.judge = f"{pool.backend.name}/{pool.config.policy}"  # (what judged the episodes)
        self.train_key, self.held_key = tasks_key(train), tasks_key(held_out)
        self.model_keys = {self.base: model_key(self.base)}  # a model folder -> what made it (the base: its content)
        self.episodes: dict[str, list[str]] = {}  # a step -> the run folders of its episodes
        self.made: dict[Path, Made] = {}  # a stage's actor -> how it was made

    def _evaluate(self, name: str, model: Path, samples: int | None = None) -> dict:
        config = replace(self.config.eval, seed=self.config.seed, samples=samples or self.config.eval.samples)

        def run(folder: Path) -> dict:
            self._ready(model)
            player = local_player(model, config, self.pool, self.device, log=self.log,
                                  out_of_time=self.steps.out_of_time)
            return evaluate(self.held_out, folder, config, player, {"model": str(model), "stage": name}, self.log,
                            self.steps.out_of_time)["summary"]
        summary = self.steps.run(f"eval_{name}", key(f"eval_{name}", model=self.model_keys[model], eval=config,
                                                       tasks=self.held_key, judge=self.judge), run)
        self.evals[name] = [EpisodeRecord(**json.loads(line)) for line in
                            (self.out / f"eval_{name}" / "episodes.jsonl").read_text().splitlines()]
        return summary

    def _stage(self, name: str, config: StageConfig, model: Path, runs: tuple[str, ...] = (),
               corpus: list[Path] = ()) -> Path:
        """Stage `name` from `model` (`runs`: the steps whose episodes it trains on; `corpus`: tasks whose expert
        first replies it trains on too); its output actor."""
        def run(folder: Path) -> dict:
            self._ready(model, critic=True)
            timed = replace(config, time_limit_s=self.steps.left(name))
            backend = self.pool.backend.name
            probe = expert_conversations(self.validation, backend, config.compact) if config.stage == "rft" else []
            episodes = [Path(r) for step in runs for r in (of_shapes(self.episodes[step], self.config.sft_shapes)
                                                           if step == "expert" else self.episodes[step])]
            extra = [(c, None) for c in corpus_conversations(corpus, backend, config.compact)]
            if corpus:
                self.log(f"recipe: {name} trains on {len(episodes)} episode(s) and {len(extra)} corpus task(s)' first "
                         "replies and verify calls")
            history = run_stage(timed, model, self.train, folder, self.pool if config.stage != "rft" else None,
                                self.device, episodes, self.log, probe, extra, name, repeat)
            reached = checkpoints.step_of(checkpoints.latest(folder))
            if reached < config.steps:  # stopped by the time limit, checkpointed: not done
                raise TimeoutError(f"time limit reached in {name} after step {reached} of {config.steps}")
            return {"last": history[-1] if history else None, "steps": config.steps}
        shapes = {"sft_shapes": self.config.sft_shapes} if "expert" in runs and self.config.sft_shapes else {}
        if "expert" in runs:
            shapes["context_first"] = STAGED  # (the staged shapes' first replies: context, not trained on)
        if corpus:
            shapes["corpus"], shapes["corpus_turns"] = self.steps.keys["corpus"], CORPUS_TURNS
        repeat = self.config.sft_repeat if corpus else 1
        if repeat > 1:
            shapes["repeat"] = repeat
        step_key = key(name, model=self.model_keys[model], stage=stage_settings(config), tasks=self.train_key,
                       runs=[self.steps.keys[step] for step in runs], judge=self.judge, **shapes)
        self.steps.run(name, step_key, run)
        actor = self.out / name / "checkpoint" / "actor"
        supervised = config.stage == "rft"
        replay = (lambda: self._replay(name, run)) if supervised and not config.train.lora_rank else None
        self.model_keys[actor] = step_key
        self.made[actor] = Made(self.out / name, model, supervised, config.steps, replay)
        return actor

    def _replay(self, name: str, run: Callable[[Path], dict]) -> None:
        """A full-weight supervised stage done on another machine, trained again here from its seed (its inputs
        travelled; its weights did not): the same run up to the GPU's nondeterminism. Its first run's metrics are
        kept beside (`metrics.first-run.jsonl`), and each replay's last step in done.json's `replays`."""
        folder = self.out / name
        self.log(f"recipe: {name}'s weights are not on this machine (full weights do not travel): trained again "
                 "from its seed")
        for stale in [*folder.glob("checkpoint-*"), folder / checkpoints.LINK]:
            if stale.is_symlink():
                stale.unlink()
            elif not checkpoints.has_weights(stale / "actor"):  # (a replay's own checkpoint stays: it resumes)
                shutil.rmtree(stale, ignore_errors=True)
        first = folder / "metrics.first-run.jsonl"
        if not first.exists() and (folder / "metrics.jsonl").is_file():
            (folder / "metrics.jsonl").rename(first)
        last = run(folder)["last"]
        done = json.loads((folder / "done.json").read_text())
        done["replays"] = [*done.get("replays", []), last]
        (folder / "done.json").write_text(json.dumps(done, indent=2, default=str))
        loss = lambda record: f"{record['sft_loss']:.4g}" if record and "sft_loss" in record else "-"  # noqa: E731
        self.log(f"recipe: {name} trained again: last loss {loss(last)} (first run {loss(done.get('last'))})")

    def _corpus(self) -> list[Path]:
        """The SFT corpus's tasks (expert/corpus.py), composed once a run: the seed's draw, resized to the train
        tasks' input sizes, no operator set of a held-out or validation task."""
        cfg = self.config

        def run(folder: Path) -> dict:
            sources = compose_corpus(cfg.sft_corpus, cfg.seed, [p.read_text() for p in [*self.held_out,
                                                                                          *self.validation]],
                                     [p.read_text() for p in self.train])
            return {"tasks": len(write_tasks(sources, folder / "tasks"))}
        self.steps.run("corpus", key("corpus", count=cfg.sft_corpus, seed=cfg.seed, train=self.train_key,
                                     held_out=self.held_key, validation=tasks_key(self.validation)), run)
        tasks = tasks_in(self.out / "corpus" / "tasks")
        if len(tasks) != cfg.sft_corpus:
            raise FileNotFoundError(f"{self.out / 'corpus'} holds {len(tasks)} of its {cfg.sft_corpus} tasks (a run "
                                    "brought from another machine without them?): delete it to compose them again")
        return tasks

    def _ready(self, model: Path, critic: bool = False) -> None:
        """A stage's output about to be used (`critic`: by a stage, which starts from the critic beside it too),
        its weights made when its folder came from another machine: a full-weight supervised stage's trained again
        (`_replay`), an adapter's merged into its start model's, made first (checkpoints.rebuild)."""
        made = self.made.get(model)
        if made is None:
            return
        latest = checkpoints.latest(made.folder)
        if made.replay and (checkpoints.step_of(latest) < made.steps or not checkpoints.has_weights(latest / "actor")):
            made.replay()
            return
        if latest is None or checkpoints.has_weights(latest / "actor") and (
                not critic or checkpoints.has_weights(latest / "critic")):
            return
        self._ready(made.start, critic)
        checkpoints.rebuild(made.folder, made.start, critic, made.supervised, self.log)

    def run(self) -> dict:
        """The arm's steps, then the controls; `recipe.json` (also when the time limit stops it or Ctrl-C
        interrupts it: `stopped` says where, and the rerun continues)."""
        heldout: dict = {}

        def stopped(why: str) -> dict:
            return {"arm": self.config.arm, "seed": self.config.seed, "stopped": why, "heldout": heldout,
                    "config": asdict(self.config)}
        try:
            result = self._run(heldout)
        except TimeoutError as exc:
            self.log(f"recipe: {exc}: the same command continues")
            result = stopped(str(exc))
        except KeyboardInterrupt:  # (what the held-out evaluations finished is kept; then the interruption goes on)
            self._write(stopped("interrupted"))
            raise
        self._write(result)
        return result

    def _write(self, result: dict) -> None:
        (self.out / "recipe.json").write_text(json.dumps(result, indent=2, default=str))

    def _run(self, heldout: dict) -> dict:
        cfg, arm = self.config, self.config.arm
        heldout["base"] = self._evaluate("base", self.base)
        model = self.base
        if arm != "no_rft":
            expert = self.steps.run("expert", key("expert", tasks=self.train_key, shapes=cfg.expert_shapes,
                                                  compact=cfg.stage.compact, judge=self.judge, script=SCRIPT_VERSION),
                                    lambda folder: {"runs": [e.run_dir for e in play_expert(
                                        self.pool, self.train, folder, cfg.expert_shapes, parallel=self.pool.workers,
                                        log=self.log, compact=cfg.stage.compact, out_of_time=self.steps.out_of_time,
                                        deadline=time.monotonic() + self.steps.left("expert"))[0]]})
            self.episodes["expert"] = expert["runs"]
            model = self._stage("sft", cfg.stage_config("rft", cfg.sft_steps, cfg.sft_batch, cfg.sft_lora_rank), model,
                                ("expert",), self._corpus() if cfg.sft_corpus else ())
            heldout["sft"] = self._evaluate("sft", model)
            self._sample("rft_samples", model, cfg.rft_samples, 1)
            model = self._stage("rft", cfg.stage_config("rft", cfg.rft_steps, cfg.sft_batch), model,
                                ("expert", "rft_samples"))
            heldout["rft"] = self._evaluate("rft", model)
        critic = None
        if arm != "no_value":
            model = self._stage("value", cfg.stage_config("value", cfg.value_steps), model)
            critic = self._check_critic(model)
        start = model  # what PPO starts from: the controls start there too
        ppo_stage = "warmup" if arm == "single_turn" else "agentic"
        model = self._stage("ppo", cfg.stage_config(ppo_stage, cfg.ppo_steps), model)
        heldout["ppo"] = self._evaluate("ppo", model)
        controls = self._controls(start)
        before = "sft" if "sft" in self.evals else "base"
        boot = cfg.eval.bootstrap
        differences = {f"ppo_vs_{name}": {metric: paired_difference(self.evals["ppo"], records, metric, boot, cfg.seed)
                                          for metric in ("mean_reward", "pass_rate")}
                       for name, records in [(before, self.evals[before]), *controls.items()]}
        return {"arm": arm, "seed": cfg.seed, "heldout": heldout, "critic_on_heldout": critic, **differences,
                "controls": {name: summary(records, boot, cfg.seed) for name, records in controls.items()},
                "notes": self.notes, "config": asdict(cfg)}

    def _check_critic(self, model: Path) -> dict:
        """The value stage's critic on the held-out episodes of the policy it was trained for (never trained on)."""
        held = "rft" if "rft" in self.evals else "base"

        def run(folder: Path) -> dict:
            self._ready(model, critic=True)
            return critic_explained_variance(model.parent, [Path(r.run_dir) for r in self.evals[held]],
                                             self.config.stage.compact, self.device)
        return self.steps.run("value_check", key("value_check", critic=self.model_keys[model],
                                                 episodes=self.steps.keys[f"eval_{held}"]), run)

    def _controls(self, start: Path) -> dict[str, list[EpisodeRecord]]:
        """Each control's held-out records (one per task for the best-of rows); controls.py says what each is."""
        cfg, out = self.config, {}
        k = samples_per_task(cfg.ppo_steps, cfg.stage.batch, len(self.train))
        if "best_of_k" in cfg.controls:
            self._evaluate(f"best_of_{k}", start, samples=k)
            out["best_of_k"] = best_of(self.evals[f"best_of_{k}"])
        if "filter_finetune" in cfg.controls:
            samples = self._sample("fft_samples", start, k, 2, keep=True)
            runs, kept = samples["runs"], samples["kept"]
            tuned = start
            if kept:
                tuned = self._stage("fft", cfg.stage_config("rft", cfg.rft_steps, cfg.sft_batch), start,
                                    ("fft_samples",))
            else:  # no episode of its own passes the filter: nothing to fine-tune on
                self.notes["filter_finetune"] = (f"none of its {len(runs)} episodes passes the RFT filter: its row "
                                                 "is the start model's")
                self.log(f"recipe: filter-and-fine-tune: {self.notes['filter_finetune']}")
            self._evaluate("fft", tuned)
            out["filter_finetune"] = self.evals["fft"]
        if "expert" in cfg.controls:
            rows = self.steps.run(
                "expert_heldout", key("expert_heldout", tasks=self.held_key, seed=cfg.seed, judge=self.judge),
                lambda folder: {name: [asdict(r) for r in records] for name, records
                                in expert_records(self.pool, self.held_out, folder, cfg.seed).items()})
            out.update({name: [EpisodeRecord(**r) for r in records] for name, records in rows.items()})
        return out

    def _sample(self, name: str, model: Path, samples: int, offset: int, keep: bool = False) -> dict:
        """The model's own episodes on the train tasks (`runs`; with `keep`, how many the RFT filter keeps)."""
        config = replace(self.config.eval, samples=samples, seed=self.config.seed + offset)

        def run(folder: Path) -> dict:
            self._ready(model)
            evaluate(self.train, folder, config, local_player(model, config, self.pool, self.device, log=self.log,
                                                              out_of_time=self.steps.out_of_time),
                     {"model": str(model), "stage": folder.name}, self.log, self.steps.out_of_time)
            runs = [json.loads(line)["run_dir"] for line in (folder / "episodes.jsonl").read_text().splitlines()]
            if not keep:
                return {"runs": runs}
            return {"runs": runs, "kept": rft.export([Path(r) for r in runs], folder / "rft", rft.RFTFilter())["kept"]}
        result = self.steps.run(name, key(name, model=self.model_keys[model], eval=config, tasks=self.train_key,
                                          judge=self.judge), run)
        self.episodes[name] = result["runs"]
        return result
