"""What a search is, as a config file declares it (`get_search(NAME)`), and Optuna's side of it.

A config file's `get_search(name)` returns a dict (checked by `parse`)::

    {
        "space": {                                    # dotted config key -> its distribution
            "optim.learning_rate": {"log_uniform": (1e-4, 3e-2)},
            "model.dropout_rate": {"uniform": (0.0, 0.3)},
            "optim.warmup_steps": {"int": (0, 400)},  # optionally "step": 50 beside it
            "optim.schedule": {"categorical": ("cosine", "linear")},
        },
        "trials": 16,             # the study is done when this many trials have finished
        "per_generation": 4,      # suggestions asked at once and trained as one program
        "sampler": "tpe",         # tpe | random | qmc | cmaes, or {"name": ..., **its kwargs}
        "pruner": "median",       # none | median | percentile | halving | hyperband, or a dict
        "metric": "loss",         # a key of the trials' eval records
        "direction": "minimize",  # or "maximize"
        "seed": 0,                # the sampler's seed (see `make_sampler`)
    }

Every key but "space" has the default shown (percentile's kwargs are required). Optuna is
imported only when a sampler or pruner is made (the `search` extra).
"""

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from tfjax import errors

DISTRIBUTIONS = ("log_uniform", "uniform", "int", "categorical")
SAMPLERS = {
    "tpe": "TPESampler",
    "random": "RandomSampler",
    "qmc": "QMCSampler",
    "cmaes": "CmaEsSampler",
}
PRUNERS = {
    "none": "NopPruner",
    "median": "MedianPruner",
    "percentile": "PercentilePruner",
    "halving": "SuccessiveHalvingPruner",
    "hyperband": "HyperbandPruner",
}
_DEFAULTS = {
    "trials": 16,
    "per_generation": 4,
    "sampler": "tpe",
    "pruner": "median",
    "metric": "loss",
    "direction": "minimize",
    "seed": 0,
}


@dataclasses.dataclass(frozen=True)
class SearchSpec:
    """A checked search (see the module docstring for the fields)."""

    space: dict[str, dict[str, Any]]
    trials: int
    per_generation: int
    sampler: dict[str, Any]  # {"name": ..., **kwargs}
    pruner: dict[str, Any]
    metric: str
    direction: str
    seed: int | None


def require_optuna():
    """The `optuna` module, or a `ConfigError` that says how to install it."""
    try:
        import optuna
    except ImportError as err:
        raise errors.ConfigError(
            "a search needs Optuna: pip install 'tfjax[search]' (or pip install optuna)"
        ) from err
    return optuna


def _named(value: Any, known: Mapping[str, str], what: str) -> dict[str, Any]:
    spec = {"name": value} if isinstance(value, str) else dict(value)
    if spec.get("name") not in known:
        raise errors.ConfigError(
            f"search {what} {value!r}: name one of {', '.join(known)} (a string, or a dict "
            f"with 'name' and the Optuna {what}'s keyword arguments)"
        )
    return spec


def _check_distribution(key: str, dist: Any) -> None:
    kind = next(iter(dist), None) if isinstance(dist, Mapping) else None
    if kind not in DISTRIBUTIONS or set(dist) - {kind, "step"}:
        raise errors.ConfigError(
            f"search space {key!r}: {dist!r} is not one of {{'log_uniform': (low, high)}}, "
            "{'uniform': (low, high)}, {'int': (low, high)[, 'step': n]}, "
            "{'categorical': (choice, ...)}"
        )
    values = list(dist[kind])
    if kind == "categorical":
        if not values:
            raise errors.ConfigError(f"search space {key!r}: no categorical choices")
        return
    low, high = values if len(values) == 2 else (None, None)
    numbers = all(isinstance(v, int | float) and math.isfinite(v) for v in (low, high))
    if not numbers or low >= high or (kind == "log_uniform" and low <= 0):
        raise errors.ConfigError(
            f"search space {key!r}: {kind} needs (low, high) with low < high"
            + (" and low > 0" if kind == "log_uniform" else "")
            + f", got {dist[kind]!r}"
        )
    if kind == "int" and not (isinstance(low, int) and isinstance(high, int)):
        raise errors.ConfigError(f"search space {key!r}: int needs integer bounds")


