"""Continue prompts with a decoder-only LM: `python -m experiments.generate --workdir=W --prompt=P`.

Flags: `--prompt` (repeatable: all prompts, of any lengths, decode in one batch),
`--max_length` (the whole sequence, prompt plus continuation including EOS; default: the run's
`data.max_target_len`, the trained length; past it each token is predicted from BOS and the
last `data.max_target_len - 1` tokens, recomputed without a cache, as nanoGPT samples past its
block size), `--temperature` (0 = greedy), `--top_k` (0 = off), `--top_p` (1 = off),
`--seed` (0; the sampling key), `--step` (default: the latest good checkpoint).

Prints one continuation per prompt, in order, on stdout: the words generated after the prompt,
up to EOS. For the `configs/lm.py` runs a prompt is a source followed by the separator, e.g.
`--prompt="s3 s1 s7 |"`, and the continuation is the model's answer ("s7 s1 s3"). Prompt words
outside the vocabulary read as <unk>, with a warning on stderr. A workdir without a trained run,
or with a model that is not decoder-only, stops with an error saying what to run instead
(`experiments.train`, or `experiments.translate` for encoder-decoder models). Runs on CPU;
needs no network.
"""

import logging
import sys
from collections.abc import Sequence
from typing import Any

from absl import app, flags
from absl import logging as absl_logging

from experiments import evaluate

FLAGS = flags.FLAGS
TOOL = "experiments.generate"


def _check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    if temperature < 0 or top_k < 0 or not 0 < top_p <= 1:
        raise evaluate.CommandError(
            "need --temperature >= 0, --top_k >= 0 and 0 < --top_p <= 1, got "
            f"{temperature}, {top_k}, {top_p}"
        )


def _unknown_words(prompt: str, tokenizer: Any) -> set[str]:
    """The whitespace-separated words of `prompt` that encode to <unk> in part (any tokenizer)."""
    from tfjax.data import tokenizers

    return {word for word in prompt.split() if tokenizers.UNK_ID in tokenizer.encode(word)}


def encode_prompts(
    prompts: Sequence[str], tokenizer: Any, max_length: int, *, limit: str | None = None
):
    """Prompt ids as a right-padded batch.

    Args:
        prompts: whitespace-separated words each.
        tokenizer: the run's tokenizer.
        max_length: L, the whole sequence to generate; every prompt must be shorter.
        limit: what L is called in the error for a prompt that is too long (None: the
            `--max_length` flag, whose error advises raising it).

    Returns:
        (ids [B, P] int32 padded with 0, lengths [B] int32, warnings).

    Raises:
        CommandError: for no prompts or a prompt that leaves no room to generate.
    """
    import numpy as np

    from tfjax.data import tokenizers

    if not prompts:
        raise evaluate.CommandError('no prompt given: pass --prompt="..." (repeatable)')
    encoded = [tokenizer.encode(prompt) for prompt in prompts]
    warnings = [
        f"prompt {i}: {', '.join(sorted(_unknown_words(p, tokenizer)))} not in the "
        "model's vocabulary, read as <unk>"
        for i, (p, ids) in enumerate(zip(prompts, encoded, strict=True), start=1)
        if tokenizers.UNK_ID in ids
    ]
    for i, ids in enumerate(encoded, start=1):
        if len(ids) >= max_length and limit is not None:
            raise evaluate.CommandError(
                f"prompt {i} has {len(ids)} words, not fewer than {limit}={max_length}: "
                "shorten the prompt"
            )
        if len(ids) >= max_length:
            raise evaluate.CommandError(
                f"prompt {i} has {len(ids)} words, leaving no room in --max_length={max_length} "
                "(prompt plus continuation): raise --max_length or shorten the prompt"
            )
    lengths = np.array([len(ids) for ids in encoded], np.int32)  # [B]
    tokens = np.zeros((len(encoded), int(lengths.max())), np.int32)  # [B, P], P may be 0
    for row, ids in zip(tokens, encoded, strict=True):
        row[: len(ids)] = ids
    return tokens, lengths, warnings


def generate_texts(
    run: Any,
    params: Any,
    prompts: Sequence[str],
    *,
    max_length: int | None = None,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
) -> tuple[list[str], list[str]]:
    """Continues each prompt with the decoder-only `run`.

    Returns:
        (one continuation per prompt, warnings).

    Raises:
        CommandError: for invalid sampling options, lengths or prompts.
    """
    import jax

    from tfjax.data import tokenizers
    from tfjax.inference import decoding

    _check_sampling(temperature, top_k, top_p)
    trained = run.config.data.max_target_len
    length = max_length or trained
    cached_length = min(length, trained)  # past it, a window of the trained length slides
    evaluate.check_max_length(run, cached_length)
    # Past the trained length the prompt must still fit the first, cached window.
    limit = "the trained length data.max_target_len" if length > trained else None
    tokens, lengths, warnings = encode_prompts(
        prompts, run.examples.tokenizer, cached_length, limit=limit
    )
    options = dict(temperature=temperature, top_k=top_k, top_p=top_p)

    def decode(params, tokens, lengths, rng):
        generated = decoding.generate(
            run.model,
            params,
            prompts=tokens,
            prompt_lengths=lengths,
            rng=rng,
            eos_id=tokenizers.EOS_ID,
            bos_id=run.model_config.bos_id,
            max_length=cached_length,
            **options,
        )  # [B, L]: prompt + continuation, 0 after EOS
        if length == cached_length:
            return generated
        return decoding.generate_sliding(
            run.model,
            params,
            generated,
            max_length=length,
            context=trained - 1,
            eos_id=tokenizers.EOS_ID,
            rng=rng,  # generate folds in steps t < cached_length, this one t >= it
            **options,
        )

    generated = jax.device_get(jax.jit(decode)(params, tokens, lengths, jax.random.key(seed)))
    detokenize = run.examples.tokenizer.decode
    return [detokenize(row[n:]) for row, n in zip(generated, lengths, strict=True)], warnings


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax logs every file it reads at INFO
    logging.getLogger("tfjax").setLevel(logging.INFO)
    try:
        _check_sampling(FLAGS.temperature, FLAGS.top_k, FLAGS.top_p)
        run, restored = evaluate.restore_workdir(
            FLAGS.workdir, tool=TOOL, kinds=("decoder_only",), step=FLAGS.step
        )
        outputs, warnings = generate_texts(
            run,
            restored.state.params,
            FLAGS.prompt or [],
            max_length=FLAGS.max_length,
            temperature=FLAGS.temperature,
            top_k=FLAGS.top_k,
            top_p=FLAGS.top_p,
            seed=FLAGS.seed,
        )
    except evaluate.CommandError as err:
        sys.exit(f"error: {err}")
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    sys.stdout.write("".join(f"{line}\n" for line in outputs))


def _define_flags() -> None:
    """Flags exist only when run as a script, so importing this module defines none."""
    flags.DEFINE_string("workdir", None, "Run directory of a decoder-only model.")
    flags.DEFINE_multi_string("prompt", None, "A prompt to continue (repeatable).")
    flags.DEFINE_integer("max_length", None, "Prompt + continuation length (default: data).")
    flags.DEFINE_float("temperature", 0.0, "Sampling temperature (0 = greedy).")
    flags.DEFINE_integer("top_k", 0, "Sample among the k likeliest tokens (0 = all).")
    flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass (1 = off).")
    flags.DEFINE_integer("seed", 0, "Seed of the sampling key.")
    flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest good one).")
    flags.mark_flags_as_required(["workdir", "prompt"])


if __name__ == "__main__":
    _define_flags()
    app.run(main)
