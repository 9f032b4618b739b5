"""BERT's masked-LM objective (`tfjax.training.mlm`) and MLM runs in the trainer.

Masking statistics over many tokens (15% selected, of which 80% masked, 10% random, 10% kept;
never padding or specials; per key deterministic), the loss against a reference written out
here, exact resume, and from-scratch runs with tfjax's own tokenizers.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import config_utils
from tfjax import errors
from tfjax.data import pipeline, tokenizers
from tfjax.runs import restoration, trainer, workdir_format
from tfjax.training import logger, mlm, steps

V = 1000
MASKING = mlm.Masking(mask_id=4, vocab_size=V, special_ids=(0, 1, 2, 3, 4), rate=0.15)


def _batch(rows: int = 256, width: int = 128, seed: int = 0) -> dict:
    """[CLS] words [SEP] then padding: ids 1 and 2 at each row's ends, 0 after them."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(width // 2, width + 1, rows)
    segment_ids = (np.arange(width)[None] < lengths[:, None]).astype(np.int32)
    tokens = rng.integers(5, V, (rows, width)).astype(np.int32)
    tokens[:, 0] = tokenizers.BOS_ID
    tokens[np.arange(rows), lengths - 1] = tokenizers.EOS_ID
    tokens[np.arange(rows), lengths // 2] = tokenizers.UNK_ID  # a special inside the text
    return {"inputs": tokens * segment_ids, "inputs_segment_ids": segment_ids}


_mask_batch = jax.jit(mlm.mask_batch, static_argnums=1)


def _masked(batch, key, first_row=0):
    out = _mask_batch(jax.tree.map(jnp.asarray, batch), MASKING, key, first_row=first_row)
    return np.asarray(out["inputs"]), np.asarray(out[mlm.WEIGHTS]) > 0


def test_masking_follows_berts_rates_and_never_selects_padding_or_specials():
    batch = _batch()
    tokens, segment_ids = batch["inputs"], batch["inputs_segment_ids"]
    masked, selected = _masked(batch, jax.random.key(0))
    candidates = (segment_ids > 0) & (tokens > 4)
    assert not (selected & ~candidates).any()
    counts = candidates.sum(1)
    wanted = np.round(np.float32(0.15) * counts.astype(np.float32))  # float32, as the step
    np.testing.assert_array_equal(selected.sum(1), np.maximum(wanted, 1))
    assert abs(selected.sum() / candidates.sum() - 0.15) < 0.005
    np.testing.assert_array_equal(masked[~selected], tokens[~selected])  # the rest untouched
    to_mask = masked[selected] == MASKING.mask_id
    kept = masked[selected] == tokens[selected]
    n = selected.sum()  # ~3,600 selected: the fractions' standard deviations are <= 0.007
    assert n > 3000
    assert abs(to_mask.mean() - 0.8) < 0.025, to_mask.mean()
    assert abs(kept.mean() - 0.1) < 0.02, kept.mean()
    assert abs((~to_mask & ~kept).mean() - 0.1) < 0.02  # a random token


def test_masking_is_deterministic_per_key_and_differs_across_steps():
    batch, key = _batch(rows=8), jax.random.key(3)
    first = _masked(batch, jax.random.fold_in(key, 1))
    again = _masked(batch, jax.random.fold_in(key, 1))
    other = _masked(batch, jax.random.fold_in(key, 2))
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[1], again[1])
    assert (first[1] != other[1]).any()


def test_masking_does_not_depend_on_how_the_batch_is_split_over_devices():
    batch, key = _batch(rows=8), jax.random.key(0)
    whole = _masked(batch, key)
    halves = [
        _masked({k: v[s] for k, v in batch.items()}, key, first_row=s.start)
        for s in (slice(0, 4), slice(4, 8))
    ]
    np.testing.assert_array_equal(whole[0], np.concatenate([h[0] for h in halves]))
    np.testing.assert_array_equal(whole[1], np.concatenate([h[1] for h in halves]))


