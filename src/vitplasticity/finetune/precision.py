"""The arithmetic of ``finetune.precision``: fp32 (the reference code's), bf16 autocast on a
CPU or a GPU (with a warning where the CPU only emulates bf16), and tf32: fp32 storage with
the GPU's TF32 tensor-core matmuls (10 mantissa bits in the products, fp32 accumulation).
tf32 is not the reference code's numerics either; on a CPU it runs as fp32.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from contextlib import contextmanager

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


PRECISIONS = ("fp32", "bf16", "tf32")
"""The values of ``finetune.precision``."""


@contextmanager
def tf32_matmuls() -> Iterator[None]:
    """CUDA fp32 matmuls on TF32 tensor cores inside the block, the previous setting after.

    Only the CUDA matmul backend is switched (torch's new per-backend API; cuDNN's
    convolutions already default to TF32), so a CPU op in the block stays fp32.
    """
    matmul = torch.backends.cuda.matmul
    previous = matmul.fp32_precision
    matmul.fp32_precision = "tf32"
    try:
        yield
    finally:
        matmul.fp32_precision = previous


@contextmanager
def autocast(device: torch.device, precision: str) -> Iterator[None]:
    """The block computes in ``precision`` on ``device`` (CPU or GPU).

    - bf16: autocast; matmuls, convolutions and attention run in bf16, the norms in fp32,
      and the callers take the logits (and so the loss) in fp32.
    - tf32: fp32 tensors, CUDA matmuls on TF32 tensor cores; on a CPU exactly fp32.
    - fp32: nothing changes.
    """
    if precision == "bf16" and device.type == "cpu":
        _warn_emulated_cpu_bf16()
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        if precision == "tf32" and device.type == "cuda":
            with tf32_matmuls():
                yield
        else:
            yield
