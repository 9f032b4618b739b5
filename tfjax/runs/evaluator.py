"""Evaluating a run: teacher-forced metrics, greedy exact match and BLEU, beam-search scores.

`evaluate(run, params)` is what the training loop logs every `train.eval_every_steps` and at the
end; sums are taken over every host's slice of the split, so the numbers are exact on a pod.
`evaluate_workdir` restores a workdir (`tfjax.runs.trained.load`), adds beam-search BLEU, chrF
and exact match for seq2seq runs, and writes `eval.json`: `experiments.evaluate` is its CLI.
"""

import json
import logging
import pathlib
from typing import Any

import jax
import numpy as np

from tfjax.data import datasets, pipeline
from tfjax.models import kinds
from tfjax.nn import losses
from tfjax.runs import build, trained
from tfjax.training import storage

log = logging.getLogger(__name__)


def host_sum(metrics: dict[str, Any], *, across_hosts: bool) -> dict[str, float]:
    """Sums metric arrays on the host; `across_hosts` also sums over processes.

    Train metrics are already global (summed over every device inside the step); evaluation
    sums come from each host's own slice of the eval split and need the cross-host sum.
    """
    sums = {k: float(np.sum(v)) for k, v in metrics.items()}
    if across_hosts and jax.process_count() > 1:
        from jax.experimental import multihost_utils

        gathered = multihost_utils.process_allgather(np.array(list(sums.values())))
        sums = dict(zip(sums, np.asarray(gathered).sum(0).tolist(), strict=True))
    return sums


def evaluate(
    run: build.Evaluable, params: Any, *, max_examples: int = 0, examples: list | None = None
) -> dict[str, float]:
    """Teacher-forced loss/accuracy on the eval split, plus greedy exact match for seq2seq.

    `examples` replaces the eval split (e.g. sampled LM windows); seq2seq runs then report no
    BLEU, which needs the split's references.
    """
    references = run.examples.references if examples is None else None
    if examples is None:
        examples = run.examples.eval
    examples = examples[:max_examples] if max_examples else examples
    dataset = pipeline.make_dataset(
        examples,
        batch_size=run.config.train.eval_batch_size,
        seed=0,
        shuffle=False,
        repeat=False,
        drop_remainder=False,
        shard_index=jax.process_index(),
        shard_count=jax.process_count(),
    )
    totals: dict[str, Any] = {}
    predictions: list[np.ndarray] = []
    for batch in dataset:
        metrics = jax.device_get(run.eval_step(params, batch))
        if run.examples.format == "seq2seq":
            greedy, predicted = _greedy_exact_match(run, params, batch)
            metrics.update(greedy)
            predictions.append(predicted)
        totals = {k: totals.get(k, 0.0) + np.asarray(v) for k, v in metrics.items()}
    sums = host_sum(totals, across_hosts=True)
    result = losses.summarize({k: v for k, v in sums.items() if not k.startswith("greedy_")})
    if "greedy_correct" in sums:
        result["greedy_exact_match"] = sums["greedy_correct"] / max(sums["greedy_count"], 1.0)
    if references is not None:
        from tfjax.inference import evaluation  # sacrebleu: only runs that keep references

        hypotheses = _hypotheses(run, predictions, len(examples))
        result["greedy_bleu"] = evaluation.bleu(hypotheses, references[: len(hypotheses)])
    return result


def _greedy_exact_match(
    run: build.Evaluable, params: Any, batch: dict[str, np.ndarray]
) -> tuple[dict, np.ndarray]:
    """Greedy exact-match sums of a batch, and its predictions [B, L] int32."""
    predictions = np.asarray(run.greedy(params, batch["inputs"], batch["inputs_segment_ids"]))
    targets, valid = batch["targets"], batch["targets_segment_ids"] > 0
    rows = valid.any(axis=1)
    correct = np.all((predictions == targets) | ~valid, axis=1) & np.all(
        (predictions == 0) | valid, axis=1
    )
    sums = {"greedy_correct": float(np.sum(correct & rows)), "greedy_count": float(rows.sum())}
    return sums, predictions


