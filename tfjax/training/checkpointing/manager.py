"""`Checkpointer`: an orbax `CheckpointManager` over one directory of training checkpoints.

It owns the manager (saving, retention of the newest `max_to_keep` steps, asynchronous writes)
and the set of steps found damaged in this process; what a step holds is `layout`, how steps are
read back and checked is `restoring`.

A save that fails because the disk is full (or read-only) fails wherever orbax reports it (the
save itself, or a later wait, save or close, since the writes run in background threads) as
one `tfjax.errors.StorageError` naming the filesystem, the step, about how much it needed and
the last complete checkpoint; the step's partial directory is removed, the complete steps stay.
"""

import contextlib
import logging
import os
import shutil
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import checkpoint_managers

from tfjax import errors
from tfjax.training import storage
from tfjax.training.checkpointing import layout, restoring


class _QuietFullDisk(logging.Filter):
    """Drops the error records (with their tracebacks) that orbax's background threads and
    asyncio log when a checkpoint write meets a full or read-only disk: `Checkpointer` raises
    the one-line `StorageError` that says the same. A record is dropped when it names a full
    or read-only disk and either comes from orbax or asyncio (their `OSError` often carries no
    file name: `[Errno 28] No space left on device`) or names a directory of `paths`. Every
    other record passes."""

    def __init__(self):
        super().__init__()
        self.paths: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        text = record.getMessage() + (str(record.exc_info[1]) if record.exc_info else "")
        if storage.storage_problem(RuntimeError(text)) is None:
            return True
        source = record.pathname.replace(os.sep, "/")
        from_a_writer = "/orbax/" in source or "/asyncio/" in source
        return not (from_a_writer or any(path in text for path in self.paths))


_quiet_full_disk = _QuietFullDisk()


