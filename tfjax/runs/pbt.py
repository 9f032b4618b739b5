"""Population-based training (PBT) on a vectorised sweep's trial axis (`tfjax.runs.vsweep`).

With `sweep.pbt.interval` > 0, every `interval` steps (not at the last) the live trials are
ranked on their evaluation's `sweep.pbt.metric` (`mode` "min" or "max"; a non-finite value
ranks last, ties by trial order); the worst `fraction` of them (rounded down) copy the
parameters, optimizer state and hyperparameters of the best (the k-th worst copies the k-th
best: `plan`), then explore `sweep.pbt.hyperparameters` (`tfjax.training.population.explore`).
Copying is a gather on the trial axis of the group's state inside one jitted program, and the
hyperparameters stay device arrays of fixed shapes passed to the vectorised step: nothing is
written to disk, nothing of the state goes through the host, nothing is compiled again. Each
trial keeps its own data order and dropout keys.

`Population` holds the trials' current hyperparameters, the explore key and the lineage (who
copied whom at which step); the group checkpoint saves them (`state_dict`) so a rerun resumes
them exactly. Each trial's `metrics.jsonl` (and TensorBoard) gets a "pbt" record at step 0 and
at each interval: its explored hyperparameters, `copied_from` (the trial index it copied, -1
for none) and `score` (its metric then); `lineage_markdown` is the sweep's table of copies.

Successive halving (`sweep.halving_steps`) and PBT together are refused: both decide which
trials go on, and PBT keeps every trial training.
"""

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tfjax import errors
from tfjax.training import optim, population

_OWN_NAMES = {  # vectorised config keys outside `optim` -> their name in the traced hyper
    "train.label_smoothing": "label_smoothing",
    "model.dropout_rate": "dropout_rate",
    "model.attention_dropout_rate": "attention_dropout_rate",
}
_FLOAT_OPTIM = tuple(n for n in optim.TRACEABLE if n not in ("schedule", "optimizer", "kwargs"))


def hyper_name(key: str) -> str:
    """The traced hyperparameter (`optim.traced_hyper`'s name) of vectorised config `key`.

    Raises:
        tfjax.errors.ConfigError: for a key PBT cannot explore (not a float traced per trial).
    """
    if key in _OWN_NAMES:
        return _OWN_NAMES[key]
    group, _, name = key.partition(".")
    if group == "optim" and (name in _FLOAT_OPTIM or name.startswith("kwargs.")):
        return name
    explorable = ", ".join([*(f"optim.{n}" for n in _FLOAT_OPTIM), "optim.kwargs.NAME"])
    raise errors.ConfigError(
        f"sweep.pbt.hyperparameters: {key!r} cannot be explored; choose among {explorable}, "
        f"{', '.join(_OWN_NAMES)}"
    )


@dataclasses.dataclass(frozen=True)
class Settings:
    """The group's `sweep.pbt` settings, checked; `names` are `keys`' traced names."""

    interval: int
    metric: str
    mode: str
    fraction: float
    keys: tuple[str, ...]
    names: tuple[str, ...]
    factors: tuple[float, ...]
    resample_probability: float
    seed: int


def settings(configs: Sequence[Any]) -> Settings | None:
    """The trials' PBT settings, or None when `sweep.pbt.interval` is 0 (off).

    Raises:
        tfjax.errors.ConfigError: for settings that differ between trials, a bad value, or
            PBT with successive halving.
    """
    pbt = [c.sweep.pbt.to_dict() for c in configs]
    if any(p != pbt[0] for p in pbt):
        raise errors.ConfigError(
            "sweep.pbt differs between the trials of one vectorised group: set it once for "
            "the sweep (--config.sweep.pbt.interval=...)"
        )
    p = configs[0].sweep.pbt
    if p.interval == 0:
        return None
    if configs[0].sweep.halving_steps:
        raise errors.ConfigError(
            "sweep.halving_steps and sweep.pbt.interval cannot be used together (both decide "
            "which trials go on): set one of them to ()/0"
        )
    _check(p)
    keys = tuple(p.hyperparameters)
    return Settings(
        interval=p.interval,
        metric=p.metric,
        mode=p.mode,
        fraction=float(p.fraction),
        keys=keys,
        names=tuple(hyper_name(k) for k in keys),
        factors=tuple(float(f) for f in p.perturb_factors),
        resample_probability=float(p.resample_probability),
        seed=p.seed,
    )


