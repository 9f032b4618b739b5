"""Tests for tfjax.data.packing: literal rows, and packed rows computing what separate rows do."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfjax import models
from tfjax.data import packing


def _example(inputs, targets, source_len=4, target_len=5):
    def pad(ids, n):
        tokens, seg = np.zeros(n, np.int32), np.zeros(n, np.int32)
        tokens[: len(ids)], seg[: len(ids)] = ids, 1
        return tokens, seg

    x, xs = pad(inputs, source_len)
    y, ys = pad(targets, target_len)
    return {"inputs": x, "inputs_segment_ids": xs, "targets": y, "targets_segment_ids": ys}


def test_pack_literal_rows():
    examples = [
        _example([5, 2], [7, 8, 2]),
        _example([6, 6, 2], [9, 2]),
        _example([4, 2], [3, 3, 3, 2]),
    ]
    rows = packing.pack(examples, {"inputs": 6, "targets": 7}, seed=0, window=4)
    assert sum(int(r["targets_segment_ids"].max()) for r in rows) == 3
    for row in rows:
        for field in ("inputs", "targets"):
            seg, pos = row[f"{field}_segment_ids"], row[f"{field}_positions"]
            for s in range(1, seg.max() + 1):  # positions restart at 0 in every segment
                np.testing.assert_array_equal(pos[seg == s], np.arange((seg == s).sum()))
            assert (row[field][seg == 0] == 0).all()
    # Every example's tokens appear exactly once, as a contiguous segment.
    found = sorted(
        tuple(r["targets"][r["targets_segment_ids"] == s])
        for r in rows
        for s in range(1, r["targets_segment_ids"].max() + 1)
    )
    assert found == sorted([(7, 8, 2), (9, 2), (3, 3, 3, 2)])


def test_pack_is_deterministic_and_rejects_too_long_examples():
    examples = [_example([5, 2], [7, 2]) for _ in range(10)]
    a = packing.pack(examples, {"inputs": 6, "targets": 6}, seed=3)
    b = packing.pack(examples, {"inputs": 6, "targets": 6}, seed=3)
    assert all(np.array_equal(x[k], y[k]) for x, y in zip(a, b, strict=True) for k in x)
    with pytest.raises(ValueError, match="capacity"):
        packing.pack([_example([5, 5, 5, 2], [7, 2])], {"inputs": 3, "targets": 6}, seed=0)


def test_packed_encoder_decoder_row_equals_separate_rows():
    cfg = models.ModelConfig(
        vocab_size=20,
        embed_dim=16,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=2,
        mlp_dim=32,
        dropout_rate=0.0,
    )
    model = models.create_model(cfg)
    examples = [_example([5, 6, 2], [7, 8, 2]), _example([9, 2], [10, 11, 12, 2])]
    (row,) = packing.pack(examples, {"inputs": 8, "targets": 8}, seed=0)
    batch = {k: jnp.asarray(v[None]) for k, v in row.items()}
    variables = model.init(jax.random.key(0), batch["inputs"], batch["targets"])
    packed = model.apply(variables, batch.pop("inputs"), batch.pop("targets"), **batch)[0]
    seg = row["targets_segment_ids"]
    for s in (1, 2):
        source = row["inputs"][row["inputs_segment_ids"] == s][None]
        target = row["targets"][seg == s][None]
        alone = model.apply(variables, jnp.asarray(source), jnp.asarray(target))[0]
        np.testing.assert_allclose(packed[seg == s], alone, atol=1e-5)
