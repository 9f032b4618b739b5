"""The source registry: the built-ins' declarations, a source added from outside, the errors."""

import dataclasses

import numpy as np
import pytest

from tfjax.data import datasets, registry
from tfjax.models import kinds

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


@pytest.fixture
def toy_source():
    """A source registered here, through the public API only, and removed afterwards."""
    registry.register("toy_reverse", formats=registry.PAIRS, splits=("train", "dev"), seeded=True)(
        _toy_pairs
    )
    yield "toy_reverse"
    registry.unregister("toy_reverse")


def test_builtin_sources_and_their_declarations():
    assert registry.names() == tuple(BUILTINS)
    for name, (formats, splits, seeded) in BUILTINS.items():
        source = registry.get(name)
        assert (source.formats, source.splits, source.seeded) == (formats, splits, seeded), name
        assert datasets.eval_splits(name) == splits


@pytest.mark.parametrize(("kind", "fmt"), [("encoder_decoder", "seq2seq"), ("decoder_only", "lm")])
def test_a_source_registered_in_a_test_loads_into_examples(toy_source, kind, fmt):
    cfg = datasets.DataConfig(name=toy_source, eval_split="dev", max_target_len=12)
    examples = datasets.load(cfg, kinds.get(kind), seed=3)
    assert toy_source in registry.names() and examples.format == fmt
    assert (len(examples.train), len(examples.eval)) == (12, 3)
    dev = _toy_pairs(registry.Request(cfg, "dev", 3, fmt))
    if fmt == "seq2seq":
        assert examples.references == [target for _, target in dev]
        assert examples.tokenizer.decode(examples.eval[0]["targets"]) == dev[0][1]
    else:
        assert examples.tokenizer.decode(examples.eval[0]["targets"]) == " | ".join(dev[0])
    packed_cfg = dataclasses.replace(cfg, pack=True, packed_target_len=24)
    packed = datasets.load(packed_cfg, kinds.get(kind), seed=3)
    assert len(packed.train) < len(examples.train)  # the shared path packs it like any source


def test_the_registered_source_is_validated_like_the_builtins(toy_source):
    with pytest.raises(ValueError, match=r"eval_split='test' is not a split of 'toy_reverse'"):
        datasets.DataConfig(name=toy_source)
    cfg = datasets.DataConfig(name=toy_source, eval_split="dev")
    with pytest.raises(ValueError, match=r"cannot train a model of kind 'encoder_only'"):
        datasets.load(cfg, kinds.get("encoder_only"), seed=0)
    with pytest.raises(ValueError, match=r"'toy_reverse' is already registered .*_toy_pairs"):
        registry.register("toy_reverse", formats=registry.PAIRS, splits=())(_toy_pairs)


def test_unknown_name_is_a_one_line_error_listing_the_sources(toy_source):
    with pytest.raises(ValueError) as error:
        datasets.DataConfig(name="tinyshakespear")
    message = str(error.value)
    assert "\n" not in message and "'tinyshakespear'" in message
    assert message.endswith(", ".join(registry.names()))
    assert toy_source in message  # the registry's names, not a list written down elsewhere


def test_a_source_check_runs_when_the_config_is_built():
    def needs_path(config):
        if not config.train_path:
            raise ValueError("toy_files needs data.train_path")

    registry.register("toy_files", formats=registry.TEXT, splits=("train",), check=needs_path)(
        lambda request: "a b c\n"
    )
    try:
        with pytest.raises(ValueError, match=r"toy_files needs data\.train_path"):
            datasets.DataConfig(name="toy_files", eval_split="train")
        cfg = datasets.DataConfig(name="toy_files", eval_split="train", train_path="x")
        with pytest.raises(ValueError, match=r"cannot train .* 'encoder_decoder'.* decoder_only"):
            datasets.load(cfg, kinds.get("encoder_decoder"), seed=0)
    finally:
        registry.unregister("toy_files")


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


def test_a_text_stream_from_a_pair_source_is_an_error():
    registry.register("toy_stream", formats=registry.PAIRS, splits=("train",))(
        lambda request: "a b c\n"
    )
    try:
        cfg = datasets.DataConfig(name="toy_stream", eval_split="train")
        with pytest.raises(ValueError, match="split 'train' is a text stream"):
            datasets.load(cfg, kinds.get("encoder_decoder"), seed=0)
    finally:
        registry.unregister("toy_stream")
