"""The source registry: the built-ins' declarations and the checks on new ones."""

import numpy as np
import pytest

from tfjax.data import datasets, registry

GENERATED = ("test", "train")
# name: (formats, eval splits, seeded), as the built-in sources declare them.
BUILTINS = {
    "scan": (registry.PAIRS, GENERATED, True),
    "copy": (registry.PAIRS, GENERATED, True),
    "reverse": (registry.PAIRS, GENERATED, True),
    "sort": (registry.PAIRS, GENERATED, True),
    "parity": (registry.CLASSIFICATION, GENERATED, True),
    "majority": (registry.CLASSIFICATION, GENERATED, True),
    "listops": (registry.CLASSIFICATION, GENERATED, True),
    "multi30k": (registry.PAIRS, ("train", "val", "test2016"), False),
    "tinyshakespeare": (registry.TEXT, ("train", "val"), False),
    "files": (("seq2seq", "lm", "classify"), GENERATED, False),
    "hub": (registry.PAIRS, (), False),
}
WORDS = ("red", "green", "blue", "black", "white")


def _toy_pairs(request: registry.Request) -> list[tuple[str, str]]:
    """Three-word phrases and the same phrases reversed, drawn from the seed."""
    rng = np.random.default_rng([request.seed, request.split == "train"])
    count = 12 if request.split == "train" else 3
    phrases = [" ".join(rng.choice(WORDS, size=3)) for _ in range(count)]
    return [(p, " ".join(reversed(p.split()))) for p in phrases]


def test_builtin_sources_and_their_declarations():
    assert registry.names() == tuple(BUILTINS)
    for name, (formats, splits, seeded) in BUILTINS.items():
        source = registry.get(name)
        assert (source.formats, source.splits, source.seeded) == (formats, splits, seeded), name
        assert datasets.eval_splits(name) == splits


def test_declarations_are_checked_when_registering():
    with pytest.raises(ValueError, match=r"formats=.*subset of"):
        registry.register("toy", formats=("translation",), splits=())(_toy_pairs)
    with pytest.raises(ValueError, match="must include 'train'"):
        registry.register("toy", formats=registry.PAIRS, splits=("dev",))(_toy_pairs)
    assert "toy" not in registry.names()
    with pytest.raises(ValueError, match=r"'scan' is already registered \(by tfjax\.data\.catalog"):
        registry.register("scan", formats=registry.PAIRS, splits=())(_toy_pairs)
    with pytest.raises(ValueError, match=r"unknown data source data\.name='toy'"):
        registry.unregister("toy")