class Checkpointer:
    """Saves and restores train states in one directory; also a context manager.

    Example:
        with Checkpointer(workdir / "checkpoints", max_to_keep=3) as checkpointer:
            restored = checkpointer.restore(abstract_state)
            ...
            checkpointer.save(step, state, rng=rng, data_state=it.get_state(), config=cfg)
    """

    def __init__(
        self, directory: str | os.PathLike, *, max_to_keep: int = 3, async_save: bool = True
    ):
        """Opens (and creates) `directory`; existing checkpoints are left as they are.

        Args:
            directory: where the step directories live, e.g. `workdir/checkpoints`.
            max_to_keep: how many of the newest steps to keep; older ones are deleted on save.
            async_save: write in a background thread, so `save` returns before the files exist.

        Raises:
            ValueError: if `max_to_keep` is less than 1.
            NotADirectoryError: if `directory` or one of its parents is a file.
        """
        self.directory = epath.Path(directory).absolute()
        self._manager = _open_manager(self.directory, max_to_keep, async_save)
        self._damaged: set[int] = set()  # steps whose restore failed in this process
        self._writing: tuple[int, int] | None = None  # (step, bytes) of the save in flight
        self._failed: errors.StorageError | None = None  # a save that could not be written
        _quiet_full_disk.paths.add(os.path.join(str(self.directory), ""))
        for name in ("absl", "asyncio"):  # orbax logs through absl
            if _quiet_full_disk not in logging.getLogger(name).filters:
                logging.getLogger(name).addFilter(_quiet_full_disk)

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if isinstance(exc, errors.DistributedError):
            return  # a process of the job is gone: waiting for its part of a save would hang
        self.close()

    def all_steps(self) -> list[int]:
        """Saved steps (including one still being written), oldest first, minus damaged ones."""
        return sorted(set(self._manager.all_steps()) - self._damaged)

    def latest_step(self) -> int | None:
        """The newest saved step (see `all_steps`), or None if there is none."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def saved_configs(self) -> list[dict]:
        """The run configs stored with the saved steps that can be read, newest first.

        Lets a caller refuse a workdir from another run before it tries to restore arrays of
        different shapes; unreadable steps are skipped here (`restore` reports them).
        """
        return restoring.read_configs(self._manager, reversed(self.all_steps()))

    def wait(self) -> None:
        """Blocks until asynchronous saves are on disk; re-raises their errors (a full or
        read-only disk as `StorageError`)."""
        with self._storage_checked():
            self._manager.wait_until_finished()
        self._writing = None

    def close(self) -> None:
        """Waits for pending saves and releases orbax's threads.

        A save that failed for lack of space and was reported already is not reported again.
        """
        try:
            if self._failed is None:
                with self._storage_checked():
                    self._manager.close()
            else:
                with contextlib.suppress(Exception):
                    self._manager.close()
        finally:
            self._writing = None

    @contextlib.contextmanager
    def _storage_checked(self, step: int | None = None, nbytes: int | None = None):
        """Turns a full or read-only disk met by the save in flight (or of `step`, `nbytes`)
        into one `StorageError`, after removing that step's partial directory."""
        if self._failed is not None:
            raise self._failed
        try:
            yield
        except Exception as err:
            problem = storage.storage_problem(err)
            if problem is None:
                raise
            if self._writing is not None:
                step, nbytes = self._writing
            self._failed = self._storage_error(problem, step, nbytes)
            raise self._failed from err

    def _storage_error(self, problem: str, step: int | None, nbytes: int | None):
        """The error of `problem` (storage.FULL or READ_ONLY) while saving `step`."""
        if step is not None:
            _remove_partial(self.directory, step)
        complete = [s for s in _complete_steps(self.directory) if s != step]
        kept = (
            f"the last complete checkpoint is step {complete[-1]}"
            if complete
            else "no checkpoint is complete yet"
        )
        doing = f"saving step {step}" if step is not None else "saving a checkpoint"
        if problem == storage.READ_ONLY:
            error = storage.read_only_error(self.directory, f"checkpoints {self.directory}")
            return errors.StorageError(f"{error} ({doing}; {kept})")
        return storage.full_disk_error(
            self.directory, doing, nbytes, f"{kept}; free space and rerun to resume"
        )

    def save(
        self,
        step: int,
        state: Any,
        *,
        rng: jax.Array,
        data_state: dict,
        config: dict,
        force: bool = False,
    ) -> bool:
        """Starts saving `state` and its companions as checkpoint `step`.

        Args:
            step: the step number; it names the checkpoint and must not exist yet.
            state: pytree of arrays (on one device, or sharded/replicated over several).
            rng: typed PRNG key (`jax.random.key(...)`), any shape.
            data_state: the data iterator's position; must survive a JSON round trip unchanged.
            config: the resolved run config; same JSON rule.
            force: save even if orbax's save policy would skip this step.

        Returns:
            Whether orbax started a save (with the default policy, always True).

        Raises:
            TypeError: if `rng` is not a typed key or a JSON item is not plain JSON.
            ValueError: if a readable checkpoint for `step` already exists.
            tfjax.errors.StorageError: if this save, or the one before it still being
                written, met a full or read-only disk (then every later call raises it too).
        """
        args = layout.save_args(state, rng=rng, data_state=data_state, config=config)
        self.wait()  # orbax's save waits for the previous one anyway; this settles all_steps
        nbytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state))
        with self._storage_checked(step, nbytes):
            restoring.make_room(self._manager, self.directory, step, damaged=self._damaged)
            self._writing = (step, nbytes)
            return bool(self._manager.save(step, args=args, force=force))

    def restore(
        self,
        abstract_state: Any,
        *,
        step: int | None = None,
        convert: restoring.ConvertFn | None = None,
    ) -> restoring.Restored | None:
        """Restores checkpoint `step`, or the newest readable one when `step` is None.

        With `step=None`, a damaged step is reported with `logging.warning` (step and reason) and
        the next older one is tried.

        Args:
            abstract_state: pytree of `jax.ShapeDtypeStruct` (or arrays) with the structure,
                shapes and dtypes of the saved state; leaves with a `.sharding` are placed by it,
                the others on the first local device.
            step: a specific step to restore (no fallback), or None for the newest good one.
            convert: given the config a step was saved with and its state's key paths, the
                `restoring.Conversion` from its state layout to `abstract_state`'s, or None when
                they match (e.g. a checkpoint of an unscanned model restored into a scanned
                one, `tfjax.runs.workdir_format.layout_conversion`).

        Returns:
            The restored checkpoint, or None if the directory holds no checkpoint.

        Raises:
            ValueError: if `step` was given but is not in `all_steps()`.
            CheckpointRestoreError: if every step tried is damaged or does not match
                `abstract_state`; the message lists each step with its reason.
        """
        steps = self._reload()
        if step is not None and step not in steps:
            raise errors.CheckpointError(
                f"no checkpoint for step {step} in {self.directory}; available "
                f"steps: {steps}; pick one of them, or none for the newest."
            )
        return restoring.restore_first_good(
            self._manager,
            self.directory,
            abstract_state,
            [step] if step is not None else reversed(steps),
            damaged=self._damaged,
            fallback=step is None,
            convert=convert,
        )

    def restore_average(
        self, abstract_state: Any, *, last: int, convert: restoring.ConvertFn | None = None
    ) -> restoring.Restored:
        """The newest of the last `last` saved steps, its parameters averaged over all of them.

        Checkpoint averaging (Vaswani et al. 2017, §6.1: the last 5 checkpoints for the base
        models) smooths the noise of the final updates. Optimizer state, rng and data state are
        those of the newest step. `convert`: see `restore` (per step).

        Raises:
            ValueError: if fewer than `last` steps are saved (raise `train.keep_checkpoints`).
            CheckpointRestoreError: if one of the steps cannot be restored.
        """
        steps = self._reload()
        if last < 1 or len(steps) < last:
            raise errors.CheckpointError(
                f"cannot average the last {last} checkpoints: {self.directory} holds steps "
                f"{steps}; train with train.keep_checkpoints >= {last}"
            )
        return restoring.average_params(
            lambda step: self.restore(abstract_state, step=step, convert=convert), steps[-last:]
        )

    def _reload(self) -> list[int]:
        """`all_steps()` once pending saves are done, re-read from disk."""
        self.wait()  # the newest step may still be being written
        self._manager.reload()  # see steps written or damaged since this manager was built
        return self.all_steps()