def _check(p) -> None:
    problems = []
    if not (isinstance(p.interval, int) and p.interval > 0):
        problems.append(f"interval must be a positive number of steps, got {p.interval!r}")
    if p.mode not in ("min", "max"):
        problems.append(f"mode must be 'min' or 'max', got {p.mode!r}")
    if not 0 <= p.fraction <= 0.5:
        problems.append(f"fraction must be in [0, 0.5], got {p.fraction!r}")
    if not p.hyperparameters:
        problems.append("hyperparameters must name at least one vectorised hyperparameter")
    if not p.perturb_factors or any(f <= 0 for f in p.perturb_factors):
        problems.append(f"perturb_factors must be positive numbers, got {p.perturb_factors!r}")
    if not 0 <= p.resample_probability <= 1:
        problems.append(f"resample_probability must be in [0, 1], got {p.resample_probability}")
    if problems:
        raise errors.ConfigError(f"sweep.pbt: {'; '.join(problems)}")


def plan(scores: dict[int, float], num_trials: int, fraction: float, mode: str) -> np.ndarray:
    """Who copies whom: int32 [num_trials], trial i copies `source[i]` (itself: no copy).

    Args:
        scores: the live trials' metric values (the others neither copy nor are copied).
        num_trials: T.
        fraction: of the live trials replaced (rounded down).
        mode: "min" or "max": which scores are better.
    """
    sign = 1.0 if mode == "min" else -1.0
    ranked = sorted(scores, key=lambda i: (not math.isfinite(scores[i]), sign * scores[i], i))
    source = np.arange(num_trials, dtype=np.int32)
    for k in range(math.floor(fraction * len(ranked))):
        source[ranked[-1 - k]] = ranked[k]
    return source


class Population:
    """The trials' current hyperparameters (device arrays), the explore key and the lineage.

    Attributes:
        hyper: {name: [T]}, what the vectorised step trains each trial with now.
        key: the explore key.
        lineage: [{"step", "trial", "source"}], every copy so far, in order.
    """

    def __init__(self, settings_: Settings, hyper: dict[str, jax.Array]):
        self.settings = settings_
        missing = [
            k for k, n in zip(settings_.keys, settings_.names, strict=True) if n not in hyper
        ]
        if missing:
            raise errors.ConfigError(
                f"sweep.pbt.hyperparameters {missing}: not a hyperparameter of these trials' "
                "optimizer (an optim.kwargs entry must differ between the trials to be traced)"
            )
        self.hyper = dict(hyper)
        self.key = jax.random.key(settings_.seed)
        self.lineage: list[dict[str, int]] = []
        self._choices = {
            n: jnp.asarray(sorted(set(np.asarray(hyper[n]).tolist())), hyper[n].dtype)
            for n in settings_.names
        }
        self._exploit = jax.jit(population.exploit, donate_argnums=0)
        self._explore = jax.jit(
            lambda hyper, source, key: population.explore(
                hyper,
                source,
                key,
                names=settings_.names,
                factors=jnp.asarray(settings_.factors, jnp.float32),
                resample_probability=settings_.resample_probability,
                choices=self._choices,
            )
        )

    def due(self, step: int, last: int) -> bool:
        """Whether PBT acts after `step` (every `interval`, not after the `last` step)."""
        return step % self.settings.interval == 0 and step < last

    def act(self, state, step: int, scores: dict[int, float], place):
        """Exploits and explores once: (state, source [T]). `place` puts the gathered state
        back on the group's trial sharding (`Placement.put_state`)."""
        source = plan(
            scores, len(next(iter(self.hyper.values()))), self.settings.fraction, self.settings.mode
        )
        copies = [i for i in range(len(source)) if source[i] != i]
        if copies:
            state = place(self._exploit(state, jnp.asarray(source)))
        self.hyper, self.key = self._explore(self.hyper, jnp.asarray(source), self.key)
        self.lineage += [{"step": step, "trial": i, "source": int(source[i])} for i in copies]
        return state, source

    def records(self, source: np.ndarray | None, scores: dict[int, float]) -> dict[int, dict]:
        """Each trial's "pbt" record: its explored hyperparameters, `copied_from`, `score`."""
        values = population.as_lists({n: self.hyper[n] for n in self.settings.names})
        out = {}
        for i in range(len(values[self.settings.names[0]])):
            record = {
                k: values[n][i]
                for k, n in zip(self.settings.keys, self.settings.names, strict=True)
            }
            record["copied_from"] = -1 if source is None or source[i] == i else int(source[i])
            if i in scores:
                record["score"] = scores[i]
            out[i] = record
        return out

    def state_dict(self) -> dict:
        """What the group checkpoint saves (JSON): hyperparameters, key, lineage."""
        return {
            "hyper": {  # float.hex: exact, and JSON for an infinite clipping norm
                n: [v.hex() if isinstance(v, float) else v for v in values]
                for n, values in population.as_lists(self.hyper).items()
            },
            "key": population.key_to_list(self.key),
            "lineage": list(self.lineage),
        }

    def load(self, saved: dict) -> None:
        """Resumes what `state_dict` saved."""
        self.hyper = {
            n: jnp.asarray(
                [float.fromhex(v) if isinstance(v, str) else v for v in saved["hyper"][n]],
                value.dtype,
            )
            for n, value in self.hyper.items()
        }
        self.key = population.key_from_list(saved["key"], self.key)
        self.lineage = [dict(event) for event in saved["lineage"]]