def test_the_train_step_masks_by_seed_and_step():
    import optax

    from tfjax import models

    config = models.ModelConfig(
        kind="encoder_only",
        encoder_head="mlm",
        vocab_size=V,
        embed_dim=8,
        num_layers=1,
        num_heads=2,
        mlp_dim=16,
        max_len=32,
        dropout_rate=0.0,
    )
    model, optimizer = models.create_model(config), optax.sgd(0.0)  # no update: same params
    batch = jax.tree.map(jnp.asarray, _batch(rows=4, width=32))
    state = steps.create_train_state(model, optimizer, jax.random.key(0), batch, "encoder_only")
    schedule = optax.constant_schedule(0.0)
    train_step = steps.make_train_step(
        model, optimizer, schedule, kind="encoder_only", label_smoothing=0.0, masking=MASKING
    )
    step = jax.jit(train_step)

    def loss(state, seed):
        return float(step(state, batch, jax.random.key(seed))[1]["loss_sum"])

    first = loss(state, 1)
    assert loss(state, 1) == first  # same seed and step: same masks
    assert loss(state.replace(step=jnp.ones((), jnp.int32)), 1) != first  # the next step
    assert loss(state, 2) != first  # another seed


def test_evaluation_masks_an_example_the_same_in_any_batch():
    batch = _batch(rows=6)
    swapped = {k: v[::-1].copy() for k, v in batch.items()}
    masks = [mlm.mask_eval_batch(jax.tree.map(jnp.asarray, b), MASKING) for b in (batch, swapped)]
    np.testing.assert_array_equal(
        np.asarray(masks[0]["inputs"]), np.asarray(masks[1]["inputs"])[::-1]
    )
    assert np.asarray(masks[0][mlm.WEIGHTS]).sum() > 0


def test_the_mlm_loss_counts_only_the_selected_positions():
    logits = np.array(
        [
            [
                [2.0, 0.5, -1.0, 0.0, 1.0],
                [0.1, 0.2, 3.0, -0.5, 0.0],
                [1.5, -2.0, 0.3, 0.7, 0.2],
                [-1.0, 0.0, 0.5, 2.5, 1.0],
            ]
        ],
        np.float32,
    )  # [B=1, S=4, V=5]
    targets = np.array([[0, 2, 4, 1]], np.int32)
    selected = np.array([[0.0, 1.0, 0.0, 1.0]], np.float32)  # positions 1 and 3

    def log_softmax(row):
        return row - np.log(np.sum(np.exp(row)))

    expected = -(log_softmax(logits[0, 1])[2] + log_softmax(logits[0, 3])[1]) / 2
    batch = {mlm.TARGETS: jnp.asarray(targets), mlm.WEIGHTS: jnp.asarray(selected)}
    metrics = steps.batch_metrics(jnp.asarray(logits), batch, "encoder_only", label_smoothing=0.0)
    assert float(metrics["weight_sum"]) == 2.0
    np.testing.assert_allclose(metrics["loss_sum"] / metrics["weight_sum"], expected, rtol=1e-6)
    np.testing.assert_allclose(metrics["nll_sum"] / metrics["weight_sum"], expected, rtol=1e-6)
    assert float(metrics["correct_sum"]) == 1.0  # position 1's argmax is 2; position 3's is not 1
    hit = logits.copy()
    hit[0, 1, 2] = hit[0, 3, 1] = 9.0
    hit[0, 0], hit[0, 2] = -hit[0, 0], -hit[0, 2]  # unselected positions change nothing
    scored = steps.batch_metrics(jnp.asarray(hit), batch, "encoder_only", label_smoothing=0.0)
    assert float(scored["correct_sum"]) == 2.0


# ---------------------------------------------------------------------------------------------
# MLM runs in the trainer.

WORDS = "the a dog cat man runs reads sees old green red ball park field".split()