def parse(raw: Any, where: str) -> SearchSpec:
    """The `SearchSpec` of a config file's `get_search(...)` result (`where` names it).

    Raises:
        tfjax.errors.ConfigError: for an unknown key, a bad distribution, sampler or pruner.
    """
    if not isinstance(raw, Mapping) or not isinstance(raw.get("space"), Mapping):
        raise errors.ConfigError(f"{where} must return a dict with a 'space' dict, got {raw!r}")
    unknown = set(raw) - {"space", *_DEFAULTS}
    if unknown:
        known = ", ".join(["space", *_DEFAULTS])
        raise errors.ConfigError(f"{where}: unknown keys {sorted(unknown)}; known: {known}")
    fields = {**_DEFAULTS, **raw}
    if not raw["space"]:
        raise errors.ConfigError(f"{where}: the search space is empty")
    for key, dist in raw["space"].items():
        _check_distribution(key, dist)
    for key in ("trials", "per_generation"):
        if not isinstance(fields[key], int) or fields[key] < 1:
            raise errors.ConfigError(f"{where}: {key} must be a positive integer")
    if fields["direction"] not in ("minimize", "maximize"):
        raise errors.ConfigError(f"{where}: direction must be 'minimize' or 'maximize'")
    return SearchSpec(
        space={key: dict(dist) for key, dist in raw["space"].items()},
        trials=fields["trials"],
        per_generation=fields["per_generation"],
        sampler=_named(fields["sampler"], SAMPLERS, "sampler"),
        pruner=_named(fields["pruner"], PRUNERS, "pruner"),
        metric=fields["metric"],
        direction=fields["direction"],
        seed=fields["seed"],
    )


def suggest(trial: Any, space: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """{dotted key: value} that an Optuna `trial` suggests for each key of `space`."""
    values = {}
    for key, dist in space.items():
        kind = next(iter(dist))
        if kind == "categorical":
            values[key] = trial.suggest_categorical(key, list(dist[kind]))
        elif kind == "int":
            low, high = dist[kind]
            values[key] = trial.suggest_int(key, low, high, step=dist.get("step", 1))
        else:
            low, high = dist[kind]
            values[key] = trial.suggest_float(key, low, high, log=kind == "log_uniform")
    return values


def make_sampler(spec: SearchSpec, offset: int = 0):
    """The Optuna sampler of `spec`, seeded with `spec.seed + offset` (None: unseeded).

    `tfjax.runs.search` passes the number of trials the study held when this process joined
    it: a study one process runs from the start is repeatable, and a host joining later does
    not draw the same random start-up suggestions as the first.
    """
    optuna = require_optuna()
    kwargs = {k: v for k, v in spec.sampler.items() if k != "name"}
    if spec.seed is not None:
        kwargs.setdefault("seed", spec.seed + offset)
    try:
        return getattr(optuna.samplers, SAMPLERS[spec.sampler["name"]])(**kwargs)
    except (TypeError, ImportError) as err:  # an unknown kwarg; CMA-ES without `cmaes`
        raise errors.ConfigError(f"search sampler {spec.sampler!r}: {err}") from err


def make_pruner(spec: SearchSpec):
    """The Optuna pruner of `spec`: it decides at each evaluation which trials stop."""
    optuna = require_optuna()
    kwargs = {k: v for k, v in spec.pruner.items() if k != "name"}
    try:
        return getattr(optuna.pruners, PRUNERS[spec.pruner["name"]])(**kwargs)
    except TypeError as err:
        raise errors.ConfigError(f"search pruner {spec.pruner!r}: {err}") from err
