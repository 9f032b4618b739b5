"""A full disk and a read-only workdir: one `error:` line, status 2, nothing saved lost.

Two ways in. Where the tests run as root and `mount` works, a small tmpfs fills up (or is
remounted read-only) under the real commands, subprocesses as a user runs them. Everywhere, the
error is injected at the moment it happens for real: orbax's background save failing with the
`ValueError: RESOURCE_EXHAUSTED ... [os_error_code='28']` it raises, a write raising
`OSError(ENOSPC)`, the write probe meeting `EROFS`. Also: a resumed run's metrics.jsonl keeps
one record per step.
"""

import contextlib
import errno
import json
import logging
import os
import pathlib
import subprocess
import tempfile
import uuid

import jax
import orbax.checkpoint as ocp
import pytest
import test_bad_input
import tiny_runs
from orbax.checkpoint._src.checkpointers import async_checkpointer
from test_bad_input import _copy, _digest, _one_error
from test_checkpointing import make_state, save
from tiny_runs import REVERSE

from experiments import attention_map, cli, config_utils, evaluate
from tfjax import errors
from tfjax.runs import build, evaluator, restoration, trainer
from tfjax.training import checkpointing, logger, storage

trained, tool = test_bad_input.trained, test_bad_input.tool  # the same fixtures, run here
TINY = ["--config=configs/base.py:tiny", *(f"--config.{o}" for o in REVERSE)]
# The text orbax raises for a full disk (from a real run on a full tmpfs, shortened).
ORBAX_FULL = (
    'RESOURCE_EXHAUSTED: Error writing "opt_state.0.0.mu.decoder.layer_0.norm.bias/0" in OCDBT '
    'database at local file "{dir}/3.orbax-checkpoint-tmp/state.orbax-checkpoint-tmp/": Failed '
    "to write 176292 bytes to file 9: No space left on device [os_error_code='28']"
)


