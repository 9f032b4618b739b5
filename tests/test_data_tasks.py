"""Tests for tfjax/data/tasks.py: algorithmic seq2seq, LM and classification tasks."""

import pytest

from tfjax.data import tasks


def _symbols(text: str) -> list[int]:
    return [int(word.removeprefix("s")) for word in text.split()]


def test_copy_reverse_sort_targets():
    for source, target in tasks.copy_task(50, seed=1):
        assert target == source
    for source, target in tasks.reverse_task(50, seed=1):
        assert _symbols(target) == _symbols(source)[::-1]
    for source, target in tasks.sort_task(50, num_symbols=20, seed=1):
        assert _symbols(target) == sorted(_symbols(source))


@pytest.mark.parametrize(
    ("name", "source", "target"),
    [
        ("copy", "s3 s1 s7", "s3 s1 s7"),
        ("reverse", "s3 s1 s7", "s7 s1 s3"),
        ("sort", "s3 s1 s7", "s1 s3 s7"),
        ("sort", "s10 s2 s9 s2", "s2 s2 s9 s10"),  # by number, not as strings
        ("reverse", "s4", "s4"),
    ],
)
def test_solve_literal(name, source, target):
    assert tasks.solve(name, source) == target


def test_tasks_share_sources_for_a_seed():
    copy = tasks.copy_task(20, seed=5)
    reverse = tasks.reverse_task(20, seed=5)
    assert [s for s, _ in copy] == [s for s, _ in reverse]


def test_bounds():
    pairs = tasks.copy_task(500, min_len=2, max_len=4, num_symbols=3, seed=2)
    lengths = {len(source.split()) for source, _ in pairs}
    assert lengths == {2, 3, 4}
    assert {word for source, _ in pairs for word in source.split()} == {"s0", "s1", "s2"}


def test_determinism_and_seeds():
    assert tasks.sort_task(30, seed=7) == tasks.sort_task(30, seed=7)
    assert tasks.sort_task(30, seed=7) != tasks.sort_task(30, seed=8)
    assert tasks.classification_task("parity", 30, seed=7) == tasks.classification_task(
        "parity", 30, seed=7
    )


def test_parity_labels():
    examples = tasks.classification_task("parity", 200, min_len=1, max_len=9, seed=4)
    for text, label in examples:
        assert set(text.split()) <= {"0", "1"}
        assert label == text.split().count("1") % 2
    assert {label for _, label in examples} == {0, 1}


def test_majority_labels_and_odd_lengths():
    examples = tasks.classification_task("majority", 200, min_len=2, max_len=8, seed=4)
    lengths = {len(text.split()) for text, _ in examples}
    assert lengths == {3, 5, 7}
    for text, label in examples:
        ones, zeros = text.split().count("1"), text.split().count("0")
        assert label == (1 if ones > zeros else 0)


def test_errors():
    with pytest.raises(ValueError, match="copy, reverse, sort"):
        tasks.solve("rotate", "s1")
    with pytest.raises(ValueError, match="parity, majority"):
        tasks.classification_task("count", 3)
    with pytest.raises(ValueError, match="odd length"):
        tasks.classification_task("majority", 3, min_len=4, max_len=4)
    with pytest.raises(ValueError, match="min_len"):
        tasks.copy_task(3, min_len=5, max_len=2)
    with pytest.raises(ValueError, match="num_symbols"):
        tasks.copy_task(3, num_symbols=0)
