"""Samplers: G completions per prompt with the behaviour log-probs of the sampled tokens.

``base.Sampler`` is the interface; ``hf`` (transformers ``generate``) and ``vllm`` implement it, and
``make_sampler`` picks one from ``sampling.backend`` (``lagging`` wraps ``hf`` when ``sampling.lag_rounds``
is set).
"""

from __future__ import annotations

from swarmnode import common
from swarmnode.config import SamplingConfig
from swarmnode.sampler.base import Sampler

__all__ = ["Sampler", "make_sampler"]


def make_sampler(cfg: SamplingConfig, policy, *, seed: int = 0, log=common.log) -> Sampler:
    """Build the configured backend: ``vllm`` (or ``auto``) where vLLM is installed and supports the
    policy, else transformers. A wanted vLLM that cannot run is reported once, here, with the reason."""
    from swarmnode.sampler.hf import HFSampler

    if cfg.lag_rounds:
        from swarmnode.sampler.lagging import LaggingSampler

        return LaggingSampler(policy.model, policy.tokenizer, cfg.lag_rounds)
    if cfg.backend != "hf":
        from swarmnode.sampler import vllm

        reason = vllm.unavailable(policy.model)
        if reason is None:
            return vllm.VLLMSampler(policy.model, policy.tokenizer, cfg, seed=seed)
        log(f"sampling.backend={cfg.backend}: {reason}; sampling with transformers")
    return HFSampler(policy.model, policy.tokenizer)
