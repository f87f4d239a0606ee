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
    """The learner's forward-pass autocast dtype (None = none): bf16 over fp32 weights keeps the small RL
    updates in fp32 master weights while the matmuls run in bf16. ``auto`` turns it on for CUDA only:
    on CPUs with native bf16 it is available (``bfloat16``) but not yet measured faster, and it makes
    on-policy importance ratios differ from 1 by bf16 rounding."""
    if mode == "off" or param_dtype != torch.float32:
        return None
    if mode == "auto" and not (device.type == "cuda" and bf16_native(device)):
        return None
    return torch.bfloat16
