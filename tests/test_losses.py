"""Tests for tfjax/nn/losses.py against numpy references written out here."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfjax.nn import losses


def _log_softmax(x):
    x = np.asarray(x, np.float64)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _reference_cross_entropy(logits, targets, weights, eps):
    """Smoothed CE minus the entropy of the smoothed targets, and the plain NLL, summed."""
    V = logits.shape[-1]
    log_probs = _log_softmax(logits)
    q = np.full(log_probs.shape, eps / (V - 1))
    np.put_along_axis(q, targets[..., None], 1.0 - eps, axis=-1)
    q_log_q = np.where(q > 0, q * np.log(np.where(q > 0, q, 1.0)), 0.0)
    loss = -(q * log_probs).sum(-1) + q_log_q.sum(-1)
    nll = -np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    return (loss * weights).sum(), (nll * weights).sum()


@pytest.fixture
def batch():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 5, 7)).astype(np.float32) * 3
    targets = rng.integers(0, 7, size=(2, 5)).astype(np.int32)
    weights = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.float32)
    return logits, targets, weights


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_cross_entropy_matches_numpy_reference(batch, eps):
    logits, targets, weights = batch
    loss_sum, nll_sum = losses.cross_entropy(
        jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights), label_smoothing=eps
    )
    ref_loss, ref_nll = _reference_cross_entropy(logits, targets, weights, eps)
    assert loss_sum.dtype == jnp.float32 and nll_sum.dtype == jnp.float32
    np.testing.assert_allclose(loss_sum, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(nll_sum, ref_nll, rtol=1e-5)


@pytest.mark.parametrize("offset", [-300.0, 300.0])
def test_smoothed_loss_with_large_logits_and_a_wide_vocabulary(offset):
    # The smoothing term is computed as V * lse - sum(z); far from zero both are large, and
    # the loss must still agree with the float64 reference (shift invariance of the softmax).
    rng = np.random.default_rng(4)
    logits = (rng.normal(size=(3, 7, 5000)) * 4.0 + offset).astype(np.float32)
    targets = rng.integers(0, 5000, size=(3, 7))
    weights = np.ones((3, 7), np.float32)
    loss_sum, nll_sum = jax.jit(functools.partial(losses.cross_entropy, label_smoothing=0.1))(
        logits, targets, weights
    )
    ref_loss, ref_nll = _reference_cross_entropy(logits, targets, weights, 0.1)
    np.testing.assert_allclose(loss_sum, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(nll_sum, ref_nll, rtol=1e-5)


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_cross_entropy_gradient_is_p_minus_q(batch, eps, dtype):
    # The hand-written backward against the formula written out here and against autodiff of a
    # plain log-softmax loss; both outputs carry cotangents (2 · loss + 3 · nll).
    logits, targets, weights = batch
    V = logits.shape[-1]

    def objective(z, ce):
        loss_sum, nll_sum = ce(z, jnp.asarray(targets), jnp.asarray(weights), label_smoothing=eps)
        return 2.0 * loss_sum + 3.0 * nll_sum

    def plain(z, t, w, label_smoothing):
        log_p = jax.nn.log_softmax(z.astype(jnp.float32))
        q = jax.nn.one_hot(t, V) * (1 - eps - eps / (V - 1)) + eps / (V - 1)
        nll = -jnp.sum(jax.nn.one_hot(t, V) * log_p, axis=-1)
        return jnp.sum(-jnp.sum(q * log_p, -1) * w), jnp.sum(nll * w)

    z = jnp.asarray(logits, dtype)
    grad = jax.grad(objective)(z, losses.cross_entropy)
    assert grad.dtype == dtype
    p = np.exp(_log_softmax(np.asarray(z, np.float32)))
    q = np.full(p.shape, eps / (V - 1))
    np.put_along_axis(q, targets[..., None], 1.0 - eps, axis=-1)
    onehot = np.zeros(p.shape)
    np.put_along_axis(onehot, targets[..., None], 1.0, axis=-1)
    expected = (2.0 * (p - q) + 3.0 * (p - onehot)) * weights[..., None]
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    np.testing.assert_allclose(np.asarray(grad, np.float32), expected, atol=tol)
    np.testing.assert_allclose(grad, jax.grad(objective)(z, plain), atol=tol)


def _plain_cross_entropy(z, t, w, label_smoothing):
    """Autodiff reference: smoothed CE minus its entropy, and NLL, with no custom derivative."""
    V = z.shape[-1]
    eps = label_smoothing
    log_p = jax.nn.log_softmax(z.astype(jnp.float32))
    onehot = jax.nn.one_hot(t, V)
    q = onehot * (1 - eps - eps / (V - 1)) + eps / (V - 1)
    q_log_q = jnp.sum(jnp.where(q > 0, q * jnp.log(jnp.where(q > 0, q, 1.0)), 0.0), -1)
    loss = -jnp.sum(q * log_p, -1) + q_log_q
    return jnp.sum(loss * w), jnp.sum(-jnp.sum(onehot * log_p, -1) * w)


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_cross_entropy_weight_gradient_equals_autodiff(eps):
    # The shape (1, 3, 5): d loss / d weights is each token's loss, not a constant.
    rng = np.random.default_rng(5)
    z = jnp.asarray(rng.normal(size=(1, 3, 5)) * 2, jnp.float32)
    t = jnp.asarray([[0, 3, 1]], jnp.int32)
    w = jnp.asarray([[1.0, 0.5, 2.0]], jnp.float32)

    def objective(ce, z, w):
        loss_sum, nll_sum = ce(z, t, w, label_smoothing=eps)
        return 2.0 * loss_sum + 3.0 * nll_sum

    got = jax.grad(functools.partial(objective, losses.cross_entropy), argnums=(0, 1))(z, w)
    want = jax.grad(functools.partial(objective, _plain_cross_entropy), argnums=(0, 1))(z, w)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    # Written out: d/dw_i (2 · loss_i + 3 · nll_i) w_i = 2 · loss_i + 3 · nll_i.
    log_p = _log_softmax(np.asarray(z))[0]
    nll = -log_p[np.arange(3), [0, 3, 1]]
    per_token_loss = np.asarray(
        [_plain_cross_entropy(z, t, jnp.eye(3)[i][None], eps)[0] for i in range(3)]
    )
    np.testing.assert_allclose(got[1][0], 2.0 * per_token_loss + 3.0 * nll, rtol=1e-5)


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_forward_mode_through_the_loss_equals_plain_autodiff(batch, eps):
    logits, targets, weights = (jnp.asarray(a) for a in batch)
    dz = jnp.cos(jnp.arange(logits.size, dtype=jnp.float32)).reshape(logits.shape)
    dw = jnp.sin(jnp.arange(weights.size, dtype=jnp.float32)).reshape(weights.shape)

    def objective(ce, z, w):
        loss_sum, nll_sum = ce(z, targets, w, label_smoothing=eps)
        return 2.0 * loss_sum + 3.0 * nll_sum

    ours = functools.partial(objective, losses.cross_entropy)
    plain = functools.partial(objective, _plain_cross_entropy)
    got = jax.jvp(ours, (logits, weights), (dz, dw))
    want = jax.jvp(plain, (logits, weights), (dz, dw))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    # A Hessian-vector product in the logits, and the full Hessian of one token's logits.
    def hvp(f):
        return jax.jvp(jax.grad(f), (logits, weights), (dz, dw))[1]

    np.testing.assert_allclose(hvp(ours), hvp(plain), rtol=1e-4, atol=1e-5)

    def one(f):
        return lambda z: f(logits.at[0, 0].set(z), weights)

    np.testing.assert_allclose(
        jax.hessian(one(ours))(logits[0, 0]), jax.hessian(one(plain))(logits[0, 0]), atol=1e-5
    )


def test_label_smoothing_needs_two_classes():
    z, t, w = jnp.zeros((1, 2, 1)), jnp.zeros((1, 2), jnp.int32), jnp.ones((1, 2))
    with pytest.raises(ValueError, match="at least 2 classes"):
        losses.cross_entropy(z, t, w, label_smoothing=0.1)
    # Without smoothing a single class is certain: zero loss, not a negative one.
    assert losses.cross_entropy(z, t, w)[0] == 0.0


def test_smoothed_loss_includes_entropy_offset(batch):
    # With smoothing, loss + weight_sum · H(q) is the raw smoothed cross-entropy -Σ q log p.
    logits, targets, weights = batch
    eps, V = 0.1, logits.shape[-1]
    loss_sum, _ = losses.cross_entropy(
        jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights), label_smoothing=eps
    )
    entropy = -(1 - eps) * math.log(1 - eps) - eps * math.log(eps / (V - 1))
    log_probs = _log_softmax(logits)
    raw = -(1 - eps) * np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
    raw -= (
        eps
        / (V - 1)
        * (log_probs.sum(-1) - np.take_along_axis(log_probs, targets[..., None], -1)[..., 0])
    )
    np.testing.assert_allclose(loss_sum + weights.sum() * entropy, (raw * weights).sum(), rtol=1e-5)


def test_perfect_logits_give_zero_loss():
    targets = jnp.array([[0, 3, 2]], jnp.int32)
    logits = 100.0 * jax.nn.one_hot(targets, 4)  # [1, 3, 4]
    loss_sum, nll_sum = losses.cross_entropy(logits, targets, jnp.ones((1, 3)))
    assert abs(float(loss_sum)) < 1e-6
    assert abs(float(nll_sum)) < 1e-6


def test_smoothed_loss_is_zero_at_the_smoothed_target():
    # Logits equal to log q reproduce q exactly, the minimum of the smoothed loss.
    eps, V = 0.1, 4
    targets = jnp.array([[1, 2]], jnp.int32)
    q = jnp.where(jax.nn.one_hot(targets, V) > 0, 1 - eps, eps / (V - 1))
    loss_sum, nll_sum = losses.cross_entropy(
        jnp.log(q), targets, jnp.ones((1, 2)), label_smoothing=eps
    )
    assert abs(float(loss_sum)) < 1e-5
    np.testing.assert_allclose(nll_sum, -2 * math.log(1 - eps), rtol=1e-5)


def test_weights_zero_out_padded_tokens(batch):
    logits, targets, weights = batch
    garbage = logits.copy()
    garbage[0, 3:] = 1e4 * np.sign(np.arange(7) - 3)  # padded positions (weight 0) change wildly
    for eps in (0.0, 0.1):
        clean = losses.cross_entropy(
            *map(jnp.asarray, (logits, targets, weights)), label_smoothing=eps
        )
        dirty = losses.cross_entropy(
            *map(jnp.asarray, (garbage, targets, weights)), label_smoothing=eps
        )
        np.testing.assert_allclose(clean, dirty, rtol=1e-6)


def test_cross_entropy_upcasts_bfloat16(batch):
    logits, targets, weights = batch
    loss_sum, nll_sum = losses.cross_entropy(
        jnp.asarray(logits, jnp.bfloat16), jnp.asarray(targets), jnp.asarray(weights)
    )
    assert loss_sum.dtype == jnp.float32 and nll_sum.dtype == jnp.float32
    ref_logits = np.asarray(jnp.asarray(logits, jnp.bfloat16).astype(jnp.float32))
    _, ref_nll = _reference_cross_entropy(ref_logits, targets, weights, 0.0)
    np.testing.assert_allclose(nll_sum, ref_nll, rtol=1e-5)


@pytest.mark.parametrize("eps", [-0.1, 1.0, 1.5])
def test_cross_entropy_rejects_bad_smoothing(batch, eps):
    logits, targets, weights = map(jnp.asarray, batch)
    with pytest.raises(ValueError, match="label_smoothing"):
        losses.cross_entropy(logits, targets, weights, label_smoothing=eps)


def test_cross_entropy_rejects_shape_mismatch(batch):
    logits, targets, weights = map(jnp.asarray, batch)
    # Bypass the test-only jaxtyping check (which would also reject this) to reach the ValueError.
    unchecked = getattr(losses.cross_entropy, "__wrapped__", losses.cross_entropy)
    with pytest.raises(ValueError, match=r"weights: expected shape \(2, 5\), got \(2, 4\)"):
        unchecked(logits, targets, weights[:, :4])


def _exact_match(predictions, targets, segment_ids):
    args = (jnp.asarray(a, jnp.int32) for a in (predictions, targets, segment_ids))
    return tuple(float(x) for x in losses.sequence_exact_match(*args))


def _numpy_first_argmax(x):
    """Index of the first maximum per row; NaN counts as the maximum (numpy and jnp agree)."""
    return np.argmax(np.asarray(x, np.float32), axis=-1)


@pytest.mark.parametrize("shape", [(2, 3, 8000), (5, 1), (4, 7), (1, 2, 3, 33)])
def test_argmax_matches_numpy_on_random_logits(shape):
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    got = jax.jit(losses.argmax)(x)
    assert got.dtype == jnp.int32 and got.shape == shape[:-1]
    np.testing.assert_array_equal(got, _numpy_first_argmax(x))


def test_argmax_takes_the_first_of_tied_maxima():
    x = np.random.default_rng(1).normal(size=(6, 50)).astype(np.float32)
    x[0, [3, 9]] = 9.0  # two tied maxima: 3
    x[1, [0, 49]] = 9.0  # 0 and the last index
    x[2, :] = 0.0  # every entry tied (e.g. a zero-initialised output layer): 0
    x[3, [2, 5, 7]] = 9.0  # three tied, their index sum + 2 = 16 is a plain entry
    x[4, [1, 2]] = 9.0  # candidate index (1 + 1) + (2 + 1) - 1 = 4 is below the max
    got = jax.jit(losses.argmax)(x)
    np.testing.assert_array_equal(got, [3, 0, 0, 2, 1, np.argmax(x[5])])


def test_argmax_with_non_finite_and_extreme_values():
    x = np.zeros((7, 6), np.float32)
    x[0] = [-np.inf, -np.inf, -1.0, -np.inf, -2.0, -np.inf]  # -inf entries: 2
    x[1] = -np.inf  # all -inf: 0
    x[2, 4] = np.inf  # a single +inf: 4
    x[3, [1, 3]] = np.inf  # tied +inf: 1
    x[4, 2] = np.nan  # NaN counts as the max, as in jnp.argmax: 2
    x[5] = [3.0e38, -3.0e38, 3.0e38 * 0.999, 1.0, 0.0, -1.0]  # |differences| overflow: 0
    # A subnormal above zero: XLA on CPU flushes it to zero, so jnp.argmax says 0 there and
    # numpy says 1; the contract is jnp.argmax's answer on the same backend.
    x[6] = [0.0, 1e-45, 0.0, 0.0, 0.0, 0.0]
    got = jax.jit(losses.argmax)(x)
    np.testing.assert_array_equal(got[:6], [2, 0, 4, 1, 2, 0])
    np.testing.assert_array_equal(got, jax.jit(lambda z: jnp.argmax(z, axis=-1))(x))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_argmax_low_precision_logits(dtype):
    x = jnp.asarray(np.random.default_rng(2).normal(size=(4, 16, 300)), dtype)
    np.testing.assert_array_equal(losses.argmax(x), jnp.argmax(x, axis=-1))


def test_argmax_has_no_gradient_path():
    x = np.random.default_rng(3).normal(size=(3, 10)).astype(np.float32)
    grad = jax.grad(lambda z: jnp.sum(z * (losses.argmax(z) == 4)[:, None]))(x)
    np.testing.assert_array_equal(grad, (np.argmax(x, -1) == 4)[:, None] * np.ones_like(x))


def test_exact_match_single_sequences():
    targets = [[1, 2, 3, 0], [4, 5, 6, 7], [1, 1, 1, 1]]
    predictions = [[1, 2, 3, 9], [4, 5, 0, 7], [1, 1, 1, 1]]  # row 0 wrong only on padding
    segment_ids = [[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]]
    assert _exact_match(predictions, targets, segment_ids) == (2.0, 3.0)


def test_exact_match_packed_rows():
    targets = [[1, 2, 3, 4, 0]]
    predictions = [[1, 2, 3, 9, 9]]  # segment 2 wrong at position 3; padding wrong too
    assert _exact_match(predictions, targets, [[1, 1, 2, 2, 0]]) == (1.0, 2.0)
    assert _exact_match(targets, targets, [[1, 1, 2, 2, 0]]) == (2.0, 2.0)
    # Three sequences in one row, one full row, and an all-padding row (no sequences).
    targets = [[1, 2, 3, 4, 5], [1, 2, 3, 4, 5], [0, 0, 0, 0, 0]]
    predictions = [[0, 2, 3, 4, 5], [1, 2, 3, 4, 5], [7, 7, 7, 7, 7]]
    segment_ids = [[1, 2, 2, 3, 3], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]]
    assert _exact_match(predictions, targets, segment_ids) == (3.0, 4.0)


def test_exact_match_segments_do_not_leak_across_rows():
    # Row 0 segment 5 (= L) sits next to row 1 segment 0/1 in the flattened buckets.
    targets = [[1, 1, 1, 1, 1], [2, 2, 2, 2, 2]]
    predictions = [[1, 1, 1, 1, 1], [2, 2, 2, 2, 0]]
    segment_ids = [[1, 2, 3, 4, 5], [1, 1, 1, 1, 1]]
    assert _exact_match(predictions, targets, segment_ids) == (5.0, 6.0)


def _random_metrics_inputs():
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.normal(size=(2, 6, 5)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, 5, size=(2, 6)), jnp.int32)
    segment_ids = jnp.array([[1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 0, 0]], jnp.int32)
    return logits, targets, segment_ids


def test_compute_metrics_values():
    logits, targets, segment_ids = _random_metrics_inputs()
    predictions = np.asarray(logits).argmax(-1)
    targets = targets.at[0, :2].set(jnp.asarray(predictions[0, :2]))  # segment (0, 1) all correct
    metrics = losses.compute_metrics(logits, targets, segment_ids, label_smoothing=0.1)
    assert set(metrics) == set(losses.METRIC_SUM_KEYS)
    weights = (np.asarray(segment_ids) > 0).astype(np.float32)
    ref_loss, ref_nll = _reference_cross_entropy(
        np.asarray(logits), np.asarray(targets), weights, 0.1
    )
    correct = (predictions == np.asarray(targets)) * weights
    np.testing.assert_allclose(metrics["loss_sum"], ref_loss, rtol=1e-5)
    np.testing.assert_allclose(metrics["nll_sum"], ref_nll, rtol=1e-5)
    assert float(metrics["correct_sum"]) == correct.sum()
    assert float(metrics["weight_sum"]) == 9.0
    assert float(metrics["seq_count"]) == 3.0
    seq_ok = [correct[0, :2].all(), correct[0, 2:5].all(), correct[1, :4].all()]
    assert float(metrics["seq_correct_sum"]) == sum(seq_ok) and seq_ok[0]
    for value in metrics.values():
        assert value.shape == () and value.dtype == jnp.float32


def test_compute_metrics_jit_equals_eager():
    logits, targets, segment_ids = _random_metrics_inputs()
    eager = losses.compute_metrics(logits, targets, segment_ids, label_smoothing=0.1)
    jitted = jax.jit(lambda *a: losses.compute_metrics(*a, label_smoothing=0.1))(
        logits, targets, segment_ids
    )
    for key in losses.METRIC_SUM_KEYS:
        np.testing.assert_allclose(jitted[key], eager[key], rtol=1e-6, err_msg=key)


def test_classification_metrics():
    logits = jnp.array([[2.0, 0.0, -1.0], [0.0, 1.0, 3.0], [0.5, 0.2, 0.1]], jnp.float32)
    labels = jnp.array([0, 1, 0], jnp.int32)  # correct, wrong, correct
    metrics = losses.classification_metrics(logits, labels)
    log_probs = _log_softmax(np.asarray(logits))
    ref_nll = -log_probs[[0, 1, 2], [0, 1, 0]].sum()
    np.testing.assert_allclose(metrics["nll_sum"], ref_nll, rtol=1e-5)
    np.testing.assert_allclose(metrics["loss_sum"], ref_nll, rtol=1e-5)
    expected = {"correct_sum": 2.0, "weight_sum": 3.0, "seq_correct_sum": 2.0, "seq_count": 3.0}
    assert {key: float(metrics[key]) for key in expected} == expected
    smoothed = losses.classification_metrics(logits, labels, label_smoothing=0.1)
    ref_loss, _ = _reference_cross_entropy(
        np.asarray(logits)[:, None], np.asarray(labels)[:, None], np.ones((3, 1)), 0.1
    )
    np.testing.assert_allclose(smoothed["loss_sum"], ref_loss, rtol=1e-5)


def test_summarize_divides_and_passes_extras_through():
    sums = {
        "loss_sum": np.float32(6.0),
        "nll_sum": np.array(8.0, np.float32),
        "correct_sum": 3.0,
        "weight_sum": 4.0,
        "seq_correct_sum": 1.0,
        "seq_count": 2.0,
        "grad_norm": np.array([0.5], np.float32),
        "learning_rate": 1e-3,
    }
    out = losses.summarize(sums)
    expected = {
        "loss": 1.5,
        "nll": 2.0,
        "perplexity": math.exp(2.0),
        "accuracy": 0.75,
        "exact_match": 0.5,
        "grad_norm": 0.5,
        "learning_rate": 1e-3,
    }
    assert out.keys() == expected.keys()
    for key, value in expected.items():
        assert type(out[key]) is float
        assert out[key] == pytest.approx(value, rel=1e-6), key


def test_summarize_zero_weights_give_nan():
    out = losses.summarize(
        {
            "loss_sum": 0.0,
            "nll_sum": 0.0,
            "correct_sum": 0.0,
            "weight_sum": 0.0,
            "seq_correct_sum": 0.0,
            "seq_count": np.float32(0.0),
        }
    )
    for key in ("loss", "nll", "perplexity", "accuracy", "exact_match"):
        assert math.isnan(out[key]), key


def test_summarize_rejects_non_scalars():
    with pytest.raises(ValueError, match="loss_sum"):
        losses.summarize({"loss_sum": np.ones(8), "weight_sum": 1.0})


def test_compute_metrics_loss_weights_leave_tokens_out():
    logits = jax.random.normal(jax.random.key(3), (2, 4, 6))
    targets = jnp.array([[1, 2, 3, 4], [5, 0, 1, 0]])
    segment_ids = jnp.array([[1, 1, 1, 1], [1, 1, 1, 0]])
    loss_weights = jnp.array([[0, 1, 1, 1], [0, 1, 1, 1]])
    metrics = losses.compute_metrics(logits, targets, segment_ids, loss_weights=loss_weights)
    log_probs = np.asarray(jax.nn.log_softmax(logits))
    kept = [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2)]  # weight 1 and not padding
    nll = -sum(log_probs[b, t, int(targets[b, t])] for b, t in kept)
    np.testing.assert_allclose(metrics["nll_sum"], nll, rtol=1e-5)
    assert float(metrics["weight_sum"]) == len(kept)


@pytest.mark.parametrize("branch", ["_argmax_by_reductions", "_argmax_plain"])
def test_each_platform_argmax_matches_numpy(branch):
    # Both are called directly, so the GPU/TPU path is checked on this CPU too.
    x = np.random.default_rng(3).normal(size=(50, 37)).astype(np.float32)
    x[7, [4, 20]] = 9.0  # a tie: the first index wins
    got = jax.jit(getattr(losses, branch))(jnp.asarray(x))
    np.testing.assert_array_equal(got, _numpy_first_argmax(x))


@pytest.mark.parametrize("platform, by_reductions", [("cpu", True), ("cuda", False)])
def test_argmax_reduction_path_only_in_the_cpu_lowering(platform, by_reductions):
    args = (jax.ShapeDtypeStruct((4, 10), jnp.float32),)
    text = jax.export.export(jax.jit(losses.argmax), platforms=[platform])(*args).mlir_module()
    spread = f"{np.float32(2.0**126):.8E}"  # the 2^126 multiplier, as StableHLO prints it
    assert (spread in text) == by_reductions


def test_argmax_stock_path_is_jnp_argmax_and_agrees_with_the_fast_one():
    x = np.random.default_rng(3).normal(size=(3, 4, 300)).astype(np.float32)
    x[0, 0, [5, 7]] = 9.0  # a tie: the fast path hands the batch to jnp.argmax
    stock = jax.make_jaxpr(functools.partial(losses.argmax, fast_path=False))(x)
    assert "platform_index" not in str(stock) and "argmax" in str(stock)
    assert "platform_index" in str(jax.make_jaxpr(losses.argmax)(x))
    np.testing.assert_array_equal(
        jax.jit(losses.argmax)(x), jax.jit(functools.partial(losses.argmax, fast_path=False))(x)
    )
    x[0, 0, 7] = 8.0  # no tie: the reductions answer
    np.testing.assert_array_equal(jax.jit(losses.argmax)(x), _numpy_first_argmax(x))
    got = losses.argmax(jnp.asarray(x), fast_path=False)
    np.testing.assert_array_equal(got, _numpy_first_argmax(x))
