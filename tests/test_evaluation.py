"""tfjax.inference.evaluation: sacreBLEU metrics, exact match, perplexity and dataset decoding.

sacrebleu's own `corpus_bleu` / `corpus_chrf` are the independent references for the text
metrics; the uncached `decoding.greedy_decode` is the reference for greedy dataset decoding.
Decoding runs on a freshly initialised tiny encoder-decoder (no training needed: only the
plumbing between batches, decoder and tokenizer is under test).
"""

import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sacrebleu

from tfjax import models
from tfjax.data import datasets, tokenizers
from tfjax.inference import decoding, evaluation
from tfjax.models import kinds

HYPOTHESES = [
    "The cat sat on the mat.",
    "There is a dog in the garden!",
    'He said, "hello" to everyone',
    "completely unrelated words here",
]
REFERENCES = [
    "The cat sat on a mat.",
    "A dog is in the garden!",
    'He said "hello" to everybody.',
    "nothing in common at all",
]


def test_bleu_and_chrf_equal_sacrebleu_corpus_scores():
    assert evaluation.bleu(HYPOTHESES, REFERENCES) == pytest.approx(
        sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score, abs=1e-9
    )
    assert evaluation.chrf(HYPOTHESES, REFERENCES) == pytest.approx(
        sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES]).score, abs=1e-9
    )


