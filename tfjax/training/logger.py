"""Run logging: metrics to `metrics.jsonl` and TensorBoard, and a progress display for the loop.

`MetricWriter` appends one JSON object per line to `workdir/metrics.jsonl`,
`{"step": 1200, "kind": "train", "loss": 1.234, ...}`, and mirrors each value as a TensorBoard
scalar under `workdir/tensorboard` (tag `"{kind}/{name}"`). Non-finite floats are written as the
JSON strings `"nan"`, `"inf"` and `"-inf"` (strict JSON has no NaN); `read_metrics` turns them
back into floats. `Progress` shows step, loss, learning rate, tokens/s and ETA: a tqdm bar on a
terminal or in a notebook, plain `logging` lines otherwise (log files, TPU job logs).

Importing this module is cheap and has no side effects: tensorboardX and tqdm are imported when
first needed, and nothing here configures logging handlers (that is the entry point's job).
"""

import datetime
import json
import logging
import math
import numbers
import operator
import os
import pathlib
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, SupportsFloat, SupportsIndex

from tfjax.training import storage

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
_RESERVED_KEYS = ("step", "kind")
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _json_value(name: str, value: SupportsFloat) -> int | float | str:
    """A metric as a strict-JSON value: ints stay ints, non-finite floats become strings."""
    if isinstance(value, numbers.Integral):
        return int(value)
    try:
        number = float(value)
    except (TypeError, ValueError) as err:
        raise TypeError(f"metric {name!r} is not a number: {value!r}") from err
    if math.isfinite(number):
        return number
    return "nan" if math.isnan(number) else ("inf" if number > 0 else "-inf")