def _hypotheses(run: build.Evaluable, predictions: list[np.ndarray], count: int) -> list[str]:
    """The detokenized greedy outputs of the `count` examples, in order, from every host.

    Host i of P evaluated examples i, i + P, ... (`pipeline.make_dataset` shards, padded to
    equal lengths), so after gathering, row r of host i is example r * P + i.
    """
    rows = np.concatenate(predictions)  # [R, L]: this host's examples, then padding rows
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        gathered = np.asarray(multihost_utils.process_allgather(rows))  # [P, R, L]
        rows = gathered.transpose(1, 0, 2).reshape(-1, rows.shape[-1])  # [R * P, L]
    return [run.examples.tokenizer.decode(row) for row in rows[:count]]


EVAL_FILE = "eval.json"


def _check_options(
    beam_size: int | None, alpha: float | None, max_examples: int, batch_size: int
) -> None:
    """None: the workdir's default (`workdir.Trained.search_options`)."""
    if beam_size is not None and beam_size < 1:
        raise trained.WorkdirError(f"beam_size must be >= 1 (1 = greedy), got {beam_size}")
    if alpha is not None and alpha < 0:
        raise trained.WorkdirError(f"alpha must be >= 0, got {alpha}")
    if max_examples < 0:
        raise trained.WorkdirError(f"max_examples must be >= 0 (0 = all), got {max_examples}")
    if batch_size < 1:
        raise trained.WorkdirError(f"batch_size must be >= 1, got {batch_size}")


def _decoded_scores(restored, name: str, **options) -> dict[str, Any]:
    """Decodes the split, writes the hypotheses file and scores it (BLEU, chrF, exact match);
    `warnings` when most hypotheses are empty (`workdir.empty_outputs`)."""
    from tfjax.inference import evaluation

    hypotheses, references, _ = evaluation.decode_dataset(restored.run, restored.params, **options)
    path = restored.workdir / "eval" / f"{name}.hyp.txt"
    _write(path, "".join(f"{line}\n" for line in hypotheses))
    scores = {
        "num_examples": len(hypotheses),
        "bleu": evaluation.bleu(hypotheses, references),
        "chrf": evaluation.chrf(hypotheses, references),
        "exact_match": evaluation.exact_match(hypotheses, references),
        "bleu_signature": evaluation.bleu_signature(),
        "chrf_signature": evaluation.chrf_signature(),
        "hypotheses": str(path.relative_to(restored.workdir)),
    }
    warnings = trained.empty_outputs(hypotheses)  # a model that stops at once
    return {**scores, "warnings": warnings} if warnings else scores


def _sampled_windows(restored, count: int) -> dict[str, Any]:
    """Text-stream LMs: the loss on `count` windows at random offsets (nanoGPT's estimate)."""
    stream = restored.run.examples.eval_stream
    if stream is None or not count:
        return {}
    length = restored.config.data.max_target_len
    windows = datasets.sample_windows(stream, length, count, seed=0)
    sampled = evaluate(restored.run, restored.params, examples=windows)
    return {"sampled_windows": count, "sampled_nll": sampled["nll"]}


