"""Evaluation on the host: text metrics (BLEU, chrF, exact match), perplexity, and decoding.

Text metrics are corpus-level sacreBLEU scores (Post 2018, "A Call for Clarity in Reporting BLEU
Scores") on detokenized text, with the settings `sacrebleu -tok 13a` reports: BLEU with the 13a
tokenizer, case-sensitive, exponential smoothing; chrF2 (Popović 2015: character 6-grams, no
word n-grams, beta 2). Report them with `bleu_signature()` / `chrf_signature()`. sacrebleu is
imported inside the functions that need it, so importing this module stays cheap.

`make_decoder` returns a jitted batch decoder for the seq2seq model of a run (a
`tfjax.runs.restoration.restore` result): greedy search (`decoding.generate`) or beam search
(`beam_search.beam_search`, best hypothesis). `decode_dataset` runs it over the run's eval
examples and detokenizes hypotheses, references (the targets) and sources with the run's
tokenizer; `decode_sources` does the same for token ids from elsewhere (e.g.
`tfjax.runs.trained.Translator`). Both run on one host: every example goes through this process.
"""

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int

from tfjax.data import pipeline
from tfjax.inference import beam_search, decoding
from tfjax.nn import losses

# Decoder: (params, inputs [B, S], inputs_segment_ids [B, S]) -> best hypothesis [B, L] int32.
Decoder = Callable[[Any, Any, Any], Any]


def _check_corpus(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    """Raises ValueError unless both are equally long, non-empty lists of strings."""
    if isinstance(hypotheses, str) or isinstance(references, str):
        raise ValueError(
            "hypotheses and references must be sequences of sentences, got a single string: "
            "wrap one sentence in a list"
        )
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} hypotheses but {len(references)} references: pass exactly one "
            "reference per hypothesis, in the same order"
        )
    if not hypotheses:
        raise ValueError("no sentences to score: pass at least one hypothesis and reference")


def _bleu_metric():
    from sacrebleu.metrics import BLEU

    # Spelled out (they are sacrebleu's defaults) because the reported numbers depend on them.
    return BLEU(tokenize="13a", lowercase=False, smooth_method="exp")


def _chrf_metric():
    from sacrebleu.metrics import CHRF

    return CHRF(char_order=6, word_order=0, beta=2)


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus BLEU in [0, 100] of detokenized sentences, as `sacrebleu -tok 13a` reports it.

    Args:
        hypotheses: one detokenized output per sentence.
        references: one detokenized reference per sentence, aligned with `hypotheses`.

    Returns:
        sacreBLEU's corpus score (13a tokenizer, cased, exponential smoothing).

    Raises:
        ValueError: if the lengths differ, the corpus is empty or a single string is passed.
    """
    _check_corpus(hypotheses, references)
    return float(_bleu_metric().corpus_score(list(hypotheses), [list(references)]).score)


def chrf(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus chrF2 in [0, 100] of detokenized sentences (sacreBLEU's `corpus_chrf`).

    Raises:
        ValueError: as `bleu`.
    """
    _check_corpus(hypotheses, references)
    return float(_chrf_metric().corpus_score(list(hypotheses), [list(references)]).score)


def _signature(metric) -> str:
    # sacrebleu only knows the number of references after scoring a corpus; the signature
    # depends on the settings and that number (one reference per sentence here) alone.
    metric.corpus_score(["a"], [["a"]])
    return str(metric.get_signature())


def bleu_signature() -> str:
    """sacreBLEU's signature of `bleu`, e.g. "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|..."."""
    return _signature(_bleu_metric())


def chrf_signature() -> str:
    """sacreBLEU's signature of `chrf`, e.g. "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|..."."""
    return _signature(_chrf_metric())


