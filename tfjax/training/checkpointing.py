"""Checkpoints of a training run: train state, PRNG key, data-iterator position and config.

`Checkpointer` wraps an orbax `CheckpointManager` over `workdir/checkpoints`: one step directory
per saved step, the newest `max_to_keep` kept, each holding the train state as a pytree (`state`,
orbax StandardSave, so sharded `jax.Array`s work) and four JSON items: `rng` (key data and
implementation name), `data_state`, `config` and `checksums`. Saves are asynchronous: `save`
returns once the arrays are in host memory; `wait` blocks until they are on disk.

Restoring places the arrays as the abstract state's shardings say, so a checkpoint written from 8
devices restores onto 1 and vice versa. A step is damaged when its orbax commit marker is missing,
when orbax cannot read it, or when the arrays read back disagree with per-array checksums written
at save time (orbax keeps none: a flipped bit in a data file otherwise restores silently).
`restore()` then warns and falls back to the previous step. Restoring never deletes or rewrites
anything; a damaged step is moved aside (to `<step>.corrupt`) only when `save` needs its number.
"""

import dataclasses
import json
import logging
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils
from orbax.checkpoint import checkpoint_managers

log = logging.getLogger(__name__)

# Written by orbax as the last act of a save (`ocp.options.AtomicityOptions`); a step directory
# without it was never finished.
_COMMIT_MARKER = "commit_success.txt"
_JSON_ITEMS = ("rng", "data_state", "config", "checksums")
_ABSENT = object()  # a config key missing on one side of `check_compatible`


@dataclasses.dataclass
class Restored:
    """What `Checkpointer.restore` returns.

    Attributes:
        step: the step the checkpoint was saved at.
        state: the train state, with the structure and shardings of the abstract state.
        rng: the typed PRNG key given to `save`, bit-exact and with the same implementation.
        data_state: the data iterator's position (JSON dict).
        config: the resolved run config (JSON dict).
    """

    step: int
    state: Any
    rng: jax.Array
    data_state: dict
    config: dict


