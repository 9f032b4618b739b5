"""Tests for tfjax/data/tokenizers.py and tfjax/data/pipeline.py: ids, padding, batches, resume."""

import itertools
import json
import logging

import numpy as np
import pytest

from tfjax.data import pipeline, tokenizers

# ---------------------------------------------------------------- tokenizer


@pytest.fixture
def tokenizer():
    # Counts: b 3, a 2, c 1 -> ids b=4, a=5, c=6.
    return tokenizers.WordTokenizer.build(["b a b", "c b a"])


def test_specials():
    assert (tokenizers.PAD_ID, tokenizers.BOS_ID, tokenizers.EOS_ID, tokenizers.UNK_ID) == (
        0,
        1,
        2,
        3,
    )


def test_vocabulary_order(tokenizer):
    assert tokenizer.words == ("<pad>", "<bos>", "<eos>", "<unk>", "b", "a", "c")
    assert tokenizer.vocab_size == 7
    # Equal counts are ordered alphabetically, whatever the input order.
    tied = tokenizers.WordTokenizer.build(["y x z", "z y x"])
    assert tied.words[4:] == ("x", "y", "z")
    rare = tokenizers.WordTokenizer.build(["b a b", "c b a"], min_count=2)
    assert rare.words[4:] == ("b", "a")


def test_encode_decode_round_trip(tokenizer):
    assert tokenizer.encode("a c b") == [5, 6, 4]
    assert tokenizer.encode("a c b", add_bos=True, add_eos=True) == [1, 5, 6, 4, 2]
    assert tokenizer.decode([1, 5, 6, 4, 2]) == "a c b"
    assert tokenizer.decode(np.array([5, 0, 6], dtype=np.int32)) == "a c"


def test_unknown_words(tokenizer):
    assert tokenizer.encode("a zebra") == [5, 3]
    assert tokenizer.decode([5, 3]) == "a <unk>"


def test_decode_stops_at_first_eos(tokenizer):
    assert tokenizer.decode([5, 2, 6, 2, 4]) == "a"
    assert tokenizer.decode([2, 5]) == ""


def test_save_load(tokenizer, tmp_path):
    path = tmp_path / "vocab.json"
    tokenizer.save(path)
    loaded = tokenizers.WordTokenizer.load(str(path))
    assert loaded == tokenizer
    assert loaded != tokenizers.WordTokenizer.build(["a b"])
    with pytest.raises(FileNotFoundError, match=r"missing\.json"):
        tokenizers.WordTokenizer.load(tmp_path / "missing.json")


# ---------------------------------------------------------------- encoding


def test_encode_seq2seq_literal_padding(tokenizer, caplog):
    pairs = [("a b", "c"), ("a b c a", "c")]
    with caplog.at_level(logging.WARNING, logger=pipeline.__name__):
        examples = pipeline.encode_seq2seq(pairs, tokenizer, max_source_len=4, max_target_len=3)
    assert len(examples) == 1
    assert "Dropped 1 of 2" in caplog.text
    (example,) = examples
    np.testing.assert_array_equal(example["inputs"], [5, 4, 2, 0])
    np.testing.assert_array_equal(example["inputs_segment_ids"], [1, 1, 1, 0])
    np.testing.assert_array_equal(example["targets"], [6, 2, 0])
    np.testing.assert_array_equal(example["targets_segment_ids"], [1, 1, 0])
    assert all(value.dtype == np.int32 for value in example.values())


def test_encode_lm_and_classify_literal(tokenizer):
    (lm,) = pipeline.encode_lm(["c a", "a a a a a"], tokenizer, max_len=4)
    np.testing.assert_array_equal(lm["targets"], [6, 5, 2, 0])
    np.testing.assert_array_equal(lm["targets_segment_ids"], [1, 1, 1, 0])
    (cls,) = pipeline.encode_classify([("b c", 1)], tokenizer, max_len=4)
    np.testing.assert_array_equal(cls["inputs"], [1, 4, 6, 0])
    np.testing.assert_array_equal(cls["inputs_segment_ids"], [1, 1, 1, 0])
    assert cls["labels"].shape == () and int(cls["labels"]) == 1
    with pytest.raises(ValueError, match="negative"):
        pipeline.encode_classify([("b", -1)], tokenizer, max_len=4)


# ---------------------------------------------------------------- batching


def _numbered(num_examples: int) -> list[dict[str, np.ndarray]]:
    """Examples whose first target is their index + 1, so batches reveal their membership."""
    return [
        {
            "targets": np.array([i + 1, 7, 0], dtype=np.int32),
            "targets_segment_ids": np.array([1, 1, 0], dtype=np.int32),
        }
        for i in range(num_examples)
    ]


def _ids(batches) -> list[int]:
    return [
        int(i) - 1
        for batch in batches
        for i, s in zip(batch["targets"][:, 0], batch["targets_segment_ids"][:, 0], strict=True)
        if s
    ]


def test_batch_shapes_and_dtypes():
    batch = next(pipeline.BatchIterator(pipeline.make_dataset(_numbered(10), batch_size=4, seed=0)))
    assert set(batch) == {"targets", "targets_segment_ids"}
    assert batch["targets"].shape == (4, 3) and batch["targets"].dtype == np.int32
    assert batch["targets_segment_ids"].dtype == np.int32


