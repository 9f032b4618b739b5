"""Model FLOPs utilisation (MFU): model FLOPs per step, the matmul ceiling, the datasheet peak.

- `train_flops`: matmul FLOPs of one encoder-decoder train step, counted from the shape.
- `matmul_ceiling`: the FLOP/s the host reaches on a jitted `jnp.dot` of two square arrays in
  the compute dtype (`ceiling_size`: 2048 wide on CPU, 8192 on accelerators), measured.
- `datasheet_peak`: the device's dense peak FLOP/s from `PEAK_FLOPS` (None when not listed).
"""

import statistics

import jax
import jax.numpy as jnp

from experiments.bench import timing

# Datasheet dense (no sparsity) peak FLOP/s by device kind and compute dtype, for
# `mfu_vs_peak`; the first key that is a substring of `jax.Device.device_kind` wins.
# NVIDIA H100 SXM5 and H200: 989.4 TFLOP/s bf16 dense (H100 PCIe: 756); A100: 312;
# Google Cloud TPU v4: 275, v5e: 197, v5p: 459, v6e: 918 (bf16 per chip).
PEAK_FLOPS = {
    "bfloat16": (
        ("H100 PCIe", 756e12),
        ("H100", 989.4e12),
        ("H200", 989.4e12),
        ("A100", 312e12),
        ("TPU v4", 275e12),
        ("TPU v5 lite", 197e12),
        ("TPU v5e", 197e12),
        ("TPU v5", 459e12),
        ("TPU v6 lite", 918e12),
        ("TPU v6e", 918e12),
    ),
}


def train_flops(batch: int, shape: dict) -> tuple[float, str]:
    """Model FLOPs of one train step (forward + backward = 3 x forward matmul FLOPs).

    Args:
      batch: B.
      shape: a `workload.SHAPES` entry (widths, layer counts, lengths).

    Returns:
      (FLOPs, the formula as text for the JSON output).
    """
    d, f, v = shape["embed_dim"], shape["mlp_dim"], shape["vocab_size"]
    s, t = shape["source_len"], shape["target_len"]
    enc = shape["num_layers"] * (2 * s * (4 * d * d + 2 * d * f) + 4 * s * s * d)
    dec = shape["num_decoder_layers"] * (
        2 * t * (4 * d * d + 2 * d * f)
        + 2 * t * 2 * d * d
        + 2 * s * 2 * d * d
        + 4 * t * t * d
        + 4 * t * s * d
    )
    logits = 2 * t * d * v
    formula = (
        "3 * B * [Le*(2S(4D^2+2DF) + 4S^2D) + Ld*(2T(4D^2+2DF) + 2T*2D^2 + 2S*2D^2 + "
        "4T^2D + 4TSD) + 2TDV]  (matmuls only; backward = 2 x forward)"
    )
    return 3.0 * batch * (enc + dec + logits), formula


def ceiling_size(platform: str) -> int:
    """Side of the square matmul that measures the ceiling: 2048 on CPU, 8192 on accelerators."""
    return 2048 if platform == "cpu" else 8192


def matmul_ceiling(
    size: int = 2048, repeats: int = 5, dtype: str = "float32", calls: int = 1
) -> float:
    """FLOP/s of a jitted [size, size] @ [size, size] in `dtype` on the default device.

    Each timed repeat dispatches `calls` products back to back and waits for the last, so that
    on an accelerator (an 8192^3 bf16 product is about 1.5 ms on an H100) the host's dispatch
    and wait are not counted as matmul time.
    """
    a = jax.random.normal(jax.random.key(0), (size, size), jnp.dtype(dtype))
    dot = jax.jit(jnp.dot)

    def products():
        for _ in range(calls):
            out = dot(a, a)  # the previous product is freed once this one is queued
        return out

    _, times = timing.time_calls(products, repeats, warmup=2)
    return 2 * size**3 * calls / statistics.median(times)


def datasheet_peak(device_kind: str, dtype: str) -> float | None:
    """The `PEAK_FLOPS` entry of this device kind and dtype, or None if it has none."""
    for name, flops in PEAK_FLOPS.get(dtype, ()):
        if name in device_kind:
            return flops
    return None