def _flat_hparams(hparams: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`hparams` with every nested mapping's keys as dotted names."""
    flat = {}
    for key, value in hparams.items():
        if isinstance(value, Mapping):
            flat.update(_flat_hparams(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


class MetricWriter:
    """Writes scalar metrics to `workdir/metrics.jsonl` and TensorBoard event files.

    Files are opened on the first write, so a writer that never writes creates nothing. On
    processes other than 0 of a multi-host run pass `enabled=False`: every method is then a
    no-op. Usable as a context manager (closes on exit).
    """

    def __init__(self, workdir: str | os.PathLike, *, enabled: bool = True):
        """Initialises the writer.

        Args:
            workdir: run directory; created on the first write if missing.
            enabled: False makes every method a no-op (non-chief processes).
        """
        self.workdir = pathlib.Path(workdir)
        self.enabled = enabled
        self._file: Any = None
        self._tensorboard: Any = None

    @property
    def path(self) -> pathlib.Path:
        """The JSON-lines file metrics are appended to."""
        return self.workdir / METRICS_FILE

    def write(self, step: SupportsIndex, kind: str, metrics: Mapping[str, SupportsFloat]) -> None:
        """Appends `{"step": step, "kind": kind, **metrics}` as one line and as TB scalars.

        Args:
            step: training step the metrics belong to (an int, numpy or 0-d jax integer).
            kind: metric group, e.g. "train", "eval" or "final_eval"; TB tags are `kind/name`.
            metrics: scalar values (Python or numpy numbers, 0-d arrays). Integers are written
                as JSON integers; nan/inf as the strings "nan"/"inf"/"-inf".

        Raises:
            ValueError: if a metric is named "step" or "kind".
            TypeError: if a value is not a number.
        """
        if not self.enabled:
            return
        clash = [key for key in _RESERVED_KEYS if key in metrics]
        if clash:
            raise ValueError(f"metric names {clash} clash with the reserved keys {_RESERVED_KEYS}")
        values = {name: _json_value(name, value) for name, value in metrics.items()}
        step = operator.index(step)
        record = {"step": step, "kind": kind, **values}
        handle = self._jsonl()
        handle.write(json.dumps(record, allow_nan=False) + "\n")
        handle.flush()
        tensorboard = self._tensorboard_writer()
        for name, value in values.items():
            scalar = _NON_FINITE[value] if isinstance(value, str) else value
            tensorboard.add_scalar(f"{kind}/{name}", scalar, global_step=step)
        tensorboard.flush()

    def write_text(self, step: SupportsIndex, tag: str, text: str) -> None:
        """Writes `text` (e.g. sample decodes, markdown allowed) to TensorBoard under `tag`."""
        if not self.enabled:
            return
        tensorboard = self._tensorboard_writer()
        tensorboard.add_text(tag, text, global_step=operator.index(step))
        tensorboard.flush()

    def write_hparams(
        self,
        hparams: Mapping[str, bool | str | float | int | Mapping[str, Any]],
        metrics: Mapping[str, SupportsFloat],
        step: SupportsIndex | None = None,
    ) -> None:
        """Records the run's hyperparameters and final metrics for TensorBoard's hparams
        dashboard, in `tensorboard/hparams` (metric tags `hparam/<name>`, so they do not clash
        with the scalars of `write`). A mapping among `hparams` (`optim.kwargs`) gives one
        hyperparameter per key (`optim.kwargs.b1`). Non-finite metrics are skipped
        (TensorBoard cannot plot them)."""
        if not self.enabled:
            return
        values = {f"hparam/{k}": float(v) for k, v in metrics.items() if math.isfinite(float(v))}
        tensorboard = self._tensorboard_writer()
        global_step = None if step is None else operator.index(step)
        flat = _flat_hparams(hparams)
        tensorboard.add_hparams(flat, values, name="hparams", global_step=global_step)
        tensorboard.flush()

    def drop_after(self, step: int) -> int:
        """Removes the records of steps after `step` from metrics.jsonl; returns how many.

        A run resumed from the checkpoint of `step` logs the later steps again (a run killed
        after logging step 50 but saving step 20 logs 30, 40, 50 once more), so the records
        it replays are dropped before it writes: the file then holds one record per step and
        kind for every reader (`read_metrics`, jq, pandas), and no record of a trajectory that
        was thrown away. Done in the trainer rather than in `read_metrics`, because only the
        trainer knows the step it resumed from, and a reader keeping "the last record of each
        step" would keep step 50 of the lost trajectory when the resumed run is stopped again
        before it. The file is rewritten as `_rewrite` says.
        """
        return self._rewrite(lambda record: record["step"] <= step)

    def drop(self, step: int, kind: str) -> int:
        """Removes the `kind` records of `step` from metrics.jsonl; returns how many lines went.

        For a record written again at the same step (a rerun of a finished run evaluates its
        last step once more), so that the file keeps one record per step and kind. The file is
        rewritten as `_rewrite` says.
        """
        return self._rewrite(lambda record: (record["step"], record.get("kind")) != (step, kind))

    def _rewrite(self, keep: Callable[[dict], bool]) -> int:
        """Keeps the records of metrics.jsonl that `keep` accepts; returns how many lines went.

        A line that is no record is kept as it was (`read_metrics` reports it), unless it is
        the last one: cut short by a killed run, it goes too. The file is rewritten whole
        through a temporary file (nothing is lost if the rewrite fails), and only when a line
        goes.
        """
        if not self.enabled or not self.path.exists():
            return 0
        if self._file is not None:
            self._file.close()
            self._file = None
        lines = self.path.read_text(encoding="utf-8").splitlines()
        kept = []
        for number, line in enumerate(lines, start=1):
            record = _record(line)
            if record is None and number == len(lines):
                continue  # cut short by a killed run
            if record is None or keep(record):
                kept.append(line)
        dropped = len(lines) - len(kept)
        if dropped:
            storage.write_text_atomic(self.path, "".join(f"{line}\n" for line in kept))
        return dropped

    def close(self) -> None:
        """Flushes and closes the files; a later write opens them again."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None

    def __enter__(self) -> "MetricWriter":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _jsonl(self) -> Any:
        """The open metrics file; starts on a fresh line after a run killed mid-write."""
        if self._file is None:
            self.workdir.mkdir(parents=True, exist_ok=True)
            needs_newline = False
            if self.path.exists() and self.path.stat().st_size > 0:
                with self.path.open("rb") as existing:
                    existing.seek(-1, os.SEEK_END)
                    needs_newline = existing.read(1) != b"\n"
            self._file = self.path.open("a", encoding="utf-8")
            if needs_newline:
                self._file.write("\n")
        return self._file

    def _tensorboard_writer(self) -> Any:
        if self._tensorboard is None:
            tensorboardx = _import_tensorboardx()  # lazy: keeps this module's import cheap
            self._tensorboard = tensorboardx.SummaryWriter(str(self.workdir / TENSORBOARD_DIR))
        return self._tensorboard


def _import_tensorboardx() -> Any:
    """tensorboardX, imported without importing torch.

    tensorboardX's writer module imports torch whenever it is installed (only to accept torch
    tensors, which tfjax never passes): seconds of every run's first write on a machine with
    torch, as on Colab (docs/compilation_cache.md). While tensorboardX loads, torch is marked
    unimportable (None in `sys.modules`, so its `import torch` falls back); the mark is removed
    after. Where torch or tensorboardX is already imported this is a plain import.
    """
    if "torch" in sys.modules or "tensorboardX" in sys.modules:
        import tensorboardX

        return tensorboardX
    sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        import tensorboardX
    finally:
        if sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]
    return tensorboardX


def _record(line: str) -> dict | None:
    """A metrics.jsonl line's record (a JSON object with a step); None for any other line."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) and "step" in record else None


def _decode_record(record: dict) -> dict:
    return {
        key: _NON_FINITE.get(value, value) if isinstance(value, str) and key != "kind" else value
        for key, value in record.items()
    }


def read_metrics(workdir: str | os.PathLike, kind: str | None = None) -> list[dict]:
    """Reads the records of `workdir/metrics.jsonl`, oldest first.

    A line cut short by a killed run is skipped: silently when it is the last line, with a
    warning when a resumed run has written after it. "nan"/"inf"/"-inf" strings become floats.
    Each (step, kind) comes once: a resumed run drops the records it replays before writing
    (`MetricWriter.drop_after`), so no step of a thrown-away trajectory is read.

    Args:
        workdir: run directory.
        kind: if given, only records of this kind (e.g. "eval").

    Returns:
        One dict per record, with "step" and "kind" keys; empty if the file does not exist.
    """
    path = pathlib.Path(workdir) / METRICS_FILE
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number != len(lines):
                log.warning("%s:%d: skipping a truncated line", path, number)
            continue
        if kind is None or record.get("kind") == kind:
            records.append(_decode_record(record))
    return records


def _shows_a_bar(stream: Any) -> bool:
    """A terminal, or a Jupyter kernel's output (Jupyter and Colab redraw tqdm's line in place;
    the kernel's streams say they are no terminal)."""
    if type(stream).__module__.startswith("ipykernel."):
        return True
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _format_eta(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    return str(datetime.timedelta(seconds=round(max(seconds, 0.0))))


# (label, metric names tried in order, format) of the values `Progress` shows.
_PROGRESS_FIELDS = (
    ("loss", ("loss",), "{:.3f}"),
    ("lr", ("learning_rate", "lr"), "{:.1e}"),
    ("tokens/s", ("tokens_per_second",), "{:,.0f}"),
)


def _fields(metrics: Mapping[str, SupportsFloat]) -> list[str]:
    """`["loss 1.234", "lr 3.1e-04", "tokens/s 2,345"]` for the metrics that are present."""
    out = []
    for label, names, spec in _PROGRESS_FIELDS:
        name = next((name for name in names if name in metrics), None)
        if name is not None:
            out.append(f"{label} {spec.format(float(metrics[name]))}")
    return out


class Progress:
    """Progress of a training loop: step, loss, learning rate, tokens/s and ETA.

    On a terminal (`stream.isatty()`) or in a Jupyter notebook a tqdm bar whose postfix carries
    loss, lr and tokens/s (the bar itself shows step/total and the remaining time). Elsewhere
    one `logging` INFO line per `update`, e.g.
    `step 1200/5000 loss 1.234 lr 3.1e-04 tokens/s 2,345 eta 0:03:12`; those lines go to this
    module's logger (under "tfjax"), not to `stream`. The ETA uses the average
    steps/s since this object was created, so a resumed run does not count the restored steps.
    """

    def __init__(
        self,
        total_steps: int,
        *,
        initial_step: int = 0,
        enabled: bool = True,
        stream: Any = None,
        use_bar: bool | None = None,
    ):
        """Initialises the display.

        Args:
            total_steps: the step the run ends at.
            initial_step: the step the run starts (or resumes) from.
            enabled: False makes every method a no-op (non-chief processes).
            stream: where the bar is drawn; default `sys.stderr`.
            use_bar: force the tqdm bar (True) or log lines (False); default: bar iff
                `stream` is a terminal or a notebook kernel's output.
        """
        self.total_steps = total_steps
        self.initial_step = initial_step
        self.enabled = enabled
        self._stream = sys.stderr if stream is None else stream
        self._use_bar = _shows_a_bar(self._stream) if use_bar is None else use_bar
        self._start = time.perf_counter()
        self._bar: Any = None
        if enabled and self._use_bar:
            import tqdm  # lazy: keeps `import tfjax.training.logger` cheap

            # smoothing=0: tqdm's rate is then the average since start, (n - initial) / elapsed.
            self._bar = tqdm.tqdm(
                total=total_steps,
                initial=initial_step,
                file=self._stream,
                unit="step",
                smoothing=0,
                dynamic_ncols=True,
            )

    def eta_seconds(self, step: int) -> float | None:
        """Seconds left at the average rate since start; None before any step was measured."""
        done = step - self.initial_step
        elapsed = time.perf_counter() - self._start
        if done <= 0 or elapsed <= 0:
            return None
        return (self.total_steps - step) * elapsed / done

    def update(self, step: SupportsIndex, metrics: Mapping[str, SupportsFloat]) -> None:
        """Shows `step` and the metrics named loss, learning_rate and tokens_per_second.

        Args:
            step: the step just completed.
            metrics: host-side scalars; missing names are left out of the display.
        """
        if not self.enabled:
            return
        step = operator.index(step)
        fields = _fields(metrics)
        if self._bar is not None:
            self._bar.update(step - self._bar.n)
            self._bar.set_postfix_str(" ".join(fields), refresh=True)
            return
        eta = _format_eta(self.eta_seconds(step))
        log.info("%s", " ".join([f"step {step}/{self.total_steps}", *fields, f"eta {eta}"]))

    def close(self) -> None:
        """Closes the bar (a no-op in log-line mode)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