def exact_match(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Fraction of hypotheses equal to their reference, whitespace runs counting as one space.

    Raises:
        ValueError: as `bleu`.
    """
    _check_corpus(hypotheses, references)
    same = [h.split() == r.split() for h, r in zip(hypotheses, references, strict=True)]
    return sum(same) / len(same)


def perplexity(nll_sum: losses.HostScalar, token_count: losses.HostScalar) -> float:
    """exp(nll_sum / token_count): the perplexity of `token_count` tokens (inf on overflow).

    Raises:
        ValueError: if `token_count` is not positive.
    """
    if not token_count > 0:
        raise ValueError(f"token_count must be > 0 to average the NLL over, got {token_count}")
    mean = float(nll_sum) / float(token_count)
    return float(np.exp(mean)) if mean < np.log(np.finfo(np.float64).max) else float("inf")


# Search options beside beam_size and alpha (`beam_search.beam_search`); greedy decoding takes
# the last two.
SEARCH_OPTIONS = ("penalty", "stopping", "forbidden_ids", "force_eos")
_GREEDY_OPTIONS = ("forbidden_ids", "force_eos")


@functools.partial(
    jax.jit, static_argnames=("model", "beam_size", "alpha", "max_length", "eos_id", "search")
)
def _decode_best(
    params: Any,
    inputs: Int[Array, "B S"],
    inputs_segment_ids: Int[Array, "B S"],
    *,
    model: nn.Module,
    beam_size: int,
    alpha: float,
    max_length: int,
    eos_id: int,
    search: tuple = (),
    lengths: Int[Array, " B"] | None = None,
) -> Int[Array, "B L"]:
    """The best hypothesis per source; jit caches one program per model, options and shape."""
    options = dict(max_length=max_length, eos_id=eos_id, bos_id=model.config.bos_id)
    search = dict(search)
    if beam_size == 1:
        greedy = {k: v for k, v in search.items() if k in _GREEDY_OPTIONS}
        return decoding.generate(
            model,
            params,
            inputs=inputs,
            inputs_segment_ids=inputs_segment_ids,
            lengths=lengths,
            **options,
            **greedy,
        )
    if lengths is not None:
        raise ValueError("oracle lengths are for greedy decoding (beam_size 1)")
    tokens, _ = beam_search.beam_search(
        model,
        params,
        inputs,
        inputs_segment_ids=inputs_segment_ids,
        beam_size=beam_size,
        alpha=alpha,
        num_return=1,
        **options,
        **search,
    )  # [B, 1, L]
    return tokens[:, 0]  # [B, L]


def _search_key(search: dict | None) -> tuple:
    """`search` as a hashable jit argument (lists become tuples); unknown keys are refused."""
    search = dict(search or {})
    unknown = sorted(set(search) - set(SEARCH_OPTIONS))
    if unknown:
        raise ValueError(f"unknown search options {unknown}: choose from {SEARCH_OPTIONS}")
    return tuple(
        sorted((k, tuple(v) if isinstance(v, list | tuple) else v) for k, v in search.items())
    )


def make_decoder(
    run: Any,
    *,
    beam_size: int = 1,
    alpha: float = 0.6,
    max_length: int,
    search: dict | None = None,
) -> Decoder:
    """A jitted decoder for the seq2seq model of `run`.

    Args:
        run: a seq2seq run from `tfjax.runs.restoration.restore`.
        beam_size: 1 decodes greedily with `decoding.generate`; k > 1 runs beam search with k
            beams and keeps the best hypothesis.
        alpha: the beam search length penalty ((5 + length) / 6) ** alpha (Wu et al. 2016).
        max_length: L, the target positions to produce (EOS included).
        search: more `beam_search.beam_search` options (`SEARCH_OPTIONS`), e.g. a converted
            checkpoint's (`tfjax.runs.trained.decoding_defaults`); None: the defaults.

    Returns:
        `decode(params, inputs, inputs_segment_ids, lengths=None) -> tokens`: inputs and
        segment ids [B, S] int32, tokens [B, L] int32 with 0 after the first EOS; greedy
        decoders take oracle output lengths [B] (`decoding.generate`). Decoders of equal models
        and options share compiled programs.

    Raises:
        ValueError: for a run that is not seq2seq, beam_size < 1 or max_length < 1.
    """
    _check_seq2seq(run)
    if beam_size < 1 or max_length < 1:
        raise ValueError(f"need beam_size >= 1 and max_length >= 1, got {beam_size}, {max_length}")
    alpha = float(alpha) if beam_size > 1 else 0.0  # greedy ignores alpha: one program for all
    return functools.partial(
        _decode_best,
        model=run.model,
        beam_size=beam_size,
        alpha=alpha,
        max_length=max_length,
        eos_id=run.examples.tokenizer.eos_id,
        search=_search_key(search),
    )


def _check_seq2seq(run: Any) -> None:
    if run.examples.format != "seq2seq":
        raise ValueError(
            f"this run trains a {run.model_config.kind} model on {run.examples.format!r} "
            "examples; decoding sources needs an encoder_decoder (seq2seq) run"
        )


def _decode_batches(
    run: Any,
    params: Any,
    examples: Sequence[pipeline.Example],
    *,
    beam_size: int,
    alpha: float,
    max_length: int | None,
    batch_size: int,
    search: dict | None = None,
    oracle_length: bool = False,
) -> Iterator[tuple[pipeline.Example, np.ndarray]]:
    """Yields (batch without its padding rows, their decoded tokens [B', L]) in example order.

    With `oracle_length` each row ends with EOS where its target does (greedy only).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if oracle_length and beam_size != 1:
        raise ValueError(f"oracle lengths are for greedy decoding, got beam_size {beam_size}")
    length = max_length or run.config.data.max_target_len
    decode = make_decoder(run, beam_size=beam_size, alpha=alpha, max_length=length, search=search)
    dataset = pipeline.make_dataset(
        examples,
        batch_size=min(batch_size, len(examples)),
        seed=0,
        shuffle=False,
        repeat=False,
        drop_remainder=False,
    )
    for batch in dataset:
        rows = batch["inputs_segment_ids"].any(axis=1)  # [B]: padding rows are all zeros
        inputs = jnp.asarray(batch["inputs"])
        lengths = None
        if oracle_length:  # the target's EOS position: its tokens before the EOS
            lengths = jnp.asarray(_eos_positions(batch["targets"], run.examples.tokenizer.eos_id))
        tokens = np.asarray(
            decode(params, inputs, jnp.asarray(batch["inputs_segment_ids"]), lengths=lengths)
        )
        yield {key: value[rows] for key, value in batch.items()}, tokens[rows]


def _eos_positions(targets: np.ndarray, eos_id: int) -> np.ndarray:
    """[B] int32: the index of each row's first EOS (rows without one: their length)."""
    is_eos = np.asarray(targets) == eos_id  # [B, L]
    return np.where(is_eos.any(axis=1), is_eos.argmax(axis=1), is_eos.shape[1]).astype(np.int32)


def decode_dataset(
    run: Any,
    params: Any,
    *,
    beam_size: int = 1,
    alpha: float = 0.6,
    batch_size: int = 64,
    max_examples: int = 0,
    max_length: int | None = None,
    search: dict | None = None,
    oracle_length: bool = False,
) -> tuple[list[str], list[str], list[str]]:
    """Decodes the eval examples of a seq2seq run and detokenizes them.

    Args:
        run: a seq2seq run (`tfjax.runs.restoration.restore`); its `examples.eval` are decoded
            in order.
        params: the model parameters (e.g. `restored.state.params`).
        beam_size, alpha: see `make_decoder`.
        batch_size: sources per decoding call (the last batch is padded).
        max_examples: decode only the first N examples (0 = all).
        max_length: target positions to produce (default: `config.data.max_target_len`).
        search: more search options (`make_decoder`).
        oracle_length: greedy decoding that ends each hypothesis where its reference ends
            (`decoding.generate`'s `lengths`): an analysis aid, not a result to report alone.

    Returns:
        (hypotheses, references, sources), one detokenized string per example; references are
        the raw target texts when the data keeps them (`Examples.references`: corpora and
        files), else the targets after tokenization (words outside the vocabulary read "<unk>").

    Raises:
        ValueError: for a run that is not seq2seq or invalid sizes.
    """
    _check_seq2seq(run)
    if max_examples < 0:
        raise ValueError(f"max_examples must be >= 0 (0 = all), got {max_examples}")
    examples = run.examples.eval[:max_examples] if max_examples else run.examples.eval
    decode = run.examples.tokenizer.decode
    hypotheses, references, sources = [], [], []
    for batch, tokens in _decode_batches(
        run,
        params,
        examples,
        beam_size=beam_size,
        alpha=alpha,
        max_length=max_length,
        batch_size=batch_size,
        search=search,
        oracle_length=oracle_length,
    ):
        hypotheses += [decode(row) for row in tokens]
        references += [decode(row) for row in batch["targets"]]
        sources += [decode(row) for row in batch["inputs"]]
    if run.examples.references is not None:
        references = list(run.examples.references[: len(references)])
    return hypotheses, references, sources


def decode_sources(
    run: Any,
    params: Any,
    sources: Sequence[Sequence[int]],
    *,
    beam_size: int = 1,
    alpha: float = 0.6,
    batch_size: int = 64,
    max_length: int | None = None,
    search: dict | None = None,
) -> list[str]:
    """Decodes encoded sources with the seq2seq model of `run`; returns detokenized outputs.

    Args:
        run, params, beam_size, alpha, batch_size, max_length, search: as in `decode_dataset`.
        sources: token ids of each source, EOS included, each 1 to `config.data.max_source_len`
            ids long (truncate longer ones first).

    Returns:
        One detokenized hypothesis per source, in order.

    Raises:
        ValueError: for an empty or too long source, or as `decode_dataset`.
    """
    _check_seq2seq(run)
    length = run.config.data.max_source_len
    examples = []
    for i, ids in enumerate(sources):
        if not 0 < len(ids) <= length:
            raise ValueError(
                f"source {i} has {len(ids)} ids; the model takes 1 to {length} (EOS included): "
                "truncate long sources and leave out empty ones"
            )
        inputs = np.zeros(length, np.int32)  # [S]
        inputs[: len(ids)] = ids
        segment_ids = (np.arange(length) < len(ids)).astype(np.int32)  # [S]
        examples.append({"inputs": inputs, "inputs_segment_ids": segment_ids})
    if not examples:
        return []
    decode = run.examples.tokenizer.decode
    outputs = []
    for _, tokens in _decode_batches(
        run,
        params,
        examples,
        beam_size=beam_size,
        alpha=alpha,
        max_length=max_length,
        batch_size=batch_size,
        search=search,
    ):
        outputs += [decode(row) for row in tokens]
    return outputs
