"""Tests for tfjax/training/logger.py: metrics.jsonl, TensorBoard files, read_metrics, Progress."""

import importlib.util
import io
import json
import logging
import math
import re
import struct
import subprocess
import sys

import numpy as np
import pytest

from tfjax.training import logger


def _tensorboard_events(workdir) -> list:
    """Parses the TFRecord event files with tensorboardX's protos (tensorboard not needed).

    A record is: uint64 length, uint32 crc of the length, payload, uint32 crc of the payload.
    """
    from tensorboardX.proto import event_pb2

    files = sorted((workdir / logger.TENSORBOARD_DIR).glob("events.out.tfevents.*"))
    assert files and all(f.stat().st_size > 0 for f in files)
    events = []
    for path in files:
        data, offset = path.read_bytes(), 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            payload = data[offset + 12 : offset + 12 + length]
            events.append(event_pb2.Event.FromString(payload))
            offset += 12 + length + 4
    return events


def _tensorboard_scalars(workdir) -> dict[str, list[tuple[int, float]]]:
    scalars: dict[str, list[tuple[int, float]]] = {}
    for event in _tensorboard_events(workdir):
        for value in event.summary.value:
            if value.HasField("simple_value"):
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_metric_writer_writes_jsonl_lines(tmp_path):
    with logger.MetricWriter(tmp_path) as writer:
        writer.write(10, "train", {"loss": 2.5, "count": np.int32(3), "acc": np.float32(0.5)})
        writer.write(20, "eval", {"loss": float("nan"), "ppl": float("inf")})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[0]) == {
        "step": 10,
        "kind": "train",
        "loss": 2.5,
        "count": 3,
        "acc": 0.5,
    }
    # Strict JSON: non-finite values are strings, turned back into floats by read_metrics.
    assert json.loads(lines[1]) == {"step": 20, "kind": "eval", "loss": "nan", "ppl": "inf"}
    records = logger.read_metrics(tmp_path)
    assert math.isnan(records[1]["loss"]) and records[1]["ppl"] == math.inf
    assert [r["step"] for r in logger.read_metrics(tmp_path, kind="train")] == [10]


def test_metric_writer_flushes_each_line(tmp_path):
    writer = logger.MetricWriter(tmp_path)
    writer.write(1, "train", {"loss": 1.0})
    assert logger.read_metrics(tmp_path) == [{"step": 1, "kind": "train", "loss": 1.0}]
    writer.close()


def test_metric_writer_rejects_reserved_and_non_numeric(tmp_path):
    with logger.MetricWriter(tmp_path) as writer:
        with pytest.raises(ValueError, match="reserved"):
            writer.write(1, "train", {"step": 1.0})
        with pytest.raises(TypeError, match="hello"):
            writer.write(1, "train", {"note": "hello"})


def test_metric_writer_tensorboard_scalars(tmp_path):
    with logger.MetricWriter(tmp_path) as writer:
        writer.write(1, "train", {"loss": 3.0})
        writer.write(np.int64(2), "train", {"loss": 2.0})
        writer.write(2, "eval", {"accuracy": 0.25})
        writer.write_text(2, "samples", "jump twice -> JUMP JUMP")
    scalars = _tensorboard_scalars(tmp_path)
    assert scalars["train/loss"] == [(1, 3.0), (2, 2.0)]
    assert scalars["eval/accuracy"] == [(2, 0.25)]
    texts = [
        v
        for e in _tensorboard_events(tmp_path)
        for v in e.summary.value
        if v.tag.startswith("samples")
    ]
    assert texts and b"jump twice" in texts[0].tensor.string_val[0]


def test_disabled_writer_writes_nothing(tmp_path):
    workdir = tmp_path / "run"
    writer = logger.MetricWriter(workdir, enabled=False)
    writer.write(1, "train", {"loss": 1.0})
    writer.write_text(1, "samples", "text")
    writer.close()
    assert not workdir.exists()