def _can_mount() -> str:
    """'' when this process may mount a tmpfs, else why not."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    with tempfile.TemporaryDirectory() as probe:
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", probe], capture_output=True
        )
        if result.returncode != 0:
            return f"mount -t tmpfs failed: {result.stderr.decode().strip()}"
        subprocess.run(["umount", probe], check=True)
    return ""


@contextlib.contextmanager
def _tmpfs(size_kb: int):
    """A fresh tmpfs of `size_kb` kB; unmounted on exit."""
    with tempfile.TemporaryDirectory() as point:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", point], check=True
        )
        try:
            yield pathlib.Path(point)
        finally:
            subprocess.run(["umount", "-l", point], check=True)


def _room_for(workdir: pathlib.Path, spare_kb: int) -> int:
    """kB for a tmpfs holding a copy of `workdir` and `spare_kb` more. The tiny trained
    workdir is not of one size: orbax's OCDBT writes its checkpoint as a varying number of
    data files (0.9-2.1 MB seen), so a fixed 2 MB tmpfs was sometimes too small to copy it."""
    files = [p for p in workdir.rglob("*") if p.is_file()]
    return sum(-(-p.stat().st_size // 4096) * 4 for p in files) + spare_kb  # whole 4 kB pages


def _remount(point: pathlib.Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(point)], check=True)


needs_mount = pytest.mark.skipif(bool(_can_mount()), reason=_can_mount() or "mount works")


# ---------------------------------------------------------------------------------------------
# Recognising the error, wherever it comes from


def test_storage_problem_reads_errno_and_the_texts_of_orbax():
    full = OSError(errno.ENOSPC, "No space left on device")
    assert storage.storage_problem(full) == storage.FULL
    assert storage.storage_problem(OSError(errno.EDQUOT, "quota")) == storage.FULL
    assert storage.storage_problem(OSError(errno.EROFS, "x")) == storage.READ_ONLY
    assert storage.storage_problem(ValueError(ORBAX_FULL.format(dir="/d"))) == storage.FULL
    wrapped = RuntimeError("save failed")
    wrapped.__cause__ = ValueError("[os_error_code='30'] Read-only file system")
    assert storage.storage_problem(wrapped) == storage.READ_ONLY
    assert storage.storage_problem(ValueError("shapes differ")) is None
    assert storage.storage_problem(OSError(errno.ENOENT, "missing")) is None
    assert storage.storage_problem(KeyError("No space left on device")) is None


def test_orbax_and_asyncio_full_disk_records_are_dropped_and_others_kept():
    """The records orbax's threads log before `Checkpointer` raises its one line; the first is
    what orbax printed on a full tmpfs: no directory in it, a traceback attached."""
    from tfjax.training.checkpointing import manager

    quiet = manager._QuietFullDisk()
    quiet.paths.add("/runs/a/")
    full = OSError(errno.ENOSPC, "No space left on device")

    def record(pathname: str, message: str, error=None, level=logging.ERROR) -> bool:
        exc_info = (type(error), error, None) if error else None
        made = logging.LogRecord("absl", level, pathname, 1, message, None, exc_info)
        return quiet.filter(made)

    orbax_file = "/py/site-packages/orbax/checkpoint/_src/futures/future.py"
    assert not record(orbax_file, "_SignalingThread.run() raised an exception: ", full)
    assert not record("/py/lib/asyncio/base_events.py", "Task exception was never retrieved", full)
    assert not record("/py/elsewhere.py", "could not write /runs/a/3: No space left on device")
    assert record("/py/elsewhere.py", "could not write /other/3: No space left on device")
    assert record(orbax_file, "shapes differ", ValueError("shapes differ"))
    assert record(orbax_file, "No space left on device", level=logging.WARNING)


def test_mount_point_and_sizes(tmp_path):
    assert os.path.ismount(storage.mount_point(tmp_path / "not" / "yet"))
    assert storage.size_text(300_000) == "0.3 MB"
    assert storage.size_text(12_000) == "12 kB"
    assert storage.size_text(5) == "5 bytes"


# ---------------------------------------------------------------------------------------------
# 1. A full disk while saving a checkpoint


def _fail_the_background_save(monkeypatch, directory: pathlib.Path, step: int) -> None:
    """Makes orbax's background commit of `step` fail as on a full disk once its arrays are in
    the temporary directory: the error surfaces at the next wait, save or close."""
    commit = async_checkpointer._background_wait_for_commit_futures

    def failing(step_directory, commit_futures, *args, **kwargs):
        if step_directory.name == str(step):
            for written in commit_futures:
                written.result()
            raise ValueError(ORBAX_FULL.format(dir=directory))
        return commit(step_directory, commit_futures, *args, **kwargs)

    monkeypatch.setattr(async_checkpointer, "_background_wait_for_commit_futures", failing)


def test_a_full_disk_in_a_background_save_is_one_error_naming_the_steps(tmp_path, monkeypatch):
    directory = tmp_path / "checkpoints"
    checkpointer = checkpointing.Checkpointer(directory, max_to_keep=5)
    save(checkpointer, 1)
    save(checkpointer, 2)
    checkpointer.wait()
    kept = _digest(directory)
    _fail_the_background_save(monkeypatch, directory, 3)
    save(checkpointer, 3)  # returns at once: the commit fails in a thread
    with pytest.raises(errors.StorageError) as raised:
        save(checkpointer, 4)  # waits for step 3 first
    text = str(raised.value)
    assert text.startswith(f"no space left on {storage.mount_point(directory)} while saving step 3")
    assert "the last complete checkpoint is step 2; free space and rerun to resume" in text
    needed = sum(x.nbytes for x in jax.tree.leaves(make_state(3)))
    assert f"about {storage.size_text(needed)} needed" in text
    checkpointer.close()  # reported once: closing does not raise it again
    monkeypatch.undo()
    assert sorted(p.name for p in directory.iterdir()) == ["1", "2"]  # the partial step is gone
    assert _digest(directory) == kept
    reopened = checkpointing.Checkpointer(directory)
    assert reopened.restore(make_state(0)).step == 2
    save(reopened, 3)  # with space again the run goes on
    reopened.close()
    assert reopened.all_steps() == [1, 2, 3]


def test_a_full_disk_met_by_the_save_itself_or_at_close(tmp_path, monkeypatch):
    directory = tmp_path / "checkpoints"
    with checkpointing.Checkpointer(directory) as checkpointer:
        save(checkpointer, 1)
    checkpointer = checkpointing.Checkpointer(directory)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(directory / "2"))

    with monkeypatch.context() as patch:
        patch.setattr(ocp.CheckpointManager, "save", full)
        with pytest.raises(errors.StorageError, match=r"while saving step 2 .*complete checkpoint"):
            save(checkpointer, 2)
    checkpointer.close()
    _fail_the_background_save(monkeypatch, directory, 5)
    checkpointer = checkpointing.Checkpointer(directory)
    save(checkpointer, 5)
    with pytest.raises(errors.StorageError, match=r"saving step 5.*is step 1; free space"):
        checkpointer.close()  # the last save of a run fails when it is closed
    assert sorted(p.name for p in directory.iterdir()) == ["1"]


@pytest.mark.slow  # a save meeting a full disk, in the default tier: the two tests above
def test_train_on_a_full_disk_is_one_line_and_resumes(tmp_path, monkeypatch, capsys):
    """The training loop: orbax's commit of step 2 fails as on a full disk."""
    workdir = tmp_path / "run"
    config = config_utils.load_config(
        "configs/base.py:tiny", (*REVERSE, "train.checkpoint_every_steps=1")
    )
    _fail_the_background_save(monkeypatch, workdir / "checkpoints", 2)
    status, err = _train(config, workdir, capsys)
    line = _one_error(status, err, "while saving step 2", "complete checkpoint is step 1")
    assert line.endswith("free space and rerun to resume")
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["1"]
    monkeypatch.undo()
    status, err = _train(config, workdir, capsys)
    assert status == 0, err
    assert checkpointing.Checkpointer(workdir / "checkpoints").all_steps() == [1, 2]


