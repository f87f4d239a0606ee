"""vLLM backend: a vLLM engine in the trainer's own process, whose weights are replaced in place.

Why colocated and in-process: the learner and the engine share the machine, and an in-process engine
takes the new weights as tensors straight from the trainer's model (``reload_weights`` on the worker,
through ``collective_rpc``) -- no restart, no disk round trip. That needs vLLM's engine core in this
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``); otherwise the weights would have to be pickled to it.

The engine is built from the policy's config and tokenizer only (``load_format="dummy"``) and gets its
weights from ``sync_weights``, so every model source (embedded, tiny, local folder, a resumed
checkpoint) goes through the one path that also runs after every update.

Sampling is plain temperature sampling (no top-k/top-p) and the log-probs are vLLM's *processed*
log-probs, i.e. at the sampling temperature: the same behaviour distribution the transformers backend
records and the learner recomputes. The engine samples in ``sampling.vllm_dtype`` (bf16 where the
hardware has it), so its log-probs differ from the fp32 learner's by rounding; the off-policy
correction of local data (``offpolicy.local``) absorbs that.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import time
from collections.abc import Iterator, Sequence

import torch

from swarmnode.config import SamplingConfig
from swarmnode.learn.precision import bf16_native
from swarmnode.rollouts import Completion
from swarmnode.sampler.base import Sampler


def vllm_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto`` = bfloat16 where the hardware computes in it natively, else float32."""
    if name == "auto":
        return torch.bfloat16 if bf16_native(device) else torch.float32
    return getattr(torch, name)


def unavailable(model: torch.nn.Module) -> str | None:
    """Why a vLLM engine cannot sample for ``model`` here (None = it can), checked before building one."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (to install it, see 'Faster sampling with vLLM' in the README)"
    if hasattr(model, "peft_config"):
        return "the vLLM backend does not take LoRA adapters (model.lora) yet"
    try:
        from vllm.platforms import current_platform
    except ImportError as exc:
        return f"vLLM is installed but does not import ({exc})"
    device = next(model.parameters()).device
    if current_platform.device_type != device.type:
        return f"this vLLM build runs on {current_platform.device_type}, the policy is on {device.type}"
    if device.type == "cpu":
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        config = model.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        supported = CPUAttentionBackend.get_supported_head_sizes()
        if head_dim not in supported:
            return f"vLLM's CPU attention has no kernel for head_dim {head_dim} (it has {supported})"
    return None


def engine_args(cfg: SamplingConfig, folder: str, dtype: torch.dtype, seed: int) -> dict:
    """The ``vllm.LLM`` arguments for ``cfg``: config and tokenizer from ``folder``, dummy weights.

    Prefix caching (``sampling.vllm_prefix_caching``, on by default): a round asks for G samples of each
    prompt (one request with n = G), and every prompt starts with the same system prompt and worked
    example; with the cache, each distinct prompt block's KV is computed once and shared by the G
    samples and the other questions, instead of being prefilled per sample. Cached blocks are keyed by
    token ids, so they are correct only for the weights they were computed with: ``sync_weights``
    resets the cache after every update. Not measured yet on this backend (vLLM is not installed on
    the machines this was written on); the sampling benchmark (``bench.py sample``) measures it.
    """
    return dict(
        model=folder,
        load_format="dummy",
        dtype=dtype,
        seed=seed,
        logprobs_mode="processed_logprobs",  # at the sampling temperature
        generation_config="vllm",  # ignore the model's default sampling settings
        kv_cache_memory_bytes=int(cfg.vllm_kv_cache_gib * 2**30),
        enforce_eager=cfg.vllm_enforce_eager,
        enable_prefix_caching=cfg.vllm_prefix_caching,
    )


class VLLMSampler(Sampler):
    name = "vllm"

    def __init__(self, model: torch.nn.Module, tokenizer, cfg: SamplingConfig, *, seed: int = 0):
        device = next(model.parameters()).device
        self.model = model
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.eos_token_id
        self.dtype = vllm_dtype(cfg.vllm_dtype, device)
        self.prefix_caching = cfg.vllm_prefix_caching
        # In-process engine core (see the module docstring). vLLM's CPU worker otherwise drops torch to
        # one thread for the whole process, which would also slow the learner: an explicit
        # OMP_NUM_THREADS keeps the thread count the node chose.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its INFO lines would drown the round log
        from vllm import LLM

        # Only the config and the tokenizer: the engine's weights come from sync_weights below.
        self._folder = tempfile.TemporaryDirectory(prefix="swarmnode-vllm-")
        model.config.save_pretrained(self._folder.name)
        tokenizer.save_pretrained(self._folder.name)
        self.engine = LLM(**engine_args(cfg, self._folder.name, self.dtype, seed))
        self.sync_weights()

    def sample(
        self, prompts: Sequence[Sequence[int]], n: int, *, max_new_tokens: int, temperature: float, seed: int
    ) -> list[list[Completion]]:
        from vllm import SamplingParams

        # ``seed`` is not passed on: per-request seeds fail on vLLM's CPU backend (0.32: "CPU Generator
        # does not use offset"); the engine's own stream, seeded at start, drives every round.
        params = SamplingParams(
            n=n,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            max_tokens=max_new_tokens,
            logprobs=0,  # the sampled token's own log-prob only
            stop_token_ids=[self.eos_id],
            detokenize=False,
        )
        outputs = self.engine.generate(
            [{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False
        )
        return [[self._completion(out) for out in request.outputs] for request in outputs]

    def _completion(self, out) -> Completion:
        ids = tuple(out.token_ids)
        logprobs = tuple(step[token].logprob for step, token in zip(out.logprobs, ids, strict=True))
        return Completion(
            text=self.tokenizer.decode(ids, skip_special_tokens=True),
            token_ids=ids,
            logprobs=logprobs,
            finished=out.finish_reason == "stop",
        )

    @torch.no_grad()
    def sync_weights(self) -> float:
        """Copy the trainer's current weights into the running engine (in place, in memory)."""
        start = time.perf_counter()
        self.engine.collective_rpc("reload_weights", kwargs={"weights_iterator": self._weights()})
        if self.prefix_caching:
            self.engine.reset_prefix_cache()  # cached KV belongs to the weights it was computed with
        return time.perf_counter() - start

    def _weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The model's tensors under their Hugging Face names, in the engine's dtype (converted here
        once rather than by vLLM per tensor, which warns about every one)."""
        for name, tensor in self.model.state_dict().items():
            yield name, tensor.to(self.dtype)
