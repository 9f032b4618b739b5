"""Tests for tfjax.nn.masking: literal 0/1 matrices written out by hand, shapes and errors."""

import contextlib

import jax.numpy as jnp
import jaxtyping
import numpy as np
import pytest

from tfjax.nn import masking


def _as_int(mask):
    """Bool mask -> numpy int matrix, after checking the dtype is bool."""
    assert mask.dtype == jnp.bool_
    return np.asarray(mask).astype(np.int32)


@contextlib.contextmanager
def _unchecked():
    """Turns off the runtime annotation checks, to reach the functions' own ValueErrors."""
    jaxtyping.config.update("jaxtyping_disable", True)
    try:
        yield
    finally:
        jaxtyping.config.update("jaxtyping_disable", False)


# ---------------------------------------------------------------------------------------------
# Padding.


def test_lengths_to_segment_ids():
    ids = masking.lengths_to_segment_ids(jnp.array([3, 0, 5]), 4)
    assert ids.dtype == jnp.int32
    np.testing.assert_array_equal(ids, [[1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]])


def test_padding_mask_from_segment_ids():
    mask = masking.padding_mask(jnp.array([[1, 1, 0], [1, 0, 0]]))
    assert mask.shape == (2, 1, 3, 3)
    expected = [
        [[1, 1, 0], [1, 1, 0], [0, 0, 0]],
        [[1, 0, 0], [0, 0, 0], [0, 0, 0]],
    ]
    np.testing.assert_array_equal(_as_int(mask)[:, 0], expected)


def test_padding_mask_from_lengths_rectangular():
    q_ids = masking.lengths_to_segment_ids(jnp.array([2]), 3)
    kv_ids = masking.lengths_to_segment_ids(jnp.array([3]), 4)
    mask = masking.padding_mask(q_ids, kv_ids)
    assert mask.shape == (1, 1, 3, 4)
    expected = [[1, 1, 1, 0], [1, 1, 1, 0], [0, 0, 0, 0]]
    np.testing.assert_array_equal(_as_int(mask)[0, 0], expected)


def test_padding_mask_ignores_segment_numbers():
    mask = masking.padding_mask(jnp.array([[1, 2, 0]]))
    expected = [[1, 1, 0], [1, 1, 0], [0, 0, 0]]
    np.testing.assert_array_equal(_as_int(mask)[0, 0], expected)


# ---------------------------------------------------------------------------------------------
# Causal and window.


def test_causal_mask_square():
    mask = masking.causal_mask(4)
    assert mask.shape == (1, 1, 4, 4)
    expected = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    np.testing.assert_array_equal(_as_int(mask)[0, 0], expected)


def test_causal_mask_more_keys_than_queries():
    # Two new queries after three cached keys: the last query sees everything.
    mask = masking.causal_mask(2, 5)
    assert mask.shape == (1, 1, 2, 5)
    expected = [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    np.testing.assert_array_equal(_as_int(mask)[0, 0], expected)


def test_causal_mask_fewer_keys_than_queries():
    mask = masking.causal_mask(3, 2)
    expected = [[0, 0], [1, 0], [1, 1]]
    np.testing.assert_array_equal(_as_int(mask)[0, 0], expected)


def test_window_mask_radius_one():
    mask = masking.window_mask(5, 1)
    assert mask.shape == (1, 1, 5, 5)
    expected = [
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [0, 1, 1, 1, 0],
        [0, 0, 1, 1, 1],
        [0, 0, 0, 1, 1],
    ]
    np.testing.assert_array_equal(_as_int(mask)[0, 0], expected)


def test_window_mask_radius_one_causal():
    mask = masking.window_mask(5, 1, causal=True)
    expected = [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 1, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 0, 1, 1],
    ]
    np.testing.assert_array_equal(_as_int(mask)[0, 0], expected)


def test_window_mask_rectangular_is_aligned_like_causal():
    mask = masking.window_mask(2, 1, kv_length=4)
    expected = [[0, 1, 1, 1], [0, 0, 1, 1]]
    np.testing.assert_array_equal(_as_int(mask)[0, 0], expected)
    causal = masking.window_mask(2, 1, kv_length=4, causal=True)
    np.testing.assert_array_equal(_as_int(causal)[0, 0], [[0, 1, 1, 0], [0, 0, 1, 1]])


def test_window_mask_radius_zero_is_identity_and_large_radius_is_causal():
    np.testing.assert_array_equal(_as_int(masking.window_mask(3, 0))[0, 0], np.eye(3))
    np.testing.assert_array_equal(masking.window_mask(4, 10, causal=True), masking.causal_mask(4))


# ---------------------------------------------------------------------------------------------
# Packed segments, cross-attention, decoding.