def _train(config, workdir, capsys):
    """`train_and_evaluate` as `experiments.train` runs it: (status, stderr)."""
    capsys.readouterr()
    try:
        trainer.train_and_evaluate(config, workdir)
        status = 0
    except Exception as error:  # what `cli.main` hands to `cli.report`
        status = cli.report(error)
    return status, capsys.readouterr().err


@needs_mount
@pytest.mark.slow
def test_train_command_on_a_full_tmpfs():
    """A real full filesystem: steps 1 and 2 fit, 3 does not; more space, and it resumes."""
    args = [*TINY, "--config.train.num_train_steps=4", "--config.train.checkpoint_every_steps=1"]
    with _tmpfs(1100) as point:
        workdir = point / "run"
        result = tiny_runs.command("train", *args, f"--workdir={workdir}")
        line = _one_error(result.returncode, result.stderr, f"no space left on {point}")
        assert "while saving step 3" in line and "complete checkpoint is step 2" in line
        assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["1", "2"]
        _remount(point, "size=4m")
        result = tiny_runs.command("train", *args, f"--workdir={workdir}")
        assert result.returncode == 0, result.stderr
        assert "resumed from" in result.stderr and "at step 2" in result.stderr
        steps = [r["step"] for r in logger.read_metrics(workdir, "train")]
        assert steps == sorted(set(steps)), steps


# ---------------------------------------------------------------------------------------------
# 1. A full disk while evaluate writes its outputs


