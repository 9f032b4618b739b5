"""A trained model restored from its workdir: encode, decode and detokenize.

    from tfjax.runs import trained
    translator = trained.load("runs/multi30k_cpu")          # encoder-decoder -> Translator
    outputs, warnings = translator.translate(["A dog runs."], beam_size=4)
    generator = trained.load("runs/shakespeare_char_cpu")   # decoder-only -> Generator
    texts, warnings = generator.generate(["ROMEO:"], max_length=200, temperature=0.8)

`load` reads `config.json`, checks the model kind, rebuilds the run (model, the saved tokenizer;
a data split is read only when something uses it, e.g. evaluation) and restores a checkpoint
(the latest good one, a given step, or the average of the last N). The object it returns holds
the run and its parameters and has `encode` (text → ids, with warnings for empty, too long or
out-of-vocabulary input), `decode` (ids → ids, KV-cached greedy, sampling or beam search) and
`detokenize` (ids → text), for every tokenizer kind (word, char, SentencePiece).
`experiments.translate`, `experiments.generate` and `experiments.evaluate` are thin command-line
wrappers over it. Every error a user can cause is a `WorkdirError` whose one-line message says
what is wrong and what to run instead.
"""

import dataclasses
import functools
import json
import pathlib
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from tfjax import errors
from tfjax.data import datasets, sources, tokenizers
from tfjax.inference import attention_maps, decoding, evaluation
from tfjax.models import kinds as kinds_lib
from tfjax.runs import build, restoration, workdir_format

# A request a workdir cannot serve (a `tfjax.errors.UserError`, and a ValueError); defined in
# `tfjax.errors` so that the training side (`tfjax.runs.lock`) raises the same class.
WorkdirError = errors.WorkdirError
# Warn (`empty_outputs`) when more than this share of the decoded outputs is empty.
EMPTY_SHARE = 0.5
# How a converted checkpoint decodes (its generation_config.json in tfjax's search options):
# the defaults of `experiments.translate` and `evaluate` on the workdir (`decoding_defaults`).
DECODING_FILE = "hf_decoding.json"


def _train_hint(workdir: pathlib.Path, kind: str) -> str:
    return (
        "train one first, e.g. python -m experiments.train "
        f"--config={kinds_lib.get(kind).train_example} "
        f"--workdir={workdir} (rerunning that command resumes an interrupted run)"
    )


def load_config(workdir: str | pathlib.Path, *, kinds: Sequence[str] | None = None, tool: str = ""):
    """The resolved config of the run in `workdir`, checked to hold a model of `kinds`.

    Args:
        workdir: the run directory given to `experiments.train`.
        kinds: the model kinds the caller can use (None: every registered kind; e.g.
            `tfjax.models.kinds.names(facade="translator")`).
        tool: the caller, e.g. "experiments.translate", named in messages.

    Returns:
        The locked config read from `workdir/config.json`.

    Raises:
        WorkdirError: if the workdir is a file, or holds no config or a model of another kind.
    """
    workdir = pathlib.Path(workdir)
    kinds = kinds_lib.names() if kinds is None else tuple(kinds)
    path = workdir / "config.json"
    if workdir.exists() and not workdir.is_dir():
        raise WorkdirError(
            f"{workdir} is a file, not a workdir: pass the directory that experiments.train "
            "trained into"
        )
    if not path.is_file():
        raise WorkdirError(
            f"{workdir} holds no trained run ({path} is missing): {_train_hint(workdir, kinds[0])}"
        )
    config = workdir_format.load_config_json(path)
    kind = config.model.kind
    if kind not in kinds:
        raise WorkdirError(
            f"{workdir} holds a model of kind {kind}, but {tool or 'this'} needs one of kind "
            f"{' or '.join(kinds)}: use python -m {kinds_lib.get(kind).tool} --workdir={workdir}"
        )
    return config


def _select_split(config, split: str | None) -> None:
    """Points `config.data.eval_split` at `split`, checked against the dataset's splits."""
    if split is None:
        return
    named = datasets.eval_splits(config.data.name)
    allowed = tuple(dict.fromkeys((config.data.eval_split, *named, "train")))
    if named and split not in allowed:
        raise WorkdirError(f"unknown split {split!r}: choose one of {', '.join(allowed)}")
    config.data.eval_split = split  # a locked config still takes new values for its keys