def test_bleu_by_hand():
    # 1- to 4-gram precisions 5/6, 3/5, 2/4, 1/3; same length, so no brevity penalty.
    score = evaluation.bleu(["the cat sat on the mat"], ["the cat sat on a mat"])
    assert score == pytest.approx(100 * (5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25)


def test_perfect_and_empty_hypotheses():
    assert evaluation.bleu(REFERENCES, REFERENCES) == pytest.approx(100.0)
    assert evaluation.chrf(REFERENCES, REFERENCES) == pytest.approx(100.0)
    assert evaluation.bleu(["", ""], REFERENCES[:2]) == 0.0
    assert evaluation.chrf(["", ""], REFERENCES[:2]) == 0.0


def test_bleu_tokenizes_13a_and_is_cased():
    # 13a splits punctuation off words, so pre-tokenized and detokenized text score the same.
    assert evaluation.bleu(["Hello , world !"], ["Hello, world!"]) == pytest.approx(100.0)
    assert evaluation.bleu(["hello, world!"], ["Hello, world!"]) < 100.0


def test_signatures_name_the_settings():
    for part in ("nrefs:1", "case:mixed", "tok:13a", "smooth:exp", "version:"):
        assert part in evaluation.bleu_signature()
    for part in ("nrefs:1", "nc:6", "nw:0"):
        assert part in evaluation.chrf_signature()


@pytest.mark.parametrize("metric", [evaluation.bleu, evaluation.chrf, evaluation.exact_match])
def test_corpus_errors(metric):
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        metric(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="single string"):
        metric("a b", "a b")
    with pytest.raises(ValueError, match="no sentences"):
        metric([], [])


def test_exact_match_normalises_whitespace():
    hypotheses = ["a b", " a  b ", "c", "A b"]
    references = ["a b", "a b", "d", "a b"]
    assert evaluation.exact_match(hypotheses, references) == 0.5


def test_perplexity():
    assert evaluation.perplexity(4 * math.log(5.0), 4) == pytest.approx(5.0)
    assert evaluation.perplexity(np.float32(0.0), np.float32(3)) == 1.0
    assert evaluation.perplexity(1e6, 1) == math.inf
    with pytest.raises(ValueError, match="token_count must be > 0"):
        evaluation.perplexity(1.0, 0)


# ---------------------------------------------------------------------------------------------
# Decoding a dataset.

MAX_SOURCE_LEN, MAX_TARGET_LEN = 8, 8


@pytest.fixture(scope="module")
def tiny_run():
    """A stand-in for `restoration.restore(...)[0]` with freshly initialised parameters."""
    data = datasets.DataConfig(
        name="reverse",
        num_train_examples=32,
        num_eval_examples=11,  # not a multiple of the batch sizes below: padded last batch
        task_max_len=6,
        max_source_len=MAX_SOURCE_LEN,
        max_target_len=MAX_TARGET_LEN,
    )
    examples = datasets.load(data, kinds.get("encoder_decoder"), seed=0)
    model_config = models.ModelConfig(
        vocab_size=examples.tokenizer.vocab_size,
        embed_dim=16,
        num_layers=1,
        num_decoder_layers=1,
        num_heads=2,
        mlp_dim=32,
        dropout_rate=0.0,
    )
    model = models.create_model(model_config)
    first = examples.eval[0]
    params = model.init(
        jax.random.key(0), jnp.asarray(first["inputs"][None]), jnp.asarray(first["targets"][None])
    )["params"]
    config = types.SimpleNamespace(data=data)
    run = types.SimpleNamespace(
        config=config, model=model, model_config=model_config, examples=examples
    )
    return run, params


def _reference_greedy(run, params, examples):
    inputs = jnp.asarray(np.stack([e["inputs"] for e in examples]))
    segments = jnp.asarray(np.stack([e["inputs_segment_ids"] for e in examples]))
    tokens = decoding.greedy_decode(
        run.model,
        params,
        inputs,
        inputs_segment_ids=segments,
        max_length=MAX_TARGET_LEN,
        eos_id=tokenizers.EOS_ID,
    )
    return [run.examples.tokenizer.decode(row) for row in np.asarray(tokens)]


def test_greedy_decode_dataset_matches_the_uncached_reference(tiny_run):
    run, params = tiny_run
    hypotheses, references, sources = evaluation.decode_dataset(run, params, batch_size=4)
    examples, decode = run.examples.eval, run.examples.tokenizer.decode
    assert len(hypotheses) == len(examples) == 11
    assert hypotheses == _reference_greedy(run, params, examples)
    assert references == [decode(e["targets"]) for e in examples]
    assert sources == [decode(e["inputs"]) for e in examples]


def test_decode_dataset_max_examples_and_decode_sources(tiny_run):
    run, params = tiny_run
    hypotheses, _, _ = evaluation.decode_dataset(run, params, batch_size=2, max_examples=3)
    assert len(hypotheses) == 3
    sources = [
        [int(t) for t in e["inputs"][e["inputs_segment_ids"] > 0]] for e in run.examples.eval[:3]
    ]
    assert evaluation.decode_sources(run, params, sources, batch_size=2) == hypotheses


def test_beam_search_keeps_the_best_hypothesis(tiny_run):
    from tfjax.inference import beam_search

    run, params = tiny_run
    hypotheses, _, _ = evaluation.decode_dataset(
        run, params, beam_size=3, batch_size=3, max_examples=4
    )
    examples = run.examples.eval[:4]
    tokens, scores = beam_search.beam_search(
        run.model,
        params,
        jnp.asarray(np.stack([e["inputs"] for e in examples])),
        inputs_segment_ids=jnp.asarray(np.stack([e["inputs_segment_ids"] for e in examples])),
        beam_size=3,
        max_length=MAX_TARGET_LEN,
        eos_id=tokenizers.EOS_ID,
        num_return=3,
    )
    assert np.all(np.diff(np.asarray(scores), axis=1) <= 1e-6)  # best first
    assert hypotheses == [run.examples.tokenizer.decode(row) for row in np.asarray(tokens)[:, 0]]


def test_decoding_errors(tiny_run):
    run, params = tiny_run
    with pytest.raises(ValueError, match="source 1 has 9 ids"):
        evaluation.decode_sources(run, params, [[5, 2], [5] * 8 + [2]])
    with pytest.raises(ValueError, match="source 0 has 0 ids"):
        evaluation.decode_sources(run, params, [[]])
    lm_run = types.SimpleNamespace(
        examples=types.SimpleNamespace(format="lm"),
        model_config=types.SimpleNamespace(kind="decoder_only"),
    )
    with pytest.raises(ValueError, match="needs an encoder_decoder"):
        evaluation.decode_dataset(lm_run, params)
    with pytest.raises(ValueError, match="beam_size >= 1"):
        evaluation.make_decoder(run, beam_size=0, max_length=4)


def test_greedy_exact_match_counts_the_real_rows_of_a_padded_last_batch():
    """`tfjax.runs.evaluator.evaluate` on 6 examples in batches of 4: the last batch holds 2
    examples and 2 padding rows. A decoder stub answers every example but one correctly (its
    answers looked up by input), so greedy exact match is 5 / 6, the padding rows counting
    neither as right nor as rows."""
    import ml_collections

    from tfjax.runs import build, evaluator

    rng = np.random.default_rng(0)
    examples, answers = [], {}
    for index in range(6):
        length = 2 + index % 3
        source, target = np.zeros(6, np.int32), np.zeros(6, np.int32)
        source[: length + 1] = rng.integers(3, 20, length + 1)
        target[:length] = rng.integers(3, 20, length)
        examples.append(
            {
                "inputs": source,
                "inputs_segment_ids": (source > 0).astype(np.int32),
                "targets": target,
                "targets_segment_ids": (target > 0).astype(np.int32),
            }
        )
        answer = target.copy()
        if index == 4:  # the one wrong answer, in the padded batch
            answer[0] += 1
        answers[source.tobytes()] = answer

    def greedy(params, inputs, segment_ids):  # padding rows (all zeros) answer nothing
        return np.stack([answers.get(row.tobytes(), np.zeros(6, np.int32)) for row in inputs])

    def eval_step(params, batch):
        return {"weight_sum": float((batch["targets_segment_ids"] > 0).sum()), "loss_sum": 0.0}

    run = build.Evaluable(
        config=ml_collections.ConfigDict({"train": {"eval_batch_size": 4}}),
        model_config=models.ModelConfig(),
        model=models.create_model(models.ModelConfig()),  # never called: the steps are fakes
        examples=datasets.Examples([], examples, tokenizers.WordTokenizer.build(["a"]), "seq2seq"),
        eval_step=eval_step,
        greedy=greedy,
    )
    result = evaluator.evaluate(run, params=None)
    assert result["greedy_exact_match"] == pytest.approx(5 / 6)
