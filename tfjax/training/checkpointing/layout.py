"""What one checkpoint step holds on disk, and how each item is encoded.

A step directory `<directory>/<step>/` holds the train state as a pytree (`state`, orbax
StandardSave, so sharded `jax.Array`s work) and four JSON items: `rng` (key data and
implementation name), `data_state`, `config` and `checksums` (see `checksums`). orbax writes
`COMMIT_MARKER` as the last act of a save. This module is the on-disk format: a change here
makes the checkpoints of earlier runs unreadable.
"""

import json
import os
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from tfjax.training.checkpointing import checksums

# Written by orbax as the last act of a save (`ocp.options.AtomicityOptions`); a step directory
# without it was never finished.
COMMIT_MARKER = "commit_success.txt"
JSON_ITEMS = ("rng", "data_state", "config", "checksums")
STATE_ITEM = "state"  # the train state's item (orbax StandardSave): `<step>/state/`
# orbax's JsonSave keeps each JSON item in `<step>/<item>/JSON_FILE`; the `config` item's is a
# copy of the run's config.json (the same JSON, unindented).
JSON_FILE = "metadata"
CONFIG_COPY = f"config/{JSON_FILE}"


def newest_config(directory: str | os.PathLike) -> tuple[pathlib.Path, dict] | None:
    """(its path, the config) of the newest step's `CONFIG_COPY` under `directory` that reads
    as a JSON object; steps whose copy does not are skipped (a restore reports them). None if
    there is none. Reads the file alone: no orbax manager is opened."""
    directory = pathlib.Path(directory)
    steps = [int(p.name) for p in directory.glob("*") if p.name.isdigit() and p.is_dir()]
    for step in sorted(steps, reverse=True):
        path = directory / str(step) / CONFIG_COPY
        try:
            tree = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(tree, dict):
            return path, tree
    return None


def save_args(state: Any, *, rng: jax.Array, data_state: dict, config: dict) -> ocp.args.Composite:
    """The orbax items of one step, checked and encoded; see `Checkpointer.save` for the args.

    Raises:
        TypeError: if `rng` is not a typed key or a JSON item is not plain JSON.
    """
    json_items = {
        "rng": key_to_json(rng),
        "data_state": check_json("data_state", data_state),
        "config": check_json("config", config),
        "checksums": checksums.checksums(state),
    }
    return ocp.args.Composite(
        **{STATE_ITEM: ocp.args.StandardSave(state)},
        **{k: ocp.args.JsonSave(v) for k, v in json_items.items()},
    )


def restore_args(abstract_state: Any) -> ocp.args.Composite:
    """Reads every item of a step, the state placed as `abstract_state`'s shardings say."""
    target = jax.tree.map(_abstract_leaf, abstract_state)
    return ocp.args.Composite(
        **{STATE_ITEM: ocp.args.StandardRestore(target)},
        **{k: ocp.args.JsonRestore() for k in JSON_ITEMS},
    )


def config_args(*, checksums: bool = False) -> ocp.args.Composite:
    """Reads only the `config` item of a step (and its `checksums` item when `checksums`)."""
    items = {"config": ocp.args.JsonRestore()}
    if checksums:
        items["checksums"] = ocp.args.JsonRestore()
    return ocp.args.Composite(**items)


def check_json(name: str, value: dict) -> dict:
    """Returns `value` if it is a dict that a JSON round trip leaves unchanged.

    Raises:
        TypeError: naming `name`, if `value` is not such a dict.
    """
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


def key_to_json(rng: jax.Array) -> dict:
    """A typed PRNG key as {"impl": name, "key_data": nested list of ints, "dtype": name}.

    Raises:
        TypeError: if `rng` is a raw uint32 key rather than a typed one.
    """
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


def key_from_json(item: dict) -> jax.Array:
    """The typed PRNG key that `key_to_json` encoded, bit-exact and with its implementation."""
    data = np.asarray(item["key_data"], dtype=item["dtype"])
    return jax.random.wrap_key_data(data, impl=item["impl"])


def _abstract_leaf(leaf: Any) -> jax.ShapeDtypeStruct:
    """A restore target for one leaf: its shape, dtype and sharding (default: first device)."""
    sharding = getattr(leaf, "sharding", None)
    if sharding is None:
        sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)
