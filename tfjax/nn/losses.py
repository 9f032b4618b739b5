"""Losses and metrics as (sum, weight) pairs.

Every metric leaves the device as a float32 sum and a float32 weight (`loss_sum`, `weight_sum`, ...)
so that it stays exact when summed over devices (`lax.psum`) and hosts; only `summarize`, on the
host, divides.

Sources:
- Label smoothing: Szegedy et al. 2016, "Rethinking the Inception Architecture for Computer
  Vision", §7; used with ε = 0.1 in Vaswani et al. 2017, "Attention Is All You Need", §5.4.
  The target class gets probability 1 - ε and every other class ε / (V - 1).
- Reporting the smoothed loss minus the entropy of the smoothed targets (so that a perfect model
  scores 0) follows the normalizing constant of the Flax `examples/wmt` loss.
"""

import functools
import math
import numbers
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

# What `jax.device_get` hands the host for a scalar metric, or a plain Python number.
HostScalar = float | int | np.number | np.ndarray

METRIC_SUM_KEYS = (
    "loss_sum",
    "nll_sum",
    "correct_sum",
    "weight_sum",
    "seq_correct_sum",
    "seq_count",
)


def _check_shape(name: str, shape: tuple[int, ...], expected: tuple[int, ...]) -> None:
    if tuple(shape) != tuple(expected):
        raise ValueError(f"{name}: expected shape {tuple(expected)}, got {tuple(shape)}")


def _smoothing_targets(label_smoothing: float, vocab_size: int) -> tuple[float, float, float]:
    """Returns (confidence, off-target probability, entropy of the smoothed target distribution)."""
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing: expected a value in [0, 1), got {label_smoothing}")
    if label_smoothing > 0.0 and vocab_size < 2:
        raise ValueError(
            f"label_smoothing={label_smoothing} needs at least 2 classes, got {vocab_size}: "
            "smoothing spreads mass over the other classes (set it to 0 or add classes)"
        )
    confidence = 1.0 - label_smoothing
    low = label_smoothing / max(vocab_size - 1, 1)
    entropy = -confidence * math.log(confidence)
    if low > 0.0:
        entropy -= (vocab_size - 1) * low * math.log(low)
    return confidence, low, entropy


def cross_entropy(
    logits: Float[Array, "B L V"],
    targets: Int[Array, "B L"],
    weights: Float[Array, "B L"],
    *,
    label_smoothing: float | jax.Array = 0.0,
) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """Weighted cross-entropy with label smoothing, summed over tokens.

    Args:
        logits: [B, L, V] any float dtype; upcast to float32 before the log-softmax.
        targets: [B, L] int32 class ids in [0, V).
        weights: [B, L] float32 per-token weights (0 for padding).
        label_smoothing: ε in [0, 1): a Python float, or a traced float32 scalar (a vectorised
            sweep's trials; checked before tracing). The target gets 1 - ε, every other
            class ε / (V - 1) (Vaswani et al. 2017 §5.4).

    Returns:
        (loss_sum, nll_sum), float32 scalars. `loss_sum` is the smoothed cross-entropy minus the
        entropy of the smoothed targets (0 for a perfect model); `nll_sum` is the plain negative
        log-likelihood of `targets` (for perplexity). Both are sums of per-token values × weights.

    Raises:
        ValueError: if ε is outside [0, 1), ε > 0 with fewer than 2 classes, or the shapes
            disagree.
    """
    B, L, V = logits.shape
    _check_shape("targets", targets.shape, (B, L))
    _check_shape("weights", weights.shape, (B, L))
    weights = weights.astype(jnp.float32)
    if not isinstance(label_smoothing, numbers.Real):  # traced: a vectorised sweep's trial
        confidence, low, entropy = _traced_smoothing_targets(label_smoothing, V)
        sums = _weighted_token_losses_traced(logits, targets, weights, confidence, low)
        return sums[0] - entropy * jnp.sum(weights), sums[1]
    confidence, low, entropy = _smoothing_targets(label_smoothing, V)
    smoothed_sum, nll_sum = _weighted_token_losses(logits, targets, weights, confidence, low)
    return smoothed_sum - entropy * jnp.sum(weights), nll_sum


def _traced_smoothing_targets(label_smoothing: jax.Array, vocab_size: int):
    """`_smoothing_targets` of a traced ε (checked on the host before it was traced)."""
    confidence = 1.0 - label_smoothing
    low = label_smoothing / max(vocab_size - 1, 1)
    entropy = -confidence * jnp.log(confidence)
    spread = (vocab_size - 1) * low * jnp.log(jnp.where(low > 0, low, 1.0))
    return confidence, low, entropy - spread