@dataclasses.dataclass
class Trained:
    """A run restored from its workdir: the built run, its parameters and the checkpoint step.

    Attributes:
        run: `tfjax.runs.build.Run` (model, examples with the tokenizer, eval step, config).
        params: the model parameters of the checkpoint.
        step: the step the checkpoint was saved at.
        workdir: where the run lives.
    """

    run: build.Run
    params: Any
    step: int
    workdir: pathlib.Path

    @property
    def config(self):
        return self.run.config

    @property
    def tokenizer(self) -> tokenizers.Tokenizer:
        return self.run.examples.tokenizer

    @property
    def decoding(self) -> dict:
        """The decoding options of a converted checkpoint (beam_size, alpha, max_length and
        `evaluation.SEARCH_OPTIONS`; `decoding_defaults`), {} for others."""
        return decoding_defaults(self.workdir)

    def search_options(
        self, beam_size: int | None, alpha: float | None, max_length: int | None
    ) -> dict:
        """beam_size, alpha, max_length and `search` for `evaluation`: the given values, else
        the workdir's `decoding` (a converted checkpoint's), else 4, 0.6 and the trained
        length `data.max_target_len`. A checkpoint's max_length is capped at the trained
        length (OPUS-MT's 511 would size the cache for nothing; pass max_length for more)."""
        defaults, trained = self.decoding, self.config.data.max_target_len
        if max_length is None:  # 0 stays 0: `check_length` refuses it as it does -5
            max_length = min(defaults.get("max_length", trained), trained)
        return {
            "beam_size": defaults.get("beam_size", 4) if beam_size is None else beam_size,
            "alpha": defaults.get("alpha", 0.6) if alpha is None else alpha,
            "max_length": max_length,
            "search": {k: v for k, v in defaults.items() if k in evaluation.SEARCH_OPTIONS},
        }

    def detokenize(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text of token ids; decoding stops at the first EOS (any tokenizer kind)."""
        return self.tokenizer.decode(ids)

    def check_length(self, max_length: int, what: str = "max_length") -> None:
        """Raises WorkdirError unless the model can decode `max_length` positions."""
        try:
            decoding.check_lengths(self.run.model, max_length)
        except ValueError as err:
            raise WorkdirError(f"{what}={max_length}: {err}") from err

    def attention(self, text: str, *, beam_size: int = 1) -> tuple[attention_maps.Maps, str]:
        """Every attention map of the model on `text`, and the text the maps are of.

        An encoder-decoder translates `text` (greedy, or beam search with `beam_size`) and
        the maps are those of that translation, teacher-forced (`attention_maps.example_maps`:
        cross-attention rows are the output tokens, columns the source tokens); the second
        value is the translation. A decoder-only model reads `text` as a prompt, an
        encoder-only model as its input (BOS first, as it was trained); the second value is
        `text` itself.

        Raises:
            WorkdirError: for an empty text, or one longer than the model reads.
        """
        if not text.split():
            raise WorkdirError("the text is empty: give a sentence to look at")
        model, tokenizer = self.run.model, self.tokenizer
        kind = kinds_lib.get(self.config.model.kind)
        if kind.decoding == "source":
            (source,), _ = self.encode([text])  # a Translator: EOS appended, truncated to fit
            length = self.config.data.max_target_len
            decode = evaluation.make_decoder(self.run, beam_size=beam_size, max_length=length)
            segment_ids = np.ones((1, len(source)), np.int32)
            tokens = decode(self.params, np.asarray([source], np.int32), segment_ids)
            target = attention_maps.until_eos(np.asarray(tokens)[0], self.tokenizer.eos_id)
            maps = attention_maps.example_maps(
                model, self.params, tokenizer, inputs=source, targets=target
            )
            return maps, self.detokenize(target)
        ids = tokenizer.encode(text, add_bos=kind.data_format == "classify")
        (key,) = kind.fields  # one stack: its field and its length limit
        limit = self.config.data[kind.lengths[0]]
        if len(ids) > limit:
            raise WorkdirError(
                f"the text has {len(ids)} tokens, more than the model reads ({limit}): shorten it"
            )
        return attention_maps.example_maps(model, self.params, tokenizer, **{key: ids}), text

    def attention_statistics(
        self, num_examples: int | None = None, *, batch_size: int = 64
    ) -> dict[str, dict[str, float]]:
        """Per attention layer, the mean entropy, largest weight and logit spread of its rows
        over the eval split's examples (the first `num_examples`; all when None), teacher-forced
        (`attention_maps.statistics`). Any model kind.

        Raises:
            WorkdirError: for num_examples < 1, or a run without eval examples.
        """
        if num_examples is not None and num_examples < 1:
            raise WorkdirError(f"num_examples={num_examples}: give at least 1 (or all of them)")
        examples = self.run.examples.eval[:num_examples]
        if not examples:
            raise WorkdirError("this run has no eval examples to summarise attention over")
        return attention_maps.statistics(
            self.run.model, self.params, examples, batch_size=batch_size
        )


def unknown_words(text: str, tokenizer: tokenizers.Tokenizer) -> list[str]:
    """The whitespace-separated words of `text` that encode to <unk> in part, any tokenizer.

    Checked word by word, because a SentencePiece or character tokenizer gives a different
    number of ids than there are words.
    """
    return sorted({w for w in text.split() if tokenizer.unk_id in tokenizer.encode(w)})


class Translator(Trained):
    """An encoder-decoder run: `translate` lines, or `encode` / `decode` / `detokenize`."""

    def encode(self, lines: Sequence[str]) -> tuple[list[list[int] | None], list[str]]:
        """Source ids of each line (EOS appended, truncated to fit), None for blank lines.

        Returns:
            (ids per line or None, warnings naming 1-based line numbers): a blank line, a line
            longer than the model reads (`data.max_source_len`, EOS included; truncated to its
            first ids), and the first line with words outside the vocabulary (read as <unk>).
        """
        limit = self.config.data.max_source_len
        encoded, warnings, unknown_reported = [], [], False
        for number, line in enumerate(lines, start=1):
            if not line.split():
                warnings.append(f"line {number} is empty: its output line is empty too")
                encoded.append(None)
                continue
            ids = self.tokenizer.encode(line)
            if self.tokenizer.unk_id in ids and not unknown_reported:
                unknown_reported = True
                warnings.append(
                    f"line {number}: {', '.join(unknown_words(line, self.tokenizer))} not in the "
                    "model's vocabulary, read as <unk> (reported for the first such line only)"
                )
            if len(ids) >= limit:
                warnings.append(
                    f"line {number} has {len(ids)} tokens, but the model reads at most "
                    f"{limit - 1} (data.max_source_len={limit} with EOS): truncated to its "
                    f"first {limit - 1} tokens"
                )
                ids = ids[: limit - 1]
            encoded.append([*ids, self.tokenizer.eos_id])
        return encoded, warnings

    def decode(
        self,
        sources: Sequence[Sequence[int]],
        *,
        beam_size: int | None = None,
        alpha: float | None = None,
        max_length: int | None = None,
        batch_size: int = 64,
    ) -> list[str]:
        """Detokenized translations of encoded sources (see `evaluation.decode_sources`).

        Options left None take the workdir's (`search_options`): a converted checkpoint
        decodes as its generation_config.json says, other runs with beam 4 and alpha 0.6.
        """
        options = self.search_options(beam_size, alpha, max_length)
        if options["beam_size"] < 1 or batch_size < 1:
            raise WorkdirError(
                f"beam_size and batch_size must be >= 1, got {options['beam_size']}, {batch_size}"
            )
        self.check_length(options["max_length"])
        return evaluation.decode_sources(
            self.run, self.params, sources, batch_size=batch_size, **options
        )

    def translate(self, lines: Sequence[str], **options) -> tuple[list[str], list[str]]:
        """One output per line, in order ("" for a blank line), and the warnings of `encode`
        (and one of `empty_outputs` when most translations are empty).

        `options` are those of `decode`.
        """
        encoded, warnings = self.encode(lines)
        decoded = self.decode([ids for ids in encoded if ids is not None], **options)
        warnings += empty_outputs(decoded)
        decoded = iter(decoded)
        return ["" if ids is None else next(decoded) for ids in encoded], warnings


def empty_outputs(outputs: Sequence[str]) -> list[str]:
    """One warning, with the count, when most decoded `outputs` are empty; else none."""
    empty = sum(not text.strip() for text in outputs)
    if not outputs or empty <= EMPTY_SHARE * len(outputs):
        return []
    return [
        f"{empty} of {len(outputs)} translations are empty: the model may be undertrained "
        "(train it longer, or check --step)"
    ]


def check_max_length(max_length: int | None) -> None:
    """Raises WorkdirError for a max_length below 1 (None: the run's default), as `decode`
    and `generate` do; the tools call it before the slow restore."""
    if max_length is not None and max_length < 1:
        raise WorkdirError(f"max_length={max_length}: max_length must be >= 1, got {max_length}")


def read_lines(path: str | pathlib.Path, what: str) -> list[str]:
    """The lines of the UTF-8 text file given as option `what` (e.g. "--input"), without ends.

    Raises:
        WorkdirError: for a missing file or a directory.
        tfjax.errors.DataError: for bytes that are not UTF-8 (`path:line`, byte and column).
    """
    path = pathlib.Path(path)
    if path.is_dir():
        raise WorkdirError(f"{what}={path} is a directory, not a text file: pass a file")
    if not path.is_file():
        raise WorkdirError(f"{what}={path}: no such file")
    return sources.decode_utf8(path.read_bytes(), path).splitlines()


def check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    """Raises WorkdirError naming each sampling option out of its range."""
    problems = [
        f"temperature={temperature} must be >= 0 (0 = greedy)" if temperature < 0 else "",
        f"top_k={top_k} must be >= 0 (0 = off)" if top_k < 0 else "",
        f"top_p={top_p} must be in (0, 1] (1 = off)" if not 0 < top_p <= 1 else "",
    ]
    if any(problems):
        raise WorkdirError("; ".join(p for p in problems if p))


@functools.partial(
    jax.jit, static_argnames=("model", "eos_id", "bos_id", "max_length", "trained", "sampling")
)
def _continue(
    model, params, tokens, lengths, rng, *, eos_id, bos_id, max_length, trained, sampling
):
    """`Generator.decode`'s program, jitted once per model, shapes and options (`sampling`: the
    (name, value) pairs of temperature, top_k, top_p): [B, max_length] ids."""
    sampling = dict(sampling)
    cached_length = min(max_length, trained)
    generated = decoding.generate(
        model,
        params,
        prompts=tokens,
        prompt_lengths=lengths,
        rng=rng,
        eos_id=eos_id,
        bos_id=bos_id,
        max_length=cached_length,
        **sampling,
    )  # [B, L]: prompt + continuation, 0 after EOS
    if max_length == cached_length:
        return generated
    return decoding.generate_sliding(
        model,
        params,
        generated,
        max_length=max_length,
        context=trained - 1,
        eos_id=eos_id,
        rng=rng,
        **sampling,
    )  # generate folds in steps t < cached_length, this one t >= it


class Generator(Trained):
    """A decoder-only run: `generate` continuations, or `encode` / `decode` / `detokenize`."""

    def encode(self, prompts: Sequence[str], max_length: int, *, past_trained: bool = False):
        """Prompt ids as a right-padded batch.

        Args:
            prompts: texts to continue.
            max_length: L, the (cached) sequence length to generate; every prompt must be
                shorter.
            past_trained: L is the trained length because the whole sequence goes past it
                (changes the advice of the error for a prompt that is too long).

        Returns:
            (ids [B, P] int32 padded with 0, lengths [B] int32, warnings).

        Raises:
            WorkdirError: for no prompts or a prompt that leaves no room to generate.
        """
        if not prompts:
            raise WorkdirError('no prompt given: pass at least one (--prompt="...")')
        encoded = [self.tokenizer.encode(prompt) for prompt in prompts]
        warnings = [
            f"prompt {i}: {', '.join(unknown_words(p, self.tokenizer))} not in the "
            "model's vocabulary, read as <unk>"
            for i, (p, ids) in enumerate(zip(prompts, encoded, strict=True), start=1)
            if self.tokenizer.unk_id in ids
        ]
        for i, ids in enumerate(encoded, start=1):
            if len(ids) < max_length:
                continue
            if past_trained:
                raise WorkdirError(
                    f"prompt {i} has {len(ids)} tokens, not fewer than the trained length "
                    f"data.max_target_len={max_length}: shorten the prompt"
                )
            raise WorkdirError(
                f"prompt {i} has {len(ids)} tokens, leaving no room in max_length={max_length} "
                "(prompt plus continuation): raise max_length or shorten the prompt"
            )
        lengths = np.array([len(ids) for ids in encoded], np.int32)  # [B]
        tokens = np.zeros((len(encoded), int(lengths.max())), np.int32)  # [B, P], P may be 0
        for row, ids in zip(tokens, encoded, strict=True):
            row[: len(ids)] = ids
        return tokens, lengths, warnings

    def decode(self, tokens, lengths, *, max_length: int, seed: int = 0, **sampling) -> np.ndarray:
        """Prompt plus continuation ids [B, L] (0 after EOS); `sampling`: temperature, top_k, top_p.

        Up to the trained length (`data.max_target_len`) decoding is KV-cached; past it each
        token is predicted from BOS and the last `max_target_len - 1` tokens, recomputed without
        a cache (`decoding.generate_sliding`), as nanoGPT samples past its block size. Calls
        with the same shapes and options reuse one compiled program (`_continue`).
        """
        generated = _continue(
            self.run.model,
            self.params,
            tokens,
            lengths,
            jax.random.key(seed),
            eos_id=self.tokenizer.eos_id,
            bos_id=self.run.model_config.bos_id,
            max_length=max_length,
            trained=self.config.data.max_target_len,
            sampling=tuple(sorted(sampling.items())),
        )
        return np.asarray(jax.device_get(generated))

    def generate(
        self,
        prompts: Sequence[str],
        *,
        max_length: int | None = None,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> tuple[list[str], list[str]]:
        """One continuation per prompt (the text after it, up to EOS), and warnings.

        `max_length` is the whole sequence, prompt plus continuation including EOS (default:
        the trained length); temperature 0 is greedy.
        """
        check_sampling(temperature, top_k, top_p)
        trained = self.config.data.max_target_len
        length = trained if max_length is None else max_length
        cached_length = min(length, trained)  # past it, a window of the trained length slides
        self.check_length(cached_length)
        tokens, lengths, warnings = self.encode(
            prompts, cached_length, past_trained=length > trained
        )
        generated = self.decode(
            tokens,
            lengths,
            max_length=length,
            seed=seed,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
        )
        return [
            self.detokenize(row[n:]) for row, n in zip(generated, lengths, strict=True)
        ], warnings


def decoding_defaults(workdir: str | pathlib.Path) -> dict:
    """The decoding options a converted workdir was given (`DECODING_FILE`; {} for others)."""
    path = pathlib.Path(workdir) / DECODING_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


# The class a restored workdir becomes, for each `kinds_lib.ModelKind.facade`.
FACADES = {"translator": Translator, "generator": Generator, "trained": Trained}


def load(
    workdir: str | pathlib.Path,
    *,
    kinds: Sequence[str] | None = None,
    tool: str = "",
    step: int | None = None,
    split: str | None = None,
    average_last: int = 1,
) -> Trained:
    """Restores the run in `workdir`: a `Translator`, `Generator` or (encoder-only) `Trained`.

    Args:
        workdir, kinds, tool: see `load_config`.
        step: the checkpoint step (None: the latest good one).
        split: the examples `run.examples.eval` holds: the config's `data.eval_split` (None
            means that one), another split of the dataset (e.g. "test2016") or "train".
        average_last: average the parameters of the last N checkpoints (1 = no averaging).

    Raises:
        WorkdirError: for a missing config or checkpoint, a model of another kind, an unknown
            split, or averaging that cannot be done.
        FileNotFoundError: for a missing data directory or file that the run reads (its
            message names the fix; not reported as a missing checkpoint). With the tokenizer
            saved in the workdir no data is read here: a split's errors come when it is used.
    """
    workdir = pathlib.Path(workdir)
    if average_last < 1:
        raise WorkdirError(f"average_last must be >= 1 (1 = no averaging), got {average_last}")
    config = load_config(workdir, kinds=kinds, tool=tool)
    _select_split(config, split)
    try:
        run, restored = restoration.restore(config, workdir, step, average_last=average_last)
    except ValueError as err:
        raise WorkdirError(str(err)) from err
    except restoration.NoCheckpointError as err:  # a missing data directory is its own error
        raise WorkdirError(
            f"{workdir / 'checkpoints'} holds no checkpoint: "
            + _train_hint(workdir, config.model.kind)
        ) from err
    cls = FACADES[kinds_lib.get(config.model.kind).facade]
    return cls(run, restored.state.params, restored.step, workdir)