def test_read_metrics_skips_truncated_last_line(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "kind": "train", "loss": 1.5}\n{"step": 2, "kind": "tr')
    with caplog.at_level(logging.WARNING):
        assert logger.read_metrics(tmp_path) == [{"step": 1, "kind": "train", "loss": 1.5}]
    assert not caplog.records
    assert logger.read_metrics(tmp_path / "missing") == []


def test_resumed_writer_starts_a_new_line_after_truncation(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "kind": "train", "loss": 1.5}\n{"step": 2, "kind": "tr')
    with logger.MetricWriter(tmp_path) as writer:
        writer.write(2, "train", {"loss": 1.25})
    with caplog.at_level(logging.WARNING):
        steps = [r["step"] for r in logger.read_metrics(tmp_path)]
    assert steps == [1, 2]
    assert "truncated" in caplog.text


def test_drop_and_drop_after_keep_broken_lines_but_a_cut_short_last_one(tmp_path):
    lines = [
        '{"step": 1, "kind": "train"}',
        "not a record",
        '{"step": 2, "kind": "final_eval"}',
        '{"step": 2, "kind": "train"}',
        '{"step": 3, "kind": "fin',
    ]
    path = tmp_path / logger.METRICS_FILE
    path.write_text("\n".join(lines))
    writer = logger.MetricWriter(tmp_path)
    assert writer.drop(2, "final_eval") == 2  # and the cut-short last line
    assert path.read_text().splitlines() == [lines[0], lines[1], lines[3]]
    path.write_text("\n".join(lines))
    assert writer.drop_after(1) == 3
    assert path.read_text().splitlines() == lines[:2]
    path.write_text("\n".join(lines[:4]))
    assert writer.drop(5, "train") == 0 and path.read_text().splitlines() == lines[:4]


def test_import_is_lazy():
    """`import tfjax.training.logger` pulls in neither tensorboardX nor tqdm (fresh process)."""
    code = (
        "import sys, tfjax.training.logger; "
        "print(sorted(m for m in ('tensorboardX', 'tqdm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_tensorboard_writes_do_not_import_torch(tmp_path):
    """tensorboardX imports torch when it can (seconds); the writer keeps it out, and torch
    still imports afterwards (fresh process)."""
    code = (
        "import sys; from tfjax.training import logger; "
        f"w = logger.MetricWriter({str(tmp_path)!r}); w.write(1, 'train', {{'loss': 1.0}}); "
        "w.close(); print('torch' in sys.modules, 'tensorboardX' in sys.modules); "
        "import torch; print(torch.ones(2).sum().item())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "2.0"], out.stdout
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


_LINE = re.compile(r"step 1200/5000 loss 1\.234 lr 3\.1e-04 tokens/s 2,345 eta \d+:\d\d:\d\d")


def test_progress_logs_lines_when_not_a_terminal(caplog):
    progress = logger.Progress(5000, initial_step=1000, stream=io.StringIO())
    metrics = {"loss": 1.2341, "learning_rate": 3.1e-4, "tokens_per_second": 2345.2}
    with caplog.at_level(logging.INFO, logger="tfjax"):
        progress.update(1200, metrics)
        progress.update(np.int64(1400), {"loss": 1.0})
    progress.close()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert _LINE.fullmatch(messages[0]), messages[0]
    assert re.fullmatch(r"step 1400/5000 loss 1\.000 eta \S+", messages[1]), messages[1]


def test_progress_eta_counts_only_steps_since_start(monkeypatch):
    clock = iter([100.0, 110.0])
    monkeypatch.setattr(logger.time, "perf_counter", lambda: next(clock))
    progress = logger.Progress(5000, initial_step=4000, use_bar=False)
    # 100 steps in 10 s since the Progress started: 900 steps left take 90 s.
    assert progress.eta_seconds(4100) == pytest.approx(90.0)


def test_progress_bar_writes_to_stream(caplog):
    stream = io.StringIO()
    with caplog.at_level(logging.INFO, logger="tfjax"):
        with logger.Progress(100, initial_step=10, stream=stream, use_bar=True) as progress:
            progress.update(50, {"loss": 0.5, "learning_rate": 1e-3, "tokens_per_second": 12345.0})
    text = stream.getvalue()
    assert "50/100" in text
    assert "loss 0.500 lr 1.0e-03 tokens/s 12,345" in text
    assert not caplog.records


def test_progress_draws_a_bar_in_a_notebook(caplog):
    # A Jupyter kernel's stderr (ipykernel.iostream.OutStream) says it is no terminal, but the
    # notebook redraws tqdm's line in place: the bar it is, as on a terminal.
    kernel_stream = type("OutStream", (io.StringIO,), {"__module__": "ipykernel.iostream"})()
    assert not kernel_stream.isatty()
    with caplog.at_level(logging.INFO, logger="tfjax"):
        with logger.Progress(100, stream=kernel_stream) as progress:
            progress.update(50, {"loss": 0.5})
    assert "50/100" in kernel_stream.getvalue() and "loss 0.500" in kernel_stream.getvalue()
    assert not caplog.records


def test_disabled_progress_is_silent(caplog):
    stream = io.StringIO()
    with caplog.at_level(logging.INFO, logger="tfjax"):
        for use_bar in (True, False):
            progress = logger.Progress(10, enabled=False, stream=stream, use_bar=use_bar)
            progress.update(5, {"loss": 1.0})
            progress.close()
    assert stream.getvalue() == "" and not caplog.records