def evaluate_workdir(
    workdir: str | pathlib.Path,
    *,
    split: str | None = None,
    beam_size: int | None = None,
    alpha: float | None = None,
    step: int | None = None,
    max_examples: int = 0,
    batch_size: int = 64,
    average_last: int = 1,
    sample_windows: int = 2400,
    oracle_length: bool = False,
) -> dict[str, Any]:
    """Evaluates the run in `workdir` on a split; writes and returns the record.

    Seq2seq runs: decodes the split (greedy for beam_size 1, else beam search with length
    penalty `alpha`; None: the workdir's defaults, a converted checkpoint's own) and scores the
    detokenized hypotheses with sacreBLEU BLEU and chrF and exact
    match, beside the teacher-forced metrics of `evaluate`. Other runs: the teacher-forced
    metrics; text-stream LMs also `sampled_nll` over `sample_windows` random windows. The record
    goes to `workdir/eval.json` and
    `workdir/eval/<split>_step<N>[_avgK][_beamB[_alphaA]][_oracle].json`.
    `oracle_length` (seq2seq, greedy): each hypothesis ends where its reference does
    (`evaluation.decode_dataset`); the record says `"oracle_length": true`.

    Raises:
        WorkdirError: for invalid options, or a workdir without a trained run.
    """
    _check_options(beam_size, alpha, max_examples, batch_size)
    if oracle_length:
        if beam_size not in (None, 1):
            raise trained.WorkdirError(
                f"oracle lengths are for greedy decoding: pass beam_size 1, not {beam_size}"
            )
        beam_size = 1
    check_writable(workdir)
    restored = trained.load(
        workdir, tool="experiments.evaluate", step=step, split=split, average_last=average_last
    )
    if oracle_length and restored.run.examples.format != "seq2seq":
        raise trained.WorkdirError(
            f"oracle lengths are for decoded (seq2seq) runs; this is a "
            f"{restored.run.model_config.kind} run: drop --oracle_length"
        )
    trained_without_eos = not restored.config.train.predict_eos
    if trained_without_eos and restored.run.examples.format == "seq2seq" and not oracle_length:
        log.warning(
            "this run was trained without EOS (train.predict_eos=False): its hypotheses end "
            "only at data.max_target_len; pass --oracle_length to give them the reference's"
        )
    split = restored.config.data.eval_split
    scores = evaluate(restored.run, restored.params, max_examples=max_examples)
    count = min(max_examples or len(restored.run.examples.eval), len(restored.run.examples.eval))
    record = {"split": split, "step": restored.step, "num_examples": count}
    if trained_without_eos:
        record["predict_eos"] = False
    name = f"{split}_step{restored.step}"
    if average_last > 1:
        record["averaged_checkpoints"] = average_last
        name += f"_avg{average_last}"
    if restored.run.examples.format == "seq2seq":
        # None: the workdir's defaults (a converted checkpoint's own decoding, else 4 and 0.6)
        options = restored.search_options(beam_size, alpha, None)
        name += _decoding_suffix(options["beam_size"], options["alpha"])
        name += "_oracle" if oracle_length else ""
        scores["teacher_forced_exact_match"] = scores.pop("exact_match")
        record.update(beam_size=options["beam_size"], alpha=options["alpha"])
        if oracle_length:
            record["oracle_length"] = True
        options.update(max_examples=max_examples, batch_size=batch_size)
        record.update(_decoded_scores(restored, name, oracle_length=oracle_length, **options))
    record.update(_sampled_windows(restored, sample_windows))
    record.update(scores)
    text = json.dumps(record, indent=2) + "\n"
    _write(restored.workdir / "eval" / f"{name}.json", text)
    _write(restored.workdir / EVAL_FILE, text)
    return record


