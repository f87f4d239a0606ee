"""Which float precision the learner computes in, from what the hardware does natively."""

from __future__ import annotations

import torch


def bf16_native(device: torch.device) -> bool:
    """Whether ``device`` computes in bfloat16 natively (CUDA with bf16 support, CPUs with AVX512-BF16 or
    AMX); elsewhere bf16 is emulated and slower than float32."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return False


def autocast_dtype(mode: str, device: torch.device, param_dtype: torch.dtype) -> torch.dtype | None:
    """The learner's forward-pass autocast dtype (None = none).

    bf16 over fp32 weights keeps the small RL updates in fp32 master weights (and AdamW state) while the
    matmuls run in bf16; the log-softmax of the LM head stays in fp32 (``logprobs.head_logprobs``).
    ``auto`` turns it on on CUDA with native bf16 and off elsewhere, CPUs included: on AVX512-BF16 CPUs
    without AMX the packed step ran at 0.61x (a Xeon) to 1.40x (an EPYC) fp32's tokens/s, but on both
    oneDNN builds and keeps bf16 kernels for every new matmul shape, so a node's memory grew 8-20 MiB a
    round where fp32 stays flat (docs/performance.md); ``bfloat16`` still asks for it anywhere. What it
    does to the importance ratios: pi_theta / pi_old is still exactly 1 at the first update (both come
    from the same bf16 forward), but the ratio to the *sampler's* log-probs, pi_old / mu, now carries bf16
    rounding of the learner (|log ratio| below 0.05 per token on the tiny models, ``test_logprobs.py``),
    on top of the sampler's own (vLLM samples in bf16 anyway): ``tis`` truncates at C = 2 and ``icepop``
    keeps [0.5, 5], so such noise is weighted, never dropped. Tests that need on-policy ratios of exactly
    1 pin ``autocast="off"``.
    """
    if mode == "off" or param_dtype != torch.float32:
        return None
    if mode == "auto" and not (device.type == "cuda" and bf16_native(device)):
        return None
    return torch.bfloat16
