"""Population-based training's two moves on a vectorised sweep's trial axis, as pure functions
to jit: `exploit` (trials copy other trials' train states, a gather on the trial axis) and
`explore` (the copies perturb or resample their hyperparameters, from an explore key).

Both run on the devices: the trials' states never leave them and the hyperparameters stay
arrays of the same shapes and dtypes, so the vectorised step that takes them as arguments is
not compiled again (`tfjax.runs.pbt` decides who copies whom and calls these).
"""

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from tfjax.training import vectorized


def exploit(state: vectorized.SweepState, source: jax.Array) -> vectorized.SweepState:
    """Each trial i takes the train state of trial `source[i]` (itself: unchanged).

    Args:
        state: the group's state, every leaf of `state.train` [T, ...].
        source: int32 [T], the trial each trial's train state is copied from.

    Returns:
        `state` with `train` gathered on the trial axis; `live` unchanged.
    """
    train = jax.tree.map(lambda leaf: jnp.take(leaf, source, axis=0), state.train)
    return state.replace(train=train)


def explore(
    hyper: Mapping[str, jax.Array],
    source: jax.Array,
    key: jax.Array,
    *,
    names: Sequence[str],
    factors: jax.Array,
    resample_probability: float,
    choices: Mapping[str, jax.Array],
) -> tuple[dict[str, jax.Array], jax.Array]:
    """The hyperparameters after trials copied others (`source`), and the next explore key.

    Every hyperparameter is copied from the source trial. Each trial that copied another
    (`source[i] != i`) then explores each of `names`: with probability `resample_probability`
    it takes a value drawn uniformly from `choices[name]`, otherwise its copied value times a
    factor drawn uniformly from `factors`. The draws of hyperparameter j use
    `fold_in(key, j)`; the key returned is `split(key)[0]`.

    Args:
        hyper: {name: [T]} the trials' hyperparameters (`optim.traced_hyper`, stacked).
        source: int32 [T].
        key: the explore key (a typed PRNG key, scalar).
        names: the hyperparameters explored (float32 entries of `hyper`).
        factors: float32 [F], the perturbation factors.
        resample_probability: in [0, 1].
        choices: {name: float32 [C]} the values a resample draws from.

    Returns:
        ({name: [T]} with the dtypes of `hyper`, the next key).
    """
    copied = {name: jnp.take(value, source, axis=0) for name, value in hyper.items()}
    replaced = source != jnp.arange(source.shape[0])
    for index, name in enumerate(names):
        pick, coin, draw = jax.random.split(jax.random.fold_in(key, index), 3)
        shape = source.shape
        factor = factors[jax.random.randint(pick, shape, 0, factors.shape[0])]
        perturbed = copied[name] * factor
        values = choices[name]
        sampled = values[jax.random.randint(draw, shape, 0, values.shape[0])]
        resampled = jax.random.uniform(coin, shape) < resample_probability
        explored = jnp.where(resampled, sampled, perturbed).astype(copied[name].dtype)
        copied[name] = jnp.where(replaced, explored, copied[name])
    return copied, jax.random.split(key)[0]


def key_to_list(key: jax.Array) -> list[int]:
    """A typed PRNG key as plain ints (for a checkpoint's JSON items)."""
    return [int(x) for x in jax.device_get(jax.random.key_data(key)).ravel()]


def key_from_list(data: Sequence[int], like: jax.Array) -> jax.Array:
    """The key `key_to_list` wrote, of the implementation of `like`."""
    shape = jax.random.key_data(like).shape
    return jax.random.wrap_key_data(
        jnp.asarray(data, jnp.uint32).reshape(shape), impl=jax.random.key_impl(like)
    )


def as_lists(hyper: Mapping[str, Any]) -> dict[str, list]:
    """{name: [T]} arrays as plain Python numbers (float32 values round-trip exactly)."""
    return {name: jax.device_get(value).tolist() for name, value in hyper.items()}