def _open_manager(
    directory: epath.Path, max_to_keep: int, async_save: bool
) -> ocp.CheckpointManager:
    """An orbax manager over `directory`; see `Checkpointer.__init__` for the arguments."""
    if max_to_keep < 1:
        raise errors.ConfigError(
            f"max_to_keep must be at least 1, got {max_to_keep}; keep at least "
            "the newest checkpoint so the run can resume."
        )
    _check_not_a_file(directory)
    options = ocp.CheckpointManagerOptions(
        preservation_policy=checkpoint_managers.LatestN(max_to_keep),
        enable_async_checkpointing=async_save,
    )
    return ocp.CheckpointManager(directory, options=options)


def _complete_steps(directory: epath.Path) -> list[int]:
    """The steps whose directories orbax has committed (renamed from their temporary names)."""
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def _remove_partial(directory: epath.Path, step: int) -> None:
    """Removes what a failed save of `step` left, `<step>.orbax-checkpoint-tmp*` (process 0),
    freeing the space it took; committed steps are never touched."""
    if jax.process_index() != 0 or not directory.is_dir():
        return
    for path in directory.iterdir():
        if path.name.startswith(f"{step}.orbax-checkpoint-tmp"):
            shutil.rmtree(path, ignore_errors=True)


def _check_not_a_file(directory: epath.Path) -> None:
    """Raises NotADirectoryError if `directory`, or its nearest existing parent, is a file.

    orbax would accept such a directory, list no steps, and then fail (or hang) in its save
    threads; checking first gives one clear message.
    """
    for path in (directory, *directory.parents):
        if not path.exists():
            continue
        if not path.is_dir():
            raise NotADirectoryError(
                f"cannot keep checkpoints in {directory}: {path} is a file, not a directory. "
                "Move the file away or choose another --workdir."
            )
        return