def test_evaluate_on_a_full_disk_keeps_the_previous_record(trained, tool, tmp_path, monkeypatch):
    workdir = _copy(trained, tmp_path)
    assert tool(evaluate, f"--workdir={workdir}", "--max_examples=2")[0] == 0
    before = _digest(workdir)
    write_text = pathlib.Path.write_text

    def full(self, *args, **kwargs):
        if self.parent.name == "eval" or self.name.startswith(".eval.json"):
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return write_text(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", full)
    status, _, err = tool(evaluate, f"--workdir={workdir}", "--max_examples=2")
    _one_error(status, err, "no space left on", "while writing", "free space and rerun")
    assert _digest(workdir) == before  # eval.json and the records of the first run, no temporaries


@needs_mount
@pytest.mark.slow
def test_evaluate_command_on_a_full_tmpfs(trained):
    with _tmpfs(_room_for(trained, 512)) as point:
        workdir = _copy(trained, point)
        (point / "fill").write_bytes(b"")
        # Unbuffered, and the suppression outside the file: a buffered file's close flushes
        # what the full disk refused and raises again.
        with contextlib.suppress(OSError), open(point / "fill", "wb", buffering=0) as fill:
            while True:
                fill.write(b"\0" * 65536)
        result = tiny_runs.command("evaluate", f"--workdir={workdir}", "--max_examples=2")
        _one_error(result.returncode, result.stderr, f"no space left on {point}", "while writing")
        assert not list((workdir / "eval").glob("*")) and not (workdir / "eval.json").exists()


# ---------------------------------------------------------------------------------------------
# 2. A read-only workdir: stop before any work


def _read_only_probe(monkeypatch) -> None:
    """The write probe meets EROFS, as on a read-only mount (root ignores chmod)."""

    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(storage.tempfile, "TemporaryFile", refuse)


def test_read_only_workdir_stops_before_the_restore(trained, tool, tmp_path, monkeypatch, capsys):
    workdir = _copy(trained, tmp_path)
    before = _digest(workdir)
    _read_only_probe(monkeypatch)

    def no_restore(*args, **kwargs):
        raise AssertionError("restored before checking the workdir can be written")

    monkeypatch.setattr(restoration, "restore", no_restore)
    monkeypatch.setattr(build, "build", no_restore)
    source = tmp_path / "src.txt"
    source.write_text("s1 s2\n")
    for module, args in (
        (evaluate, []),
        (evaluate, [f"--source_file={source}", f"--reference_file={source}"]),
        (attention_map, ["--text=s1 s2"]),
    ):
        status, _, err = tool(module, f"--workdir={workdir}", *args)
        _one_error(status, err, "cannot write to", "Read-only file system")
    config = config_utils.load_config("configs/base.py:tiny", REVERSE)
    status, err = _train(config, workdir, capsys)
    line = _one_error(status, err, f"cannot write to workdir {workdir}: Read-only file system")
    assert line.endswith("choose another workdir or make it writable")
    monkeypatch.undo()
    assert _digest(workdir) == before


def test_a_read_only_out_names_the_flag(trained, tool, tmp_path, monkeypatch):
    _read_only_probe(monkeypatch)
    out = tmp_path / "pictures"
    status, _, err = tool(attention_map, f"--workdir={trained}", "--text=s1", f"--out={out}")
    line = _one_error(status, err, f"cannot write to --out {out}")
    assert line.endswith("pass --out=<a writable directory>")


@needs_mount
@pytest.mark.slow
def test_commands_on_a_read_only_mount(trained):
    """Train (resume), evaluate and attention_map refuse in one line; translate only reads."""
    with _tmpfs(_room_for(trained, 2048)) as point:
        workdir = _copy(trained, point)
        before = _digest(workdir)
        _remount(point, "ro")
        expected = f"cannot write to workdir {workdir}: Read-only file system (on {point})"
        result = tiny_runs.command("train", *TINY, f"--workdir={workdir}")
        _one_error(result.returncode, result.stderr, expected)
        result = tiny_runs.command("evaluate", f"--workdir={workdir}")
        _one_error(result.returncode, result.stderr, expected)
        result = tiny_runs.command("attention_map", f"--workdir={workdir}", "--text=s1")
        _one_error(result.returncode, result.stderr, "Read-only file system")
        result = tiny_runs.command("translate", f"--workdir={workdir}", stdin="s1 s2\n")
        assert result.returncode == 0, result.stderr
        _remount(point, "rw")
        assert _digest(workdir) == before


# ---------------------------------------------------------------------------------------------
# 5. metrics.jsonl after a resume


def _records(*steps, kind="train"):
    return "".join(json.dumps({"step": s, "kind": kind, "loss": float(s)}) + "\n" for s in steps)


def test_drop_after_keeps_the_steps_up_to_the_resumed_one(tmp_path):
    path = tmp_path / logger.METRICS_FILE
    path.write_text(_records(10, 20, 30) + _records(20, kind="eval") + _records(40) + '{"step"')
    writer = logger.MetricWriter(tmp_path)
    assert writer.drop_after(20) == 3  # 30, 40 and the cut-off line
    assert [(r["step"], r["kind"]) for r in logger.read_metrics(tmp_path)] == [
        (10, "train"),
        (20, "train"),
        (20, "eval"),
    ]
    writer.write(30, "train", {"loss": 3.5})
    writer.close()
    assert [r["step"] for r in logger.read_metrics(tmp_path, "train")] == [10, 20, 30]
    assert writer.drop_after(30) == 0
    assert logger.MetricWriter(tmp_path / "none").drop_after(0) == 0


def test_a_resumed_run_logs_each_step_once(tmp_path):
    """A run killed after logging steps 3 and 4 but saving only step 2 resumes from 2."""
    overrides = (
        *REVERSE,
        "train.num_train_steps=4",
        "train.log_every_steps=1",
        "train.checkpoint_every_steps=2",
    )
    config = config_utils.load_config("configs/base.py:tiny", overrides)
    workdir = tmp_path / "run"
    trainer.train_and_evaluate(config, workdir)
    first = logger.read_metrics(workdir, "train")
    checkpoints = workdir / "checkpoints"
    (checkpoints / "4").rename(checkpoints / f"4.orbax-checkpoint-tmp-{uuid.uuid4().hex[:6]}")
    lines = (workdir / logger.METRICS_FILE).read_text().splitlines()
    (workdir / logger.METRICS_FILE).write_text("\n".join(lines[:-1]) + "\n")  # no final_eval
    trainer.train_and_evaluate(config, workdir)
    records = logger.read_metrics(workdir)
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3, 4]
    assert [r["step"] for r in records if r["kind"] == "final_eval"] == [4]
    again = logger.read_metrics(workdir, "train")
    assert again[2]["loss"] == pytest.approx(first[2]["loss"], rel=1e-6)  # replayed exactly


def test_library_evaluate_checks_before_loading(trained, tmp_path, monkeypatch):
    _read_only_probe(monkeypatch)
    with pytest.raises(errors.StorageError, match="Read-only file system"):
        evaluator.evaluate_workdir(trained)