# The loss over the vocabulary is the largest elementwise work of a train step ([B, L, V] for a
# few hundred FLOPs per token elsewhere), so its derivative is written by hand: the backward pass
# is one fused pass d/dlogits = w * (g_loss * (p - q) + g_nll * (p - onehot)) over the saved
# logits and log-sum-exp, where autodiff of log_softmax + take_along_axis made a scatter into a
# [B, L, V] zero array and two more [B, L, V] passes (figures: docs/performance.md).
# It is a custom_jvp whose tangent map is linear in d_logits and d_weights, so forward mode
# (jax.jvp, jax.hessian) works and JAX's transpose of the tangent map is that fused pass; the
# weights get their true cotangent Σ g · (per-token loss).
@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def _weighted_token_losses(logits, targets, weights, confidence: float, low: float):
    """(Σ w · smoothed CE, Σ w · nll) in float32; q = low + (confidence - low) · onehot."""
    return _token_losses(logits, targets, weights, confidence, low)[0]


def _token_losses(logits, targets, weights, confidence, low):
    """The two sums, and (float32 logits, lse, per-token smoothed CE, per-token nll)."""
    z = logits.astype(jnp.float32)  # [B, L, V]
    lse = jax.nn.logsumexp(z, axis=-1)  # [B, L]
    nll = lse - jnp.take_along_axis(z, targets[..., None], axis=-1)[..., 0]  # -log p_target
    # -Σ_v q_v log p_v = (confidence - low) · nll + low · Σ_v (lse - z_v). The last sum is
    # written V · lse - Σ_v z_v: as Σ_v (lse - z_v), XLA:CPU wrote the [B, L, V] broadcast of
    # lse to memory before reducing (measurements: docs/performance.md).
    smoothed = (confidence - low) * nll
    if not isinstance(low, numbers.Real) or low > 0.0:  # traced low: always (0 adds 0)
        smoothed = smoothed + low * (z.shape[-1] * lse - jnp.sum(z, axis=-1))
    sums = (jnp.sum(smoothed * weights), jnp.sum(nll * weights))
    return sums, (z, lse, smoothed, nll)


@_weighted_token_losses.defjvp
def _token_losses_jvp(confidence, low, primals, tangents):
    logits, targets, weights = primals
    d_logits, _, d_weights = tangents  # the integer targets have no tangent
    sums, (z, lse, smoothed, nll) = _token_losses(logits, targets, weights, confidence, low)
    probs = jnp.exp(z - lse[..., None])  # [B, L, V]
    is_target = jnp.arange(z.shape[-1]) == targets[..., None]  # [B, L, V]
    # d nll = Σ_v (p_v - onehot_v) dz_v and, as q sums to 1, d(-Σ q log p) = Σ_v (p_v - q_v) dz_v.
    # Σ_v p_v dz_v is shared by both, so their cotangents add before the one [B, L, V] product.
    wdz = d_logits.astype(jnp.float32) * weights[..., None]  # [B, L, V]
    expected = jnp.sum(probs * wdz)
    at_target = jnp.sum(jnp.where(is_target, wdz, 0.0))
    d_smoothed = expected - (confidence - low) * at_target + jnp.sum(smoothed * d_weights)
    if not isinstance(low, numbers.Real) or low > 0.0:
        d_smoothed = d_smoothed - low * jnp.sum(wdz)
    d_nll = expected - at_target + jnp.sum(nll * d_weights)
    return sums, (d_smoothed, d_nll)


# The same with (traced) confidence and low as arguments that get no derivative: label
# smoothing that differs between the trials of a vectorised sweep (`tfjax.training.vectorized`).
@jax.custom_jvp
def _weighted_token_losses_traced(logits, targets, weights, confidence, low):
    return _token_losses(logits, targets, weights, confidence, low)[0]


@_weighted_token_losses_traced.defjvp
def _token_losses_traced_jvp(primals, tangents):
    logits, targets, weights, confidence, low = primals
    d_logits, _, d_weights, _, _ = tangents  # hyperparameters: no derivative
    return _token_losses_jvp(
        confidence, low, (logits, targets, weights), (d_logits, None, d_weights)
    )


# 2^126: the largest power of two whose product with a normal float32 difference (>= 2^-126)
# reaches 1, so `1 - d * _SPREAD` is 1 for d == 0 and <= 0 for every other normal difference.
_SPREAD = 2.0**126