def test_shuffle_is_deterministic_and_reshuffles_each_epoch():
    def first(seed, n):
        return list(
            itertools.islice(pipeline.make_dataset(_numbered(12), batch_size=4, seed=seed), n)
        )

    epochs = _ids(first(0, 6))
    assert epochs == _ids(first(0, 6))
    assert epochs != _ids(first(1, 6))
    assert sorted(epochs[:12]) == list(range(12)) and sorted(epochs[12:]) == list(range(12))
    assert epochs[:12] != epochs[12:]
    assert epochs[:12] != list(range(12))


def test_sharding_covers_disjoint_examples():
    shards = [
        _ids(
            pipeline.make_dataset(
                _numbered(10),
                batch_size=3,
                seed=0,
                shuffle=False,
                repeat=False,
                drop_remainder=False,
                shard_index=i,
                shard_count=2,
            )
        )
        for i in range(2)
    ]
    assert shards == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]


def _host_batches(rows: slice, count: int, *, start: int = 0) -> list[list[int]]:
    dataset = pipeline.make_host_dataset(_numbered(10), global_batch_size=4, rows=rows, seed=3)
    iterator = pipeline.BatchIterator(dataset)
    iterator.set_state({"next_index": start})
    return [_ids([next(iterator)]) for _ in range(count)]


def test_host_slices_tile_the_one_host_batches_across_epochs():
    # 10 examples in global batches of 4: batches cross epoch boundaries (a reshuffle).
    whole = [
        _ids([b])
        for b in itertools.islice(pipeline.make_dataset(_numbered(10), batch_size=4, seed=3), 7)
    ]
    assert _host_batches(slice(0, 4), 7) == whole  # one host: make_dataset's batches exactly
    for hosts in (2, 4):
        width = 4 // hosts
        parts = [_host_batches(slice(i * width, (i + 1) * width), 7) for i in range(hosts)]
        for step, batch in enumerate(whole):  # the hosts' rows, in order, are the global batch
            assert [row for part in parts for row in part[step]] == batch
    assert _host_batches(slice(2, 4), 3, start=4) == _host_batches(slice(2, 4), 7)[4:]


def test_host_dataset_refuses_rows_outside_the_batch():
    for rows in (slice(2, 2), slice(3, 5), slice(-1, 2)):
        with pytest.raises(ValueError, match="not a block"):
            pipeline.make_host_dataset(_numbered(10), global_batch_size=4, rows=rows, seed=0)


def test_eval_yields_every_example_once_with_padded_last_batch():
    dataset = pipeline.make_dataset(
        _numbered(10), batch_size=4, seed=0, shuffle=False, repeat=False, drop_remainder=False
    )
    batches = list(pipeline.BatchIterator(dataset))
    assert len(batches) == 3
    assert _ids(batches) == list(range(10))
    assert all(batch["targets"].shape == (4, 3) for batch in batches)
    np.testing.assert_array_equal(
        batches[-1]["targets_segment_ids"], [[1, 1, 0], [1, 1, 0], [0, 0, 0], [0, 0, 0]]
    )
    np.testing.assert_array_equal(batches[-1]["targets"][2:], 0)


def test_eval_shards_get_equal_batch_counts():
    # 9 examples over 2 hosts, 4 per batch: host 0 has 5 (2 batches), host 1 has 4 and is padded.
    counts = []
    for index in range(2):
        dataset = pipeline.make_dataset(
            _numbered(9),
            batch_size=4,
            seed=0,
            shuffle=False,
            repeat=False,
            drop_remainder=False,
            shard_index=index,
            shard_count=2,
        )
        counts.append(len(list(dataset)))
    assert counts == [2, 2]


def test_pad_batch_classify_labels():
    batch = {
        "inputs": np.ones((1, 2), np.int32),
        "inputs_segment_ids": np.ones((1, 2), np.int32),
        "labels": np.array([1], np.int32),
    }
    padded = pipeline.pad_batch(batch, 3)
    np.testing.assert_array_equal(padded["labels"], [1, -1, -1])
    np.testing.assert_array_equal(padded["inputs_segment_ids"], [[1, 1], [0, 0], [0, 0]])
    with pytest.raises(ValueError, match="more than batch_size"):
        pipeline.pad_batch(batch, 0)


def test_make_dataset_errors():
    with pytest.raises(ValueError, match="batch_size"):
        pipeline.make_dataset(_numbered(4), batch_size=0, seed=0)
    with pytest.raises(ValueError, match="shard_index"):
        pipeline.make_dataset(_numbered(4), batch_size=2, seed=0, shard_index=2, shard_count=2)


def test_resume_yields_the_same_batches():
    dataset = pipeline.make_dataset(_numbered(11), batch_size=3, seed=42)
    iterator = pipeline.BatchIterator(dataset)
    for _ in range(5):
        next(iterator)
    state = json.loads(json.dumps(iterator.get_state()))
    expected = [next(iterator) for _ in range(3)]
    restored = pipeline.BatchIterator(pipeline.make_dataset(_numbered(11), batch_size=3, seed=42))
    restored.set_state(state)
    for want, got in zip(expected, [next(restored) for _ in range(3)], strict=True):
        assert want.keys() == got.keys()
        assert all(np.array_equal(want[key], got[key]) for key in want)
    with pytest.raises(ValueError, match="state"):
        restored.set_state({"position": 3})