class CheckpointRestoreError(RuntimeError):
    """Checkpoints exist but none of the ones tried could be restored."""


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
        """
        if max_to_keep < 1:
            raise ValueError(
                f"max_to_keep must be at least 1, got {max_to_keep}; keep at least "
                "the newest checkpoint so the run can resume."
            )
        self.directory = epath.Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(
            preservation_policy=checkpoint_managers.LatestN(max_to_keep),
            enable_async_checkpointing=async_save,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)
        self._damaged: set[int] = set()  # steps whose restore failed in this process

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc_info) -> None:
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
        configs = []
        for step in reversed(self.all_steps()):
            try:
                items = self._manager.restore(
                    step, args=ocp.args.Composite(config=ocp.args.JsonRestore())
                )
            except Exception:
                continue
            if isinstance(items.config, dict):
                configs.append(items.config)
        return configs

    def wait(self) -> None:
        """Blocks until asynchronous saves are on disk; re-raises their errors."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves and releases orbax's threads."""
        self._manager.close()

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
        """
        json_items = {
            "rng": _key_to_json(rng),
            "data_state": _check_json("data_state", data_state),
            "config": _check_json("config", config),
            "checksums": _checksums(state),
        }
        self._make_room(step)
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            **{k: ocp.args.JsonSave(v) for k, v in json_items.items()},
        )
        return bool(self._manager.save(step, args=args, force=force))

    def restore(self, abstract_state: Any, *, step: int | None = None) -> Restored | None:
        """Restores checkpoint `step`, or the newest readable one when `step` is None.

        With `step=None`, a damaged step is reported with `logging.warning` (step and reason) and
        the next older one is tried.

        Args:
            abstract_state: pytree of `jax.ShapeDtypeStruct` (or arrays) with the structure,
                shapes and dtypes of the saved state; leaves with a `.sharding` are placed by it,
                the others on the first local device.
            step: a specific step to restore (no fallback), or None for the newest good one.

        Returns:
            The restored checkpoint, or None if the directory holds no checkpoint.

        Raises:
            ValueError: if `step` was given but is not in `all_steps()`.
            CheckpointRestoreError: if every step tried is damaged or does not match
                `abstract_state`; the message lists each step with its reason.
        """
        self.wait()  # the newest step may still be being written
        self._manager.reload()  # see steps written or damaged since this manager was built
        steps = self.all_steps()
        if step is not None and step not in steps:
            raise ValueError(
                f"no checkpoint for step {step} in {self.directory}; available "
                f"steps: {steps}. Pass one of them, or step=None for the newest."
            )
        failures = []
        for candidate in [step] if step is not None else reversed(steps):
            try:
                return self._restore_step(candidate, abstract_state)
            except Exception as e:  # orbax and tensorstore raise many types; any means unusable
                failures.append(f"step {candidate}: {_first_line(e)}")
                self._damaged.add(candidate)
                if step is None:
                    log.warning(
                        "%s: damaged checkpoint %s; trying the previous one",
                        self.directory,
                        failures[-1],
                    )
        if failures:
            raise _restore_error(self.directory, failures)
        return None

    def restore_average(self, abstract_state: Any, *, last: int) -> Restored:
        """The newest of the last `last` saved steps, its parameters averaged over all of them.

        Checkpoint averaging (Vaswani et al. 2017, §6.1: the last 5 checkpoints for the base
        models) smooths the noise of the final updates. Optimizer state, rng and data state are
        those of the newest step.

        Raises:
            ValueError: if fewer than `last` steps are saved (raise `train.keep_checkpoints`).
            CheckpointRestoreError: if one of the steps cannot be restored.
        """
        self.wait()
        self._manager.reload()
        steps = self.all_steps()
        if last < 1 or len(steps) < last:
            raise ValueError(
                f"cannot average the last {last} checkpoints: {self.directory} holds steps "
                f"{steps}; train with train.keep_checkpoints >= {last}"
            )
        newest, total = None, None
        for step in steps[-last:]:
            newest = self.restore(abstract_state, step=step)
            params = newest.state.params
            total = params if total is None else jax.tree.map(jnp.add, total, params)
        averaged = jax.tree.map(lambda x: (x / last).astype(x.dtype), total)
        return dataclasses.replace(newest, state=newest.state.replace(params=averaged))

    def _restore_step(self, step: int, abstract_state: Any) -> Restored:
        """Restores and verifies one step; raises if anything about it is wrong."""
        if not (self.directory / str(step) / _COMMIT_MARKER).exists():
            raise FileNotFoundError(
                f"{self.directory / str(step)} has no {_COMMIT_MARKER}: its save never finished"
            )
        target = jax.tree.map(_abstract_leaf, abstract_state)
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(target),
            **{k: ocp.args.JsonRestore() for k in _JSON_ITEMS},
        )
        items = self._manager.restore(step, args=args)
        _verify_checksums(items.state, items.checksums)
        for name in ("data_state", "config"):
            if not isinstance(items[name], dict):
                raise TypeError(f"item {name!r} is a {type(items[name]).__name__}, not a dict")
        return Restored(
            step=step,
            state=items.state,
            rng=_key_from_json(items.rng),
            data_state=items.data_state,
            config=items.config,
        )

    def _make_room(self, step: int) -> None:
        """Moves a damaged checkpoint for `step` aside; refuses to replace a readable one."""
        self.wait()  # orbax's save waits for the previous one anyway; this settles all_steps
        if step not in self._manager.all_steps():
            return
        if step not in self._damaged:
            raise ValueError(
                f"a checkpoint for step {step} already exists in {self.directory}; checkpoints "
                "are never overwritten. Resume from it with restore(), or use another directory."
            )
        path = self.directory / str(step)
        aside = self.directory / f"{step}.corrupt"
        suffix = 1
        while aside.exists():
            aside, suffix = self.directory / f"{step}.corrupt{suffix}", suffix + 1
        if jax.process_index() == 0:
            log.warning(
                "moving damaged checkpoint %s to %s before saving step %d again", path, aside, step
            )
            path.rename(aside)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"tfjax_checkpointing_make_room_{step}")
        self._damaged.discard(step)
        self._manager.reload()


def _restore_error(directory: epath.Path, failures: list[str]) -> CheckpointRestoreError:
    return CheckpointRestoreError(
        f"no checkpoint in {directory} could be restored. Tried:\n  "
        + "\n  ".join(failures)
        + "\nIf the model or optimizer settings changed since these were written, rerun with the "
        "original settings or pick another --workdir; otherwise the files are damaged: move them "
        "away to start afresh."
    )


def check_compatible(saved_config: dict, config: dict, *, section: str = "model") -> None:
    """Checks that `config[section]` equals the one a checkpoint was written with.

    Call it before anything in the workdir is overwritten.

    Args:
        saved_config: the config stored with the checkpoint (`Restored.config`).
        config: the config of the current run, as a JSON dict.
        section: the top-level group to compare, e.g. "model" or "data".

    Raises:
        ValueError: listing each differing key with its saved and current value.
    """
    saved = _flatten(saved_config.get(section, {}), section)
    now = _flatten(config.get(section, {}), section)
    diffs = [
        (key, saved.get(key, _ABSENT), now.get(key, _ABSENT))
        for key in sorted(saved.keys() | now.keys())
        if saved.get(key, _ABSENT) != now.get(key, _ABSENT)
    ]
    if not diffs:
        return
    lines = [f"  {key}: saved {_show(old)}, now {_show(new)}" for key, old, new in diffs]
    flags = " ".join(f"--config.{key}={_show(old)}" for key, old, _ in diffs if old is not _ABSENT)
    raise ValueError(
        f"the checkpoint in this workdir was written with different `{section}` settings:\n"
        + "\n".join(lines)
        + "\nResuming would mix two runs. Pick another --workdir for the new settings, or "
        f"restore the original ones{' (' + flags + ')' if flags else ''}."
    )


def _flatten(tree: Any, prefix: str) -> dict[str, Any]:
    """Nested dicts as {"a.b.c": leaf}; non-dict values are leaves."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    flat = {}
    for key, value in tree.items():
        flat.update(_flatten(value, f"{prefix}.{key}"))
    return flat