def argmax(logits: Float[Array, "... V"], *, fast_path: bool = True) -> Int[Array, "..."]:
    """`jnp.argmax(logits, axis=-1)` as int32, the same result, without a variadic reduce.

    XLA's CPU backend runs argmax as a scalar (value, index) reduce, many times slower than a
    max over the same logits (docs/performance.md). Here each row's max m comes
    first; `hit_v = max(1 - (m - z_v) * 2^126, 0)` is then exactly 1 where z_v == m and 0 where
    z_v is below m by a normal float32 difference, so `c = Σ_v hit_v · (v + 1) - 1` is the
    index of the max when it is unique. Both passes are plain float reductions, which XLA hands
    to its fast (YNNPACK) kernels.

    The candidate is then checked: it must be an integer in [0, V) with z_c == m. A tie makes c
    larger than every tied index (so z_c < m or c >= V), and a NaN or infinite logit makes c NaN;
    if any row fails the check, the whole batch goes through `jnp.argmax` instead (`lax.cond`,
    so the check is all that runs when nothing is tied). The result is therefore always
    `jnp.argmax`'s, first index among ties included.

    That path is for XLA's CPU backend only (`lax.platform_dependent`); GPU and TPU run
    `jnp.argmax`, whose reductions they already do well.

    Args:
        logits: [..., V] any float dtype (compared in float32).
        fast_path: False runs the stock `jnp.argmax` on every platform.

    Returns:
        [...] int32 indices in [0, V).
    """
    *batch_shape, V = logits.shape
    if not fast_path or V >= 2**24 or 0 in logits.shape:  # float32 indices exact below 2^24
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    z = jax.lax.stop_gradient(logits).astype(jnp.float32).reshape(-1, V)  # [N, V]
    out = jax.lax.platform_dependent(z, cpu=_argmax_by_reductions, default=_argmax_plain)
    return out.reshape(batch_shape)


def _argmax_plain(z: Float[ArrayLike, "N V"]) -> Int[Array, " N"]:
    return jnp.argmax(z, axis=-1).astype(jnp.int32)


def _argmax_by_reductions(z: Float[ArrayLike, "N V"]) -> Int[Array, " N"]:
    """`argmax`'s CPU path on float32 [N, V] (2-D: XLA then keeps the row-broadcast of the max
    inside its fast reduction kernel)."""
    V = z.shape[-1]
    m = jnp.max(z, axis=-1, keepdims=True)  # [N, 1]
    hit = jnp.maximum(1.0 - (m - z) * jnp.float32(_SPREAD), 0.0)  # [N, V]: 1 at the max
    candidate_f = jnp.sum(hit * jnp.arange(1, V + 1, dtype=jnp.float32), axis=-1) - 1.0  # [N]
    candidate = jnp.clip(candidate_f, 0, V - 1).astype(jnp.int32)
    at_candidate = jnp.take_along_axis(z, candidate[:, None], axis=-1)[:, 0]
    unique = (candidate_f == candidate.astype(jnp.float32)) & (at_candidate == m[:, 0])
    return jax.lax.cond(jnp.all(unique), lambda: candidate, lambda: _argmax_plain(z))


def sequence_exact_match(
    predictions: Int[Array, "B L"],
    targets: Int[Array, "B L"],
    segment_ids: Int[Array, "B L"],
    weights: Int[Array, "B L"] | None = None,
) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """Counts sequences whose every scored non-padding token is predicted correctly.

    A row may hold several packed sequences with segment ids 1, 2, ...; segment 0 is padding.
    Each (row, segment id) present counts as one sequence. Static shapes only, so it jits.

    Args:
        predictions: [B, L] int32 predicted ids.
        targets: [B, L] int32 target ids.
        segment_ids: [B, L] int32 in [0, L]; 0 = padding. Ids above L are not supported.
        weights: optional [B, L]; a position with weight 0 is not scored (its prediction
            cannot make its sequence wrong), but its sequence still counts.

    Returns:
        (seq_correct_sum, seq_count), float32 scalars.

    Raises:
        ValueError: if the shapes disagree.
    """
    B, L = targets.shape
    _check_shape("predictions", predictions.shape, (B, L))
    _check_shape("segment_ids", segment_ids.shape, (B, L))
    wrong = predictions != targets
    if weights is not None:
        _check_shape("weights", weights.shape, (B, L))
        wrong = wrong & (weights > 0)
    # One bucket per (row, segment id): row b owns buckets b * (L + 1) ... b * (L + 1) + L.
    buckets = (jnp.arange(B, dtype=jnp.int32)[:, None] * (L + 1) + segment_ids).reshape(-1)  # [B*L]
    errors = wrong.astype(jnp.int32).reshape(-1)  # [B*L]
    num_segments = B * (L + 1)
    token_count = jax.ops.segment_sum(jnp.ones_like(errors), buckets, num_segments)
    error_count = jax.ops.segment_sum(errors, buckets, num_segments)
    present = token_count.reshape(B, L + 1)[:, 1:] > 0  # [B, L] segments 1..L
    correct = present & (error_count.reshape(B, L + 1)[:, 1:] == 0)  # [B, L]
    return jnp.sum(correct, dtype=jnp.float32), jnp.sum(present, dtype=jnp.float32)


