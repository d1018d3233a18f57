"""bf16 autocast (``finetune.precision``) on a CPU or a GPU, with a warning where the CPU
only emulates bf16.
"""

from __future__ import annotations

import functools
import logging

import torch

log = logging.getLogger(__name__)


def cpu_bf16_native() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX): only then can bf16
    autocast speed up a CPU step (large matmuls, docs/benchmarks.md); elsewhere oneDNN
    emulates bf16 and a bf16 step is usually slower than fp32."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, check, lambda: False)() for check in checks)


@functools.cache
def _warn_emulated_cpu_bf16() -> None:
    # Cached: logs once per process, not once per micro-batch.
    if not cpu_bf16_native():
        log.warning(
            "finetune.precision bf16 on a CPU without AVX512-BF16 or AMX: bf16 matmuls are "
            "emulated and may be slower than fp32 (python -m benchmarks.run prints the ratio)"
        )


def autocast(device: torch.device, precision: str) -> torch.autocast:
    """bf16 autocast on the run's device (CPU or GPU) for precision bf16, else a no-op.

    Matmuls, convolutions and attention run in bf16; autocast keeps the norms in fp32 and
    the callers take the logits (and so the loss) in fp32.
    """
    if precision == "bf16" and device.type == "cpu":
        _warn_emulated_cpu_bf16()
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
