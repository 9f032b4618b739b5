"""Tests for tfjax/data/listops.py: the LRA ListOps generator and its evaluator."""

import collections

import numpy as np
import pytest

from tfjax.data import listops

LITERALS = [
    ("[MAX 2 9 [MIN 4 7 ] 0 ]", 9),
    ("[MED 1 5 3 ]", 3),
    ("[MED 1 2 3 4 ]", 2),  # int(np.median) = int(2.5)
    ("[MED 3 8 ]", 5),  # int(5.5)
    ("[SM 7 8 ]", 5),
    ("[MIN 6 [MAX 1 [SM 9 9 9 ] ] 4 ]", 4),
    ("7", 7),
]


def _parse(tokens: list[str], i: int = 0) -> tuple[tuple, int]:
    """(node, next index): a node is a digit or (operator token, [child nodes])."""
    if tokens[i].isdigit():
        return int(tokens[i]), i + 1
    operator, children, i = tokens[i], [], i + 1
    while tokens[i] != "]":
        child, i = _parse(tokens, i)
        children.append(child)
    return (operator, children), i + 1


def _tree(text: str):
    node, end = _parse(text.split())
    assert end == len(text.split())
    return node


def _value(node) -> int:
    """The reference semantics, written from LRA's definitions."""
    if isinstance(node, int):
        return node
    operator, children = node
    values = [_value(child) for child in children]
    return {
        "[MAX": max,
        "[MIN": min,
        "[MED": lambda v: int(np.median(v)),
        "[SM": lambda v: int(np.sum(v)) % 10,
    }[operator](values)


def _depth(node) -> int:
    """Operators nested along the deepest path (0 for a digit)."""
    return 0 if isinstance(node, int) else 1 + max(_depth(child) for child in node[1])


def _arg_counts(node) -> list[int]:
    if isinstance(node, int):
        return []
    return [len(node[1])] + [n for child in node[1] for n in _arg_counts(child)]


@pytest.mark.parametrize(("text", "value"), LITERALS)
def test_literal_values(text, value):
    assert _value(_tree(text)) == value
    assert listops.evaluate(text) == value


def test_evaluate_skips_lra_parentheses():
    # LRA's TSV form of "[MAX 2 9 ]": every (function, argument) application in parentheses.
    assert listops.evaluate("( ( ( [MAX 2 ) 9 ) ] )") == 9


def test_labels_match_the_reference_evaluator():
    examples = listops.generate(300, seed=1, min_length=20, max_length=120)
    for text, label in examples:
        assert label == _value(_tree(text)) == listops.evaluate(text)
    tokens = {token for text, _ in examples for token in text.split()}
    assert tokens == {"[MAX", "[MIN", "[MED", "[SM", "]", *(str(d) for d in range(10))}


def test_lengths_within_bounds():
    examples = listops.generate(300, seed=2, min_length=30, max_length=60)
    lengths = [len(text.split()) for text, _ in examples]
    assert min(lengths) >= 30 and max(lengths) <= 60
    assert min(lengths) < 35 and max(lengths) > 55  # the whole range is used


def test_depth_and_argument_counts():
    examples = listops.generate(300, seed=3, max_depth=3, max_args=4, min_length=4, max_length=60)
    trees = [_tree(text) for text, _ in examples]
    depths = [_depth(tree) for tree in trees]
    counts = [n for tree in trees for n in _arg_counts(tree)]
    # max_depth counts tree levels with the digits (LRA): operators nest max_depth - 1 deep.
    assert max(depths) == 2 and min(depths) == 1
    assert min(counts) == 2 and max(counts) == 4
    flat = listops.generate(50, seed=3, max_depth=2, min_length=4, max_length=20)
    assert {_depth(_tree(t)) for t, _ in flat} == {1}


def test_defaults_are_lra_settings():
    for text, label in listops.generate(3, seed=0):
        assert 500 <= len(text.split()) <= 2000
        assert _depth(_tree(text)) <= 9
        assert max(_arg_counts(_tree(text))) <= 10
        assert label == listops.evaluate(text)


def test_determinism_and_seeds():
    kwargs = dict(min_length=10, max_length=50)
    assert listops.generate(40, seed=7, **kwargs) == listops.generate(40, seed=7, **kwargs)
    assert listops.generate(40, seed=7, **kwargs) != listops.generate(40, seed=8, **kwargs)
    assert listops.generate(0, seed=7) == []


def test_all_labels_appear():
    examples = listops.generate(1000, seed=4, min_length=10, max_length=60)
    assert set(collections.Counter(label for _, label in examples)) == set(range(10))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_examples": -1}, "num_examples must be >= 0"),
        ({"min_length": 60, "max_length": 50}, "raise max_length or lower min_length"),
        ({"max_depth": 1}, "max_depth must be >= 2"),
        ({"max_args": 1}, "max_args must be >= 2"),
        ({"min_length": 1, "max_length": 3}, "shortest expression"),
        # Longest with 3 levels and 2 arguments: [OP [OP d d ] [OP d d ] ] = 10 tokens.
        ({"max_depth": 3, "max_args": 2, "min_length": 11, "max_length": 20}, "longest"),
        # Reachable in principle, but with at most 5 arguments the trees stay small (LRA uses 10).
        ({"max_args": 5}, "rarely reach"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    kwargs = {"num_examples": 5, "seed": 0, **kwargs}
    with pytest.raises(ValueError, match=match):
        listops.generate(**kwargs)


@pytest.mark.parametrize("text", ["[MAX 1 2", "[MAX ]", "]", "1 2", "[FOO 1 ]", "[MAX 1 ] 3"])
def test_evaluate_rejects_malformed(text):
    with pytest.raises(ValueError):
        listops.evaluate(text)