def _corpus(path) -> str:
    lines = [
        " ".join(WORDS[(3 * i + 5 * k) % len(WORDS)] for k in range(3 + i % 5)) for i in range(120)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _mlm_config(tmp_path, *overrides):
    return config_utils.load_config(
        "configs/classify.py:tiny",
        [
            "model.encoder_head=mlm",
            "data.name=files",
            f"data.train_path={_corpus(tmp_path / 'corpus.txt')}",
            "data.max_source_len=24",
            "train.eval_every_steps=0",
            *overrides,
        ],
    )


@pytest.mark.parametrize(
    "kind",
    [
        "word",
        pytest.param("char", marks=pytest.mark.slow),  # each run about 20 s on a busy CPU
        pytest.param("sentencepiece", marks=pytest.mark.slow),
    ],
)
def test_a_from_scratch_mlm_run_trains_with_tfjaxs_tokenizers(kind, tmp_path):
    lengths = ["data.max_source_len=48", "data.vocab_size=40"]
    config = _mlm_config(tmp_path, f"data.tokenizer={kind}", *lengths)
    result = trainer.train_and_evaluate(config, tmp_path / "run")
    assert np.isfinite(result["loss"]) and 0 <= result["accuracy"] <= 1
    assert np.isfinite(result["perplexity"])
    if kind == "sentencepiece":
        saved = tokenizers.SentencePieceTokenizer.load(tmp_path / "run" / "tokenizer.model")
        assert saved.mask_id == 4
    else:
        saved = json.loads((tmp_path / "run" / "tokenizer.json").read_text())
        assert saved["words"][4] == tokenizers.MASK_TOKEN
    train = logger.read_metrics(tmp_path / "run", "train")
    assert len(train) == 3 and all(np.isfinite(r["loss"]) for r in train)


@pytest.mark.slow  # three short runs: about 50 s on a busy 2-core CPU
def test_resuming_an_mlm_run_masks_and_trains_exactly_as_straight(tmp_path, monkeypatch):
    overrides = ("train.num_train_steps=4", "train.checkpoint_every_steps=2")
    trainer.train_and_evaluate(_mlm_config(tmp_path, *overrides), tmp_path / "straight")
    original_next = pipeline.BatchIterator.__next__
    calls = {"n": 0}

    def crash_after_three(self):
        calls["n"] += 1
        if calls["n"] > 3:
            raise KeyboardInterrupt("simulated kill")
        return original_next(self)

    monkeypatch.setattr(pipeline.BatchIterator, "__next__", crash_after_three)
    with pytest.raises(KeyboardInterrupt):
        trainer.train_and_evaluate(_mlm_config(tmp_path, *overrides), tmp_path / "resumed")
    monkeypatch.setattr(pipeline.BatchIterator, "__next__", original_next)
    trainer.train_and_evaluate(_mlm_config(tmp_path, *overrides), tmp_path / "resumed")

    def params(workdir):
        config = workdir_format.load_config_json(workdir / "config.json")
        return jax.tree.map(np.asarray, restoration.restore(config, workdir)[1].state.params)

    jax.tree.map(
        np.testing.assert_array_equal, params(tmp_path / "straight"), params(tmp_path / "resumed")
    )
    last = [logger.read_metrics(tmp_path / r, "train")[-1] for r in ("straight", "resumed")]
    assert last[0]["loss"] == last[1]["loss"]


def test_a_tokenizer_without_a_mask_token_is_one_config_error(tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    tokenizers.WordTokenizer.build(WORDS).save(workdir / "tokenizer.json")  # a classifier's
    with pytest.raises(errors.ConfigError) as info:
        trainer.train_and_evaluate(_mlm_config(tmp_path), workdir)
    assert "has no mask token" in str(info.value) and "\n" not in str(info.value)


def test_only_mlm_vocabularies_get_a_mask_token():
    plain = tokenizers.WordTokenizer.build(["b a a"])
    masked = tokenizers.WordTokenizer.build(["b a a"], mask=True)
    assert plain.words == (*tokenizers.SPECIAL_TOKENS, "a", "b") and plain.mask_id is None
    assert masked.words == (*tokenizers.SPECIAL_TOKENS, tokenizers.MASK_TOKEN, "a", "b")
    assert masked.mask_id == 4 and masked.special_ids == (0, 1, 2, 3, 4)
    chars = tokenizers.CharTokenizer.build(["ab"], mask=True)
    assert chars.mask_id == 4 and chars.encode("<") == [tokenizers.UNK_ID]


def test_sentencepiece_gets_a_mask_control_symbol_only_for_mlm():
    pytest.importorskip("sentencepiece")
    texts = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))]
    plain = tokenizers.SentencePieceTokenizer.build(texts, vocab_size=40)
    masked = tokenizers.SentencePieceTokenizer.build(texts, vocab_size=40, mask=True)
    assert plain.mask_id is None
    assert masked.mask_id == 4 and 4 not in masked.encode("the <mask> dog")