def lineage_markdown(names: Sequence[str], lineage: Sequence[dict], hyper: dict[str, list]) -> str:
    """The sweep's copies as a markdown table (trial names, not indices), and each trial's
    final explored hyperparameters."""
    lines = ["| step | trial | copied |", "|---|---|---|"]
    lines += [f"| {e['step']} | {names[e['trial']]} | {names[e['source']]} |" for e in lineage]
    if not lineage:
        lines.append("| - | (no copies) | - |")
    columns = list(hyper)
    lines += ["", "| trial | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for i, name in enumerate(names):
        lines.append(f"| {name} | " + " | ".join(f"{hyper[c][i]:.4g}" for c in columns) + " |")
    return "\n".join(lines) + "\n"


def act(hooks, state, step: int):
    """PBT in a vectorised group's `adjust` (`hooks`: its `vsweep._GroupHooks`, which has just
    evaluated the live trials): ranks them on the metric, copies and explores
    (`Population.act`), writes each trial's "pbt" record. Returns the state.

    Raises:
        tfjax.errors.ConfigError: for a metric the evaluation does not give.
    """
    metric = hooks.population.settings.metric
    results = hooks.evaluated[1]
    if results and metric not in next(iter(results.values())):
        raise errors.ConfigError(
            f"sweep.pbt.metric={metric!r} is not in the evaluation; choose one of "
            f"{sorted(next(iter(results.values())))}"
        )
    scores = {i: float(result[metric]) for i, result in results.items()}
    state, source = hooks.population.act(state, step, scores, hooks.group.placement.put_state)
    write_records(hooks, step, source, scores)
    return state


def write_records(hooks, step: int, source, scores: dict[int, float]) -> None:
    """Each live trial's "pbt" record at `step` in its metrics.jsonl and on TensorBoard."""
    for i, record in hooks.population.records(source, scores).items():
        if hooks.status[i] == "ok":
            hooks.writers[i].write(step, "pbt", record)


LINEAGE_FILE = "pbt.md"  # in the group's directory; experiments.sweep adds it to summary.md


def write_lineage(directory, trials: Sequence[Any], population_: Population) -> None:
    """Writes the group's lineage table (`lineage_markdown`) to `directory/pbt.md`."""
    hyper = population.as_lists({n: population_.hyper[n] for n in population_.settings.names})
    columns = dict(zip(population_.settings.keys, hyper.values(), strict=True))
    text = lineage_markdown([t.name for t in trials], population_.lineage, columns)
    (directory / LINEAGE_FILE).write_text(text)