def test_segment_mask_packed():
    mask = masking.segment_mask(jnp.array([[1, 1, 2, 2, 0]]))
    assert mask.shape == (1, 1, 5, 5)
    expected = [
        [1, 1, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0],
    ]
    np.testing.assert_array_equal(_as_int(mask)[0, 0], expected)


def test_segment_mask_with_causal_is_block_lower_triangular():
    ids = jnp.array([[1, 1, 2, 2, 0]])
    mask = masking.combine_masks(masking.segment_mask(ids), masking.causal_mask(5))
    expected = [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0],
    ]
    np.testing.assert_array_equal(_as_int(mask)[0, 0], expected)


def test_cross_attention_mask_packed():
    decoder_ids = jnp.array([[1, 1, 2, 0]])  # two targets, one pad
    encoder_ids = jnp.array([[1, 2, 2, 2, 0]])  # two sources, one pad
    mask = masking.cross_attention_mask(decoder_ids, encoder_ids)
    assert mask.shape == (1, 1, 4, 5)
    expected = [
        [1, 0, 0, 0, 0],
        [1, 0, 0, 0, 0],
        [0, 1, 1, 1, 0],
        [0, 0, 0, 0, 0],
    ]
    np.testing.assert_array_equal(_as_int(mask)[0, 0], expected)


def test_cross_attention_mask_unpacked_equals_padding_mask():
    decoder_ids = masking.lengths_to_segment_ids(jnp.array([2, 3]), 3)
    encoder_ids = masking.lengths_to_segment_ids(jnp.array([4, 1]), 4)
    np.testing.assert_array_equal(
        masking.cross_attention_mask(decoder_ids, encoder_ids),
        masking.padding_mask(decoder_ids, encoder_ids),
    )


# ---------------------------------------------------------------------------------------------
# combine_masks.


def test_combine_masks_broadcasts_and_skips_none():
    padding = masking.padding_mask(jnp.array([[1, 1, 0], [1, 0, 0]]))  # [2, 1, 3, 3]
    causal = masking.causal_mask(3)  # [1, 1, 3, 3]
    mask = masking.combine_masks(None, padding, None, causal)
    assert mask.shape == (2, 1, 3, 3)
    expected = [
        [[1, 0, 0], [1, 1, 0], [0, 0, 0]],
        [[1, 0, 0], [0, 0, 0], [0, 0, 0]],
    ]
    np.testing.assert_array_equal(_as_int(mask)[:, 0], expected)


def test_combine_masks_single_and_none():
    causal = masking.causal_mask(2)
    np.testing.assert_array_equal(masking.combine_masks(causal), causal)
    assert masking.combine_masks() is None
    assert masking.combine_masks(None, None) is None


def test_masks_broadcast_against_attention_logits():
    logits = jnp.zeros((2, 3, 4, 4))  # [B, N, L, S]
    mask = masking.combine_masks(
        masking.segment_mask(jnp.array([[1, 1, 2, 0], [1, 1, 1, 1]])),
        masking.window_mask(4, 2, causal=True),
    )
    assert jnp.where(mask, logits, -1.0).shape == logits.shape


# ---------------------------------------------------------------------------------------------
# Errors.


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: masking.causal_mask(-1), "length"),
        (lambda: masking.causal_mask(2, -3), "kv_length"),
        (lambda: masking.window_mask(3, -1), "radius"),
        (lambda: masking.lengths_to_segment_ids(jnp.array([1]), -2), "length"),
    ],
)
def test_bad_values_raise(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_bad_shapes_raise_under_annotation_checks():
    with pytest.raises(TypeError):
        masking.segment_mask(jnp.ones((2, 3), jnp.int32), jnp.ones((3, 3), jnp.int32))
    with pytest.raises(TypeError):
        masking.padding_mask(jnp.ones((3,), jnp.int32))


def test_bad_shapes_raise_value_error_without_annotation_checks():
    with _unchecked():
        with pytest.raises(ValueError, match=r"kv_segment_ids.*expected 2, got 3"):
            masking.segment_mask(jnp.ones((2, 3), jnp.int32), jnp.ones((3, 3), jnp.int32))
        with pytest.raises(ValueError, match=r"q_segment_ids must be 2-D.*\(3,\)"):
            masking.padding_mask(jnp.ones((3,), jnp.int32))
        with pytest.raises(ValueError, match="lengths must be 1-D"):
            masking.lengths_to_segment_ids(jnp.ones((2, 2), jnp.int32), 3)


def test_combine_masks_rejects_float_and_unbroadcastable():
    with pytest.raises((ValueError, TypeError)):
        masking.combine_masks(jnp.ones((1, 1, 2, 2)))
    with pytest.raises(ValueError, match="broadcast"):
        masking.combine_masks(masking.causal_mask(2), masking.causal_mask(3))
    with _unchecked(), pytest.raises(ValueError, match="bool"):
        masking.combine_masks(jnp.ones((1, 1, 2, 2)))