def test_a_row_with_few_candidates_gets_one_selected_and_one_without_none():
    # round(0.15 * n) is 0 for n = 1, 2, 3: the minimum of one is what selects a token there.
    tokens = np.array(
        [
            [1, 7, 2, 0, 0, 0],  # one candidate (7)
            [1, 7, 8, 2, 0, 0],  # two
            [1, 7, 3, 8, 9, 2],  # three, an UNK among them
            [1, 3, 2, 0, 0, 0],  # none: specials and padding only
        ],
        np.int32,
    )
    batch = {"inputs": tokens, "inputs_segment_ids": (tokens > 0).astype(np.int32)}
    candidates = tokens > 4
    for seed in range(3):
        _, selected = _masked(batch, jax.random.key(seed))
        np.testing.assert_array_equal(selected.sum(1), [1, 1, 1, 0])
        assert not (selected & ~candidates).any()


def _unknown_words_workdir(tmp_path):
    """A workdir whose tokenizer knows none of `_corpus`'s words: every token is [UNK]."""
    workdir = tmp_path / "run"
    workdir.mkdir()
    tokenizers.WordTokenizer.build(["zebra yak"], mask=True).save(workdir / "tokenizer.json")
    return workdir


def test_a_corpus_with_nothing_to_mask_is_refused_before_the_first_step(tmp_path):
    workdir = _unknown_words_workdir(tmp_path)
    with pytest.raises(errors.DataError) as info:
        trainer.train_and_evaluate(_mlm_config(tmp_path), workdir)
    message = str(info.value)
    assert "training split has no token" in message and "\n" not in message
    assert "unknown to the tokenizer" in message
    assert not (workdir / "checkpoints").exists() and not logger.read_metrics(workdir)


def test_a_run_that_scores_no_token_stops_at_its_first_log(tmp_path, monkeypatch):
    # Without the check at the start, every step's loss is 0/0: the first log must stop the run.
    monkeypatch.setattr(mlm, "check_maskable", lambda *args, **kwargs: None)
    workdir = _unknown_words_workdir(tmp_path)
    with pytest.raises(errors.DivergedError, match=r"no token was scored .* up to step 2"):
        trainer.train_and_evaluate(_mlm_config(tmp_path, "train.log_every_steps=2"), workdir)
    assert workdir_format.saved_steps(workdir) == []


def test_check_maskable_needs_one_candidate_in_the_split():
    unk, mask = tokenizers.UNK_ID, MASKING.mask_id
    rows = [
        {"inputs": np.array([1, unk, 2, 0]), "inputs_segment_ids": np.array([1, 1, 1, 0])},
        {"inputs": np.array([1, mask, 2, 0]), "inputs_segment_ids": np.array([1, 1, 1, 0])},
    ]
    with pytest.raises(errors.DataError, match=r"its 2 lines is unknown .* \(1 \[UNK\]\)"):
        mlm.check_maskable(rows, MASKING, split="training", unk_id=unk)
    with pytest.raises(errors.DataError, match=r"evaluation split .* only special tokens"):
        mlm.check_maskable(rows[1:], MASKING, split="evaluation", unk_id=unk)
    padded_word = {"inputs": np.array([1, 2, 9]), "inputs_segment_ids": np.array([1, 1, 0])}
    with pytest.raises(errors.DataError):  # a word in the padding is no candidate
        mlm.check_maskable([padded_word], MASKING, split="training", unk_id=unk)
    word = {"inputs": np.array([1, 9, 2]), "inputs_segment_ids": np.array([1, 1, 1])}
    mlm.check_maskable([*rows, word], MASKING, split="training", unk_id=unk)
    mlm.check_maskable([], MASKING, split="training", unk_id=unk)