def _write(path: pathlib.Path, text: str) -> None:
    """Writes an output file whole or not at all (`storage.write_text_atomic`): a full disk
    is one `StorageError` and keeps the previous file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        problem = storage.storage_problem(err)
        if problem == storage.FULL:
            raise storage.full_disk_error(path.parent, f"writing {path}") from err
        if problem == storage.READ_ONLY:
            raise storage.read_only_error(path.parent, str(path.parent)) from err
        raise
    storage.write_text_atomic(path, text)


def check_writable(workdir: str | pathlib.Path) -> None:
    """Raises `StorageError` when the evaluation could not be written to `workdir/eval` (a
    read-only workdir): checked before the restore and the decoding, which take minutes."""
    workdir = pathlib.Path(workdir)
    if workdir.is_dir():
        storage.check_writable(workdir / "eval", f"workdir {workdir}")


def _decoding_suffix(beam_size: int, alpha: float) -> str:
    """`_beamB` for greedy decoding; `_beamB_alphaA` for beam search, so that the records of
    several length penalties (choosing alpha on val) sit side by side instead of replacing
    each other."""
    return f"_beam{beam_size}" + (f"_alpha{alpha:g}" if beam_size > 1 else "")


def evaluate_files(
    workdir: str | pathlib.Path,
    source_file: str | pathlib.Path,
    reference_file: str | pathlib.Path,
    *,
    beam_size: int | None = None,
    alpha: float | None = None,
    step: int | None = None,
    max_examples: int = 0,
    batch_size: int = 64,
    average_last: int = 1,
) -> dict[str, Any]:
    """Scores a seq2seq run on any line-aligned source and reference files.

    Each source line is encoded with the run's tokenizer (as `experiments.translate` does:
    EOS appended, truncated to `data.max_source_len`), decoded (greedy for beam_size 1, else beam
    search), detokenized and scored against the reference line as written: sacreBLEU BLEU (13a,
    cased) and chrF, and exact match. The record (`split` is "files", with both paths) goes to
    `workdir/eval.json` and `workdir/eval/files_<source stem>_step<N>[_avgK]_beam<B>.json`;
    the hypotheses to the `.hyp.txt` beside it.

    Raises:
        WorkdirError: for a missing file, files of different lengths, no lines, invalid
            options, or a workdir without a trained encoder-decoder.
        tfjax.errors.DataError: for bytes that are not UTF-8 (file, line and column named).
    """
    _check_options(beam_size, alpha, max_examples, batch_size)
    sources = trained.read_lines(source_file, "source_file")
    references = trained.read_lines(reference_file, "reference_file")
    if len(sources) != len(references):
        raise trained.WorkdirError(
            f"source_file has {len(sources)} lines but reference_file has {len(references)}: "
            "the files must be line-aligned"
        )
    if max_examples:
        sources, references = sources[:max_examples], references[:max_examples]
    if not sources:
        raise trained.WorkdirError(f"source_file={source_file} has no lines to translate")
    check_writable(workdir)
    translator = trained.load(
        workdir,
        kinds=kinds.names(facade="translator"),
        tool="experiments.evaluate",
        step=step,
        average_last=average_last,
    )
    options = translator.search_options(beam_size, alpha, None)  # None: the workdir's
    beam_size, alpha = options["beam_size"], options["alpha"]
    hypotheses, warnings = translator.translate(
        sources, beam_size=beam_size, alpha=alpha, batch_size=batch_size
    )
    from tfjax.inference import evaluation

    name = f"files_{pathlib.Path(source_file).stem}_step{translator.step}"
    if average_last > 1:
        name += f"_avg{average_last}"
    name += _decoding_suffix(beam_size, alpha)
    hyp_path = translator.workdir / "eval" / f"{name}.hyp.txt"
    _write(hyp_path, "".join(f"{line}\n" for line in hypotheses))
    record = {
        "split": "files",
        "source_file": str(source_file),
        "reference_file": str(reference_file),
        "step": translator.step,
        "num_examples": len(sources),
        "beam_size": beam_size,
        "alpha": alpha,
        "bleu": evaluation.bleu(hypotheses, references),
        "chrf": evaluation.chrf(hypotheses, references),
        "exact_match": evaluation.exact_match(hypotheses, references),
        "bleu_signature": evaluation.bleu_signature(),
        "chrf_signature": evaluation.chrf_signature(),
        "hypotheses": str(hyp_path.relative_to(translator.workdir)),
        "warnings": warnings,
    }
    if average_last > 1:
        record["averaged_checkpoints"] = average_last
    text = json.dumps(record, indent=2) + "\n"
    _write(translator.workdir / "eval" / f"{name}.json", text)
    _write(translator.workdir / EVAL_FILE, text)
    return record


def report(record: dict[str, Any]) -> str:
    """The printed summary of a record: where, then the scores, then the sacreBLEU signatures."""
    head = f"{record['split']} split, step {record['step']}, {record['num_examples']} examples"
    if record["split"] == "files":
        head = (
            f"{record['source_file']} -> {record['reference_file']}, step {record['step']}, "
            f"{record['num_examples']} lines"
        )
    if "beam_size" in record:
        head += f", beam {record['beam_size']} (alpha {record['alpha']})"
    if record.get("oracle_length"):
        head += ", ORACLE output lengths (EOS placed where each reference ends)"
    numbers = {k: v for k, v in record.items() if isinstance(v, float) and k != "alpha"}
    lines = [head, "  ".join(f"{k} {v:.4f}" for k, v in numbers.items())]
    lines += [
        f"{k}: {record[k]}"
        for k in ("bleu_signature", "chrf_signature", "hypotheses")
        if k in record
    ]
    return "\n".join(lines)
