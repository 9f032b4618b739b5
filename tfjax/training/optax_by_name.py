"""Any optax optimizer by its name and keyword arguments (`optim.optimizer`, `optim.kwargs`).

`optim.optimizer="lion"` with `optim.kwargs={"b1": 0.95}` builds
`optax.lion(learning_rate=schedule, b1=0.95, weight_decay=optim.weight_decay)`. tfjax passes
three arguments itself (`SET_BY_TFJAX`): the learning rate (the schedule of `optim.schedule`
and `optim.learning_rate`), and where the optimizer takes them its `weight_decay`
(`optim.weight_decay`: 0 turns it off, whatever optax's default) and `mask`
(`optim.weight_decay_params="matrices"`: `tfjax.training.optim.decay_mask`). Every other
argument keeps optax's default unless `optim.kwargs` sets it. A name is a function of `optax`
("lion", "adafactor") or of `optax.contrib` ("contrib.prodigy") that takes a `learning_rate`:
tfjax lists none of them, so a stock optimizer needs no edit here.

The train step calls `update(grads, state, params)`: optimizers whose update needs more (the
loss value or function: `lbfgs`, `contrib.momo`, `contrib.sophia`; per-example gradients:
`contrib.dpsgd`) do not fit it.
"""

import difflib
import inspect
import numbers
from collections.abc import Callable, Mapping
from typing import Any

import optax

from tfjax import errors

# The arguments tfjax passes itself, and the config fields that set them.
SET_BY_TFJAX = {
    "learning_rate": "optim.learning_rate and optim.schedule",
    "weight_decay": "optim.weight_decay",
    "mask": "optim.weight_decay_params",
}
_CONTRIB = "contrib."


def _parameters(fn: Any) -> Mapping[str, inspect.Parameter]:
    """`fn`'s parameters; none for what has no signature (a class, a constant)."""
    if not callable(fn) or isinstance(fn, type):
        return {}
    try:
        return inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}


def factory(name: str) -> Callable[..., optax.GradientTransformation] | None:
    """`optax.<name>` (or `optax.contrib.<rest>` for "contrib.<rest>") if it is a function
    with a `learning_rate` argument, else None."""
    module, attr = (
        (optax.contrib, name[len(_CONTRIB) :]) if name.startswith(_CONTRIB) else (optax, name)
    )
    fn = getattr(module, attr, None) if attr.isidentifier() and not attr.startswith("_") else None
    return fn if "learning_rate" in _parameters(fn) else None


def names() -> tuple[str, ...]:
    """Every optax optimizer `factory` accepts, sorted (those of `optax.contrib` last)."""
    found = [n for n in dir(optax) if factory(n) is not None]
    found += [_CONTRIB + n for n in dir(optax.contrib) if factory(_CONTRIB + n) is not None]
    return tuple(found)


def check_name(name: str, recipes: tuple[str, ...]) -> None:
    """Raises `ConfigError` listing the choices unless `name` is a recipe or `factory`'s."""
    if name in recipes or (isinstance(name, str) and factory(name) is not None):
        return
    others = [n for n in names() if n not in recipes]
    close = difflib.get_close_matches(str(name), [*recipes, *others], n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
    raise errors.ConfigError(
        f"OptimConfig.optimizer: got {name!r}{hint}; expected one of tfjax's recipes "
        f"({', '.join(recipes)}) or the name of an optax optimizer ({', '.join(others)})"
    )


def _show(value: Any) -> str:
    return getattr(value, "__name__", None) or repr(value)


def accepted(name: str) -> str:
    """What `optim.kwargs` may set for optimizer `name`: its arguments with their defaults."""
    own = [
        p.name if p.default is p.empty else f"{p.name}={_show(p.default)}"
        for p in _parameters(factory(name)).values()
        if p.name not in SET_BY_TFJAX and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    by_tfjax = "; ".join(f"{k} from {v}" for k, v in SET_BY_TFJAX.items())
    return f"optim.kwargs takes {', '.join(own) or 'nothing'} ({by_tfjax})"


def check_kwargs(name: str, kwargs: Mapping[str, Any], *, weight_decay: float, matrices: bool):
    """Raises `ConfigError` (naming the optimizer and what it accepts) for keyword arguments
    optax's `name` does not take, values of another type than its default's, a required
    argument left out, or weight decay (`matrices`: on the matrices only) it cannot apply."""
    params = _parameters(factory(name))
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    where = f"OptimConfig.kwargs: optax.{name}"
    for key, value in kwargs.items():
        if key in SET_BY_TFJAX:
            raise errors.ConfigError(f"{where}'s {key!r} is set by {SET_BY_TFJAX[key]}; drop it")
        if key not in params and not takes_any:
            raise errors.ConfigError(f"{where} takes no argument {key!r}; {accepted(name)}")
        _check_type(where, key, value, params.get(key))
    missing = [
        p.name
        for p in params.values()
        if p.default is p.empty and p.name not in (*kwargs, *SET_BY_TFJAX)
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if missing:
        raise errors.ConfigError(f"{where} needs {', '.join(missing)}; {accepted(name)}")
    if weight_decay > 0 and "weight_decay" not in params:
        raise errors.ConfigError(
            f"OptimConfig.weight_decay: optax.{name} takes no weight_decay, got "
            f"{weight_decay!r}: set optim.weight_decay=0; {accepted(name)}"
        )
    if weight_decay > 0 and matrices and "mask" not in params:
        raise errors.ConfigError(
            f"OptimConfig.weight_decay_params: optax.{name} takes no mask to decay the "
            f"matrices only: set optim.weight_decay_params=all; {accepted(name)}"
        )


def _check_type(where: str, key: str, value: Any, param: inspect.Parameter | None) -> None:
    """A value for an argument whose default is a bool must be one, for a number a number
    (or None, which many optax arguments take for "off")."""
    default = inspect.Parameter.empty if param is None else param.default
    if isinstance(default, bool):
        ok, expected = isinstance(value, bool), "true or false"
    elif isinstance(default, numbers.Real):
        number = isinstance(value, numbers.Real) and not isinstance(value, bool)
        ok, expected = number or value is None, "a number"
    else:
        return
    if not ok:
        raise errors.ConfigError(
            f"{where}'s {key!r} must be {expected} (default {default!r}), got {value!r}"
        )


def build(
    name: str,
    learning_rate: optax.ScalarOrSchedule,
    kwargs: Mapping[str, Any],
    *,
    weight_decay: Any,
    mask: Any = None,
) -> optax.GradientTransformation:
    """`optax.<name>(learning_rate=..., **kwargs)`, with `weight_decay` (a float, or a traced
    scalar in a vectorised sweep) and `mask` (unless None) where it takes them; the arguments
    checked by `check_kwargs` first.

    Raises:
        tfjax.errors.ConfigError: if optax refuses the arguments (a bad value, or a value
            traced per trial that optax branches on in Python).
    """
    fn = factory(name)
    params = _parameters(fn)
    arguments = {"learning_rate": learning_rate, **kwargs}
    if "weight_decay" in params:
        arguments["weight_decay"] = weight_decay
    if mask is not None and "mask" in params:
        arguments["mask"] = mask
    try:
        return fn(**arguments)
    except (TypeError, ValueError) as err:  # jax's ConcretizationTypeError is a TypeError
        reason = " ".join(str(err).split())[:300]
        raise errors.ConfigError(
            f"optax.{name} refused optim.kwargs {dict(kwargs)!r}: {reason}; {accepted(name)}"
        ) from err