def compute_metrics(
    logits: Float[Array, "B L V"],
    targets: Int[Array, "B L"],
    segment_ids: Int[Array, "B L"],
    *,
    label_smoothing: float | jax.Array = 0.0,
    loss_weights: Int[Array, "B L"] | None = None,
) -> dict[str, Array]:
    """Sequence-model metrics as float32 sums; padding (segment 0) has weight 0.

    Args:
        logits: [B, L, V] any float dtype.
        targets: [B, L] int32 target ids.
        segment_ids: [B, L] int32; 0 = padding, 1, 2, ... = packed sequences.
        label_smoothing: ε for `loss_sum` (see `cross_entropy`).
        loss_weights: optional [B, L] 0/1 weights on top of the padding mask (e.g. 0 for the
            context-only first token of an LM window); positions with weight 0 are left out
            of every metric, the exact match included.

    Returns:
        Float32 scalars keyed `loss_sum`, `nll_sum`, `correct_sum` (argmax == target),
        `weight_sum` (non-padding tokens), `seq_correct_sum` and `seq_count`
        (see `sequence_exact_match`). Divide on the host with `summarize`.
    """
    weights = (segment_ids > 0).astype(jnp.float32)  # [B, L]
    if loss_weights is not None:
        weights = weights * (loss_weights > 0)
    loss_sum, nll_sum = cross_entropy(logits, targets, weights, label_smoothing=label_smoothing)
    predictions = argmax(logits).astype(targets.dtype)  # [B, L]
    seq_correct_sum, seq_count = sequence_exact_match(
        predictions, targets, segment_ids, loss_weights
    )
    return {
        "loss_sum": loss_sum,
        "nll_sum": nll_sum,
        "correct_sum": jnp.sum((predictions == targets) * weights),
        "weight_sum": jnp.sum(weights),
        "seq_correct_sum": seq_correct_sum,
        "seq_count": seq_count,
    }


def classification_metrics(
    logits: Float[Array, "B C"],
    labels: Int[Array, " B"],  # leading space keeps pyflakes from reading B as a name
    *,
    label_smoothing: float | jax.Array = 0.0,
) -> dict[str, Array]:
    """Classification metrics with the keys of `compute_metrics`.

    Each example counts as one token and one sequence, so `accuracy` and `exact_match` agree.

    Args:
        logits: [B, C] any float dtype, C classes.
        labels: [B] int32 class ids in [0, C); a negative label marks a padding row (weight 0).
        label_smoothing: ε for `loss_sum` (see `cross_entropy`).

    Returns:
        Float32 scalars keyed as in `compute_metrics`.
    """
    # [B, 1]: one sequence per example; padding rows (label < 0) get segment 0 and no weight.
    segment_ids = (labels >= 0).astype(jnp.int32)[:, None]
    return compute_metrics(
        logits[:, None, :],
        jnp.maximum(labels, 0)[:, None],
        segment_ids,
        label_smoothing=label_smoothing,
    )


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator != 0 else float("nan")


def _exp(value: float) -> float:
    try:
        return math.exp(value)  # nan stays nan
    except OverflowError:
        return math.inf


def _scalar(key: str, value: HostScalar) -> float:
    array = np.asarray(value)
    if array.size != 1:
        raise ValueError(
            f"{key}: expected a scalar (take one replica of a psum-ed metric, or sum first), "
            f"got shape {array.shape}"
        )
    return float(array.reshape(()))


def summarize(sums: Mapping[str, HostScalar]) -> dict[str, float]:
    """Host side: turns metric sums into means. Plain numpy/Python, no jax.

    Args:
        sums: scalar metrics after `jax.device_get`, e.g. the output of `compute_metrics`
            (possibly summed over steps) plus extras such as `grad_norm` or `learning_rate`.

    Returns:
        `loss`, `nll`, `perplexity` (exp(nll)) and `accuracy` when `weight_sum` is present,
        `exact_match` when `seq_count` is present; a zero denominator gives nan. Keys outside
        the six sums pass through as floats.

    Raises:
        ValueError: if a value is not a scalar.
    """
    values = {key: _scalar(key, value) for key, value in sums.items()}
    out = {key: value for key, value in values.items() if key not in METRIC_SUM_KEYS}
    weight_sum = values.get("weight_sum")
    if weight_sum is not None:
        for name, key in (("loss", "loss_sum"), ("nll", "nll_sum"), ("accuracy", "correct_sum")):
            if key in values:
                out[name] = _ratio(values[key], weight_sum)
        if "nll" in out:
            out["perplexity"] = _exp(out["nll"])
    if "seq_count" in values and "seq_correct_sum" in values:
        out["exact_match"] = _ratio(values["seq_correct_sum"], values["seq_count"])
    return out