def _show(value: Any) -> str:
    return "<absent>" if value is _ABSENT else json.dumps(value)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def _check_json(name: str, value: dict) -> dict:
    """Returns `value` if it is a dict that a JSON round trip leaves unchanged."""
    try:
        same = json.loads(json.dumps(value, allow_nan=False)) == value
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"{name} must be plain JSON to be checkpointed: {e}. Convert it first, "
            "e.g. json.loads(config.to_json_best_effort())."
        ) from e
    if not isinstance(value, dict) or not same:
        raise TypeError(
            f"{name} must be a dict that survives a JSON round trip unchanged (no "
            "tuples, no non-string keys), or the restored run would differ; convert "
            "it first, e.g. json.loads(json.dumps(value))."
        )
    return value


def _key_to_json(rng: jax.Array) -> dict:
    """A typed PRNG key as {"impl": name, "key_data": nested list of uint32}."""
    if not jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
        raise TypeError(
            f"rng must be a typed key from jax.random.key(seed), got dtype "
            f"{rng.dtype}; wrap a raw key with jax.random.wrap_key_data(raw)."
        )
    data = np.asarray(jax.device_get(jax.random.key_data(rng)))
    return {
        "impl": str(jax.random.key_impl(rng)),
        "key_data": data.tolist(),
        "dtype": str(data.dtype),
    }


def _key_from_json(item: dict) -> jax.Array:
    data = np.asarray(item["key_data"], dtype=item["dtype"])
    return jax.random.wrap_key_data(data, impl=item["impl"])


def _abstract_leaf(leaf: Any) -> jax.ShapeDtypeStruct:
    """A restore target for one leaf: its shape, dtype and sharding (default: first device)."""
    sharding = getattr(leaf, "sharding", None)
    if sharding is None:
        sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)


@jax.jit
def _leaf_checksum(x: jax.Array) -> jax.Array:
    """sum_i bits_i * (2i + 1) mod 2**32 over the raw bits: any single flipped bit changes it."""
    if x.dtype == jnp.bool_:
        bits = x.astype(jnp.uint32)
    else:
        unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
        bits = jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)
    bits = bits.ravel()  # [n]; 8-byte dtypes give two words per element
    weights = 2 * jnp.arange(bits.size, dtype=jnp.uint32) + 1
    return jnp.sum(bits * weights, dtype=jnp.uint32)  # integer sums are order-independent


def _checksums(tree: Any) -> dict[str, int]:
    """{key path: checksum} of every array leaf, the same for any sharding of the values."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    sums = jax.device_get([_leaf_checksum(leaf) for _, leaf in leaves])
    return {jax.tree_util.keystr(path): int(s) for (path, _), s in zip(leaves, sums, strict=True)}


def _verify_checksums(tree: Any, saved: dict[str, int]) -> None:
    """Raises ValueError naming the first array whose bits differ from what was saved."""
    actual = _checksums(tree)
    if actual.keys() != saved.keys():
        raise ValueError(
            f"the state has leaves {sorted(actual)} but the checksums cover {sorted(saved)}"
        )
    for key, value in actual.items():
        if value != saved[key]:
            raise ValueError(
                f"checksum mismatch in state{key} (saved {saved[key]}, read "
                f"{value}): a data file was altered after saving"
            )
