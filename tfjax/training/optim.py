"""The optimizer: its config, the recipes, any optax optimizer by name, the vectorised twin.

Sources:
- Adam with β1 = 0.9, β2 = 0.98, ε = 1e-9 (the `OptimConfig` defaults): Vaswani et al. 2017,
  "Attention Is All You Need", §5.3, on the schedules of `tfjax.training.schedules` (the
  paper's eq. (3) by default).
- AdamW: Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization", Algorithm 2.
- Muon for the hidden layers' matrices: Jordan et al. 2024 (`tfjax.training.muon`).
- Gradient accumulation: `optax.MultiSteps`.
- Any other optax optimizer by its name and keyword arguments (`optim.optimizer="lion"`,
  `optim.kwargs.b1=0.95`): `tfjax.training.optax_by_name`.

`make_optimizer` builds one run's optimizer; `traced_optimizer` the same with hyperparameters
that differ per trial of a vectorised sweep (`traced_structure`, `traced_hyper`).
"""

import dataclasses
import numbers
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from tfjax import errors
from tfjax.training import muon, mup, optax_by_name, schedules

# tfjax's own optimizers; any other `optimizer` is optax's of that name (`optax_by_name`).
RECIPES = ("adam", "adamw", "muon")
DECAYED = ("all", "matrices")
# Leaf names that `weight_decay_params="matrices"` leaves undecayed: biases and norm scales.
_UNDECAYED_NAMES = ("bias", "logits_bias", "scale")


def _require(ok: bool, field: str, expected: str, actual: object) -> None:
    if not ok:
        raise errors.ConfigError(f"OptimConfig.{field}: expected {expected}, got {actual!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """Optimizer settings, built as `OptimConfig(**config.optim)`.

    Attributes:
        optimizer: one of tfjax's `RECIPES`, "adam", "adamw" or "muon" (Muon,
            `tfjax.training.muon`, for the hidden layers' kernels: attention projections and
            feed-forward layers; AdamW for every other parameter: embeddings, output and head
            layers, biases, norm scales); or the name of any optax optimizer ("lion",
            "adafactor", "contrib.prodigy"), built with the schedule, `weight_decay` and
            `kwargs` (`optax_by_name`).
        learning_rate: for the "paper" schedule the `scale` multiplier; otherwise the peak LR.
            With "muon", that of the AdamW part.
        muon_learning_rate: with "muon", the Muon part's `learning_rate`, on the same schedule
            (under "paper" a scale too: scale · d_model^-0.5 · warmup^-0.5 is Muon's peak).
        muon_momentum: with "muon", the Muon part's (Nesterov) momentum; b1 is AdamW's.
        schedule: "paper", "rsqrt", "cosine", "constant" (linear warmup, then constant) or
            "wsd" (warmup, constant, then a decay over the last `decay_fraction`).
        warmup_steps: linear warmup length in applied updates; > 0 for "paper" and "rsqrt".
        b1, b2, eps: the recipes' Adam hyperparameters (defaults from Vaswani et al. 2017
            §5.3); an optimizer by name takes its own from `kwargs`.
        weight_decay: decoupled weight decay; with "adamw" and "muon" (both parts), not "adam";
            an optimizer by name gets it as its `weight_decay` argument (0 = off).
        weight_decay_params: which parameters are decayed: "all", or "matrices" (every
            parameter but biases and normalisation scales: GPT-2 / nanoGPT's rule of decaying
            the >= 2-D tensors, by leaf name so that scanned stacks' 2-D biases stay undecayed).
        grad_clip_norm: clip gradients to this global norm; 0 turns clipping off.
        grad_accum_steps: micro-batches averaged per applied update (`optax.MultiSteps`).
        decay_steps: total applied updates of the "cosine" and "wsd" schedules, warmup included.
        end_lr_fraction: the "cosine" and "wsd" floor as a fraction of the peak.
        decay_fraction: the "wsd" decay's share of `decay_steps`, in (0, 1].
        decay_shape: the "wsd" decay's shape, one of `schedules.DECAY_SHAPES`.
        kwargs: keyword arguments of an optimizer by name (`optim.kwargs.b1=0.95`); optax's
            defaults for the others. Empty for the recipes.
    """

    optimizer: str = "adam"
    learning_rate: float = 1.0
    muon_learning_rate: float = 0.02
    muon_momentum: float = 0.95
    schedule: str = "paper"
    warmup_steps: int = 4000
    b1: float = 0.9
    b2: float = 0.98
    eps: float = 1e-9
    weight_decay: float = 0.0
    weight_decay_params: str = "all"
    grad_clip_norm: float = 0.0
    grad_accum_steps: int = 1
    decay_steps: int = 0
    end_lr_fraction: float = 0.0
    decay_fraction: float = 0.1
    decay_shape: str = "linear"
    kwargs: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        _require(
            hasattr(self.kwargs, "keys"), "kwargs", "a group of keyword arguments", self.kwargs
        )
        object.__setattr__(self, "kwargs", {k: self.kwargs[k] for k in self.kwargs.keys()})
        self._check_names()
        self._check_numbers()
        self._check_combinations()

    def _check_names(self) -> None:
        optax_by_name.check_name(self.optimizer, RECIPES)
        if self.optimizer in RECIPES and self.kwargs:
            raise errors.ConfigError(
                f"OptimConfig.kwargs: the recipe {self.optimizer!r} takes no kwargs, got "
                f"{self.kwargs!r}; set its optim.b1, b2, eps, muon_* fields, or name an optax "
                f"optimizer in optim.optimizer (optim.kwargs sets its arguments)"
            )
        names = schedules.SCHEDULES
        _require(self.schedule in names, "schedule", f"one of {names}", self.schedule)
        shapes, shape = schedules.DECAY_SHAPES, self.decay_shape
        _require(shape in shapes, "decay_shape", f"one of {shapes}", shape)
        decayed = self.weight_decay_params
        _require(decayed in DECAYED, "weight_decay_params", f"one of {DECAYED}", decayed)

    def _check_numbers(self) -> None:
        lr = self.learning_rate
        _require(_is_real(lr) and lr > 0, "learning_rate", "a number > 0", lr)
        mlr = self.muon_learning_rate
        _require(_is_real(mlr) and mlr > 0, "muon_learning_rate", "a number > 0", mlr)
        beta = self.muon_momentum
        _require(_is_real(beta) and 0 <= beta < 1, "muon_momentum", "a number in [0, 1)", beta)
        for field in ("warmup_steps", "decay_steps"):
            value = getattr(self, field)
            _require(_is_int(value) and value >= 0, field, "an integer >= 0", value)
        k = self.grad_accum_steps
        _require(_is_int(k) and k >= 1, "grad_accum_steps", "an integer >= 1", k)
        for field in ("b1", "b2"):
            value = getattr(self, field)
            _require(_is_real(value) and 0 <= value < 1, field, "a number in [0, 1)", value)
        _require(_is_real(self.eps) and self.eps > 0, "eps", "a number > 0", self.eps)
        for field in ("weight_decay", "grad_clip_norm"):
            value = getattr(self, field)
            _require(_is_real(value) and value >= 0, field, "a number >= 0 (0 = off)", value)
        end = self.end_lr_fraction
        _require(_is_real(end) and 0 <= end <= 1, "end_lr_fraction", "a number in [0, 1]", end)
        frac = self.decay_fraction
        _require(_is_real(frac) and 0 < frac <= 1, "decay_fraction", "a number in (0, 1]", frac)

    def _check_combinations(self) -> None:
        if self.schedule in ("paper", "rsqrt"):
            expected = f"> 0 for schedule={self.schedule!r}"
            _require(self.warmup_steps > 0, "warmup_steps", expected, self.warmup_steps)
        if self.schedule in ("cosine", "wsd"):
            expected = f"> warmup_steps ({self.warmup_steps}) for schedule={self.schedule!r}"
            _require(
                self.decay_steps > self.warmup_steps, "decay_steps", expected, self.decay_steps
            )
        if self.schedule == "wsd":
            fraction, warmup = self.decay_fraction, self.warmup_steps
            expected = f"<= 1 - warmup_steps / decay_steps ({warmup}/{self.decay_steps})"
            start = self.decay_steps * (1 - fraction)
            _require(start + 1e-6 >= warmup, "decay_fraction", expected, fraction)
        _check_weight_decay(self.optimizer, self.weight_decay)
        if self.optimizer not in RECIPES:
            optax_by_name.check_kwargs(
                self.optimizer,
                self.kwargs,
                weight_decay=self.weight_decay,
                matrices=self.weight_decay_params == "matrices",
            )


def _check_weight_decay(optimizer: str, weight_decay: float) -> None:
    if optimizer == "adam" and weight_decay > 0:
        raise errors.ConfigError(
            f"OptimConfig.weight_decay: expected 0 with optimizer='adam', got {weight_decay!r}; "
            "use optimizer='adamw' for (decoupled) weight decay"
        )


def decay_mask(params):
    """`weight_decay_params="matrices"`: True for every leaf but biases and norm scales."""

    return jax.tree_util.tree_map_with_path(
        lambda path, _: muon.path_names(path)[-1] not in _UNDECAYED_NAMES, params
    )


def make_schedule(config: OptimConfig, d_model: int) -> optax.Schedule:
    """The schedule named by `config.schedule`; `d_model` is used by "paper" only."""
    lr, warmup = config.learning_rate, config.warmup_steps
    if config.schedule == "paper":
        return schedules.paper_schedule(d_model, warmup, scale=lr)
    if config.schedule == "rsqrt":
        return schedules.rsqrt_schedule(lr, warmup)
    if config.schedule == "cosine":
        return schedules.cosine_schedule(lr, warmup, config.decay_steps, config.end_lr_fraction)
    if config.schedule == "wsd":
        return schedules.wsd_schedule(
            lr,
            warmup,
            config.decay_steps,
            config.decay_fraction,
            config.end_lr_fraction,
            config.decay_shape,
        )
    return schedules.constant_schedule(lr, warmup)


def make_optimizer(
    config: OptimConfig, d_model: int, lr_multipliers: Callable | None = None
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Builds clip → the optimizer with the schedule, optionally under gradient accumulation.

    With `grad_accum_steps` k > 1 the chain is wrapped in `optax.MultiSteps`: micro-batch
    gradients are averaged and the inner chain (clipping included) runs once every k calls,
    returning zero updates in between. The schedule therefore advances once per *applied* update,
    not per call: to log the LR in use, evaluate the schedule at the number of applied updates
    (the train step's micro-step count // k), not at the micro-step count.

    AdamW follows optax: the decay is decoupled from the Adam moments and scaled by the schedule.
    An optimizer by name is `optax_by_name.build`'s, in the same place of the chain.

    Args:
        config: the optimizer settings.
        d_model: model width D, for the "paper" schedule.
        lr_multipliers: μP's `params -> per-leaf multipliers` of the update
            (`tfjax.training.mup.lr_multipliers`), applied last; None: none.

    Returns:
        (optimizer, schedule).

    Raises:
        ValueError: for optimizer="adam" with weight_decay > 0 (use "adamw").
        tfjax.errors.ConfigError: for kwargs the optimizer by name refuses.
    """
    _check_weight_decay(config.optimizer, config.weight_decay)
    schedule = make_schedule(config, d_model)
    clip = config.grad_clip_norm if config.grad_clip_norm > 0 else None
    if config.optimizer not in RECIPES:
        core = optax_by_name.build(
            config.optimizer,
            schedule,
            config.kwargs,
            weight_decay=config.weight_decay,
            mask=decay_mask if config.weight_decay_params == "matrices" else None,
        )
        return _chain(core, clip, config.grad_accum_steps, lr_multipliers), schedule
    hyper = {"b1": config.b1, "b2": config.b2, "eps": config.eps}
    decays = config.optimizer == "adamw" or (config.optimizer == "muon" and config.weight_decay > 0)
    hyper["weight_decay"] = config.weight_decay if decays else None
    hyper["decay_mask"] = decay_mask if config.weight_decay_params == "matrices" else None
    if config.optimizer == "muon":
        ratio = config.muon_learning_rate / config.learning_rate
        hyper["muon"] = {
            "schedule": lambda count: ratio * schedule(count),
            "momentum": config.muon_momentum,
        }
    chain = _chain(_recipe(schedule, hyper), clip, config.grad_accum_steps, lr_multipliers)
    return chain, schedule


def _not_muon(params):
    return jax.tree.map(lambda m: not m, muon.muon_mask(params))


def _recipe(schedule: optax.Schedule, hyper: dict) -> optax.GradientTransformation:
    """Adam, or AdamW unless hyper["weight_decay"] is None (decaying the leaves
    `hyper["decay_mask"]` selects, all when None); with hyper["muon"], Muon for the hidden
    layers' kernels beside it."""
    adam_args = dict(learning_rate=schedule, b1=hyper["b1"], b2=hyper["b2"], eps=hyper["eps"])
    if hyper["weight_decay"] is not None:
        adam = optax.adamw(
            **adam_args, weight_decay=hyper["weight_decay"], mask=hyper.get("decay_mask")
        )
    else:
        adam = optax.adam(**adam_args)
    if hyper.get("muon") is not None:
        # In the chain with weight 0 too: Muon checkpoints hold this chain's state structure.
        matrices = optax.chain(
            muon.scale_by_muon(hyper["muon"]["momentum"]),
            optax.add_decayed_weights(hyper["weight_decay"] or 0.0),
            optax.scale_by_learning_rate(hyper["muon"]["schedule"]),
        )
        adam = optax.chain(optax.masked(matrices, muon.muon_mask), optax.masked(adam, _not_muon))
    return adam


def _chain(
    core: optax.GradientTransformation, clip_norm, grad_accum_steps: int, lr_multipliers=None
) -> optax.GradientTransformation:
    """clip (unless `clip_norm` is None) → `core` → μP's per-leaf multipliers (unless
    `lr_multipliers` is None), under `optax.MultiSteps` when grad_accum_steps > 1."""
    parts = [] if clip_norm is None else [optax.clip_by_global_norm(clip_norm)]
    if lr_multipliers is not None:
        core = optax.chain(core, mup.scale_by_multipliers(lr_multipliers))
    optimizer = optax.chain(*parts, core)
    if grad_accum_steps > 1:
        multi = optax.MultiSteps(optimizer, every_k_schedule=grad_accum_steps)
        optimizer = multi.gradient_transformation()
    return optimizer


# Fields a vectorised sweep may set per trial (`traced_optimizer`); the others are one value:
# the numbers (traced float32 scalars), `schedule` (each trial picks one of the trials'),
# `optimizer` ("adam" and "adamw" trials mix; an optimizer by name is shared) and the float
# values of `kwargs` (`TracedStructure.traced_kwargs`).
_TRACED_NUMBERS = (
    "learning_rate",
    "warmup_steps",
    "b1",
    "b2",
    "eps",
    "weight_decay",
    "grad_clip_norm",
    "decay_steps",
    "end_lr_fraction",
    "decay_fraction",
)
TRACEABLE = (*_TRACED_NUMBERS, "schedule", "decay_shape", "optimizer", "kwargs")


@dataclasses.dataclass(frozen=True)
class TracedStructure:
    """What the trials of one vectorised optimizer share (`traced_structure`).

    Attributes:
        schedules: the schedule names the trials use; a trial's `hyper["schedule"]` indexes it.
        adamw: AdamW for every trial (Adam trials get weight decay 0: the same update).
        clip: clipping for every trial (trials without get an infinite norm: no clipping).
        grad_accum_steps: shared by all trials.
        weight_decay_params: shared by all trials.
        optimizer: the optax optimizer by name of every trial; "" for Adam / AdamW.
        kwargs: its keyword arguments that all trials give the same value, as (name, value).
        traced_kwargs: its float arguments that differ between trials: each trial's is
            `hyper["kwargs.<name>"]`.
    """

    schedules: tuple[str, ...]
    adamw: bool
    clip: bool
    grad_accum_steps: int
    weight_decay_params: str = "all"
    optimizer: str = ""
    kwargs: tuple[tuple[str, Any], ...] = ()
    traced_kwargs: tuple[str, ...] = ()


def traced_structure(configs: "list[OptimConfig]") -> TracedStructure:
    """The shared structure of trials' optimizers (each config already checked).

    Raises:
        tfjax.errors.ConfigError: if the trials differ in a field outside `TRACEABLE`, use
            a recipe other than Adam and AdamW (Muon) or different optimizers by name, or
            differ in a kwarg other than by a number.
    """
    first = dataclasses.asdict(configs[0])
    for name in {c.optimizer for c in configs} & set(RECIPES) - {"adam", "adamw"}:
        raise errors.ConfigError(
            f"optim.optimizer={name!r} cannot be vectorised: run such trials one after another "
            "(sweep.vectorize=false)"
        )
    for config in configs[1:]:
        for key, value in dataclasses.asdict(config).items():
            if key not in TRACEABLE and value != first[key]:
                raise errors.ConfigError(
                    f"optim.{key} differs between trials ({first[key]!r}, {value!r}) and "
                    f"cannot be vectorised; vectorisable: {', '.join(TRACEABLE)}"
                )
    return TracedStructure(
        schedules=tuple(dict.fromkeys(c.schedule for c in configs)),
        adamw=any(c.optimizer == "adamw" for c in configs),
        clip=any(c.grad_clip_norm > 0 for c in configs),
        grad_accum_steps=configs[0].grad_accum_steps,
        weight_decay_params=configs[0].weight_decay_params,
        **_by_name_structure(configs),
    )


def _by_name_structure(configs: "list[OptimConfig]") -> dict[str, Any]:
    """`TracedStructure`'s `optimizer`, `kwargs` and `traced_kwargs` of the trials."""
    names = sorted({c.optimizer for c in configs})
    if set(names) <= set(RECIPES):
        return {}
    if len(names) > 1:
        raise errors.ConfigError(
            f"optim.optimizer differs between trials ({', '.join(names)}): the trials of one "
            "vectorised program share an optax optimizer by name (only 'adam' and 'adamw' mix); "
            "run them one after another (sweep.vectorize=false)"
        )
    keys = {tuple(sorted(c.kwargs)) for c in configs}
    if len(keys) > 1:
        raise errors.ConfigError(
            f"optim.kwargs sets different keys in different trials ({sorted(keys)}): "
            "give every trial the same keys"
        )
    shared, traced = [], []
    for key in sorted(configs[0].kwargs):
        values = [c.kwargs[key] for c in configs]
        if all(type(v) is type(values[0]) and v == values[0] for v in values):
            shared.append((key, values[0]))
        elif all(_is_real(v) for v in values):
            traced.append(key)
        else:
            raise errors.ConfigError(
                f"optim.kwargs.{key} differs between trials ({values}): only numbers can "
                "be vectorised; run them one after another (sweep.vectorize=false)"
            )
    return {"optimizer": names[0], "kwargs": tuple(shared), "traced_kwargs": tuple(traced)}


def traced_hyper(config: OptimConfig, structure: TracedStructure) -> dict[str, jax.Array]:
    """One trial's hyperparameters as float32 scalars (int32 `schedule` index) for
    `traced_optimizer`; stack the trials' dicts for a vectorised step."""
    hyper = {k: jnp.float32(getattr(config, k)) for k in _TRACED_NUMBERS}
    if config.grad_clip_norm == 0:
        hyper["grad_clip_norm"] = jnp.float32(jnp.inf)  # clipping off: the identity
    hyper["schedule"] = jnp.int32(structure.schedules.index(config.schedule))
    hyper["decay_shape"] = jnp.int32(schedules.DECAY_SHAPES.index(config.decay_shape))
    for key in structure.traced_kwargs:
        hyper[f"kwargs.{key}"] = jnp.float32(config.kwargs[key])
    return hyper


def traced_optimizer(
    hyper: dict[str, jax.Array],
    structure: TracedStructure,
    d_model: int,
    lr_multipliers: Callable | None = None,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """`make_optimizer` with the hyperparameters as (traced) scalars, for `jax.vmap` over trials.

    Every trial's optimizer state has the same structure (`structure`); the update of each
    trial equals that of `make_optimizer(its config)` up to float rounding: an Adam trial's
    zero weight decay adds 0 · param, an unclipped trial clips at an infinite norm.
    `lr_multipliers` (μP's, shared by the trials) as in `make_optimizer`.
    """
    formulas = {
        "paper": lambda s: schedules.paper_lr(
            s, d_model, hyper["warmup_steps"], hyper["learning_rate"]
        ),
        "rsqrt": lambda s: schedules.rsqrt_lr(s, hyper["learning_rate"], hyper["warmup_steps"]),
        "cosine": lambda s: schedules.cosine_lr(
            s,
            hyper["learning_rate"],
            hyper["warmup_steps"],
            hyper["decay_steps"],
            hyper["end_lr_fraction"],
        ),
        "constant": lambda s: schedules.constant_lr(
            s, hyper["learning_rate"], hyper["warmup_steps"]
        ),
        "wsd": lambda s: schedules.wsd_lr(
            s,
            *(hyper[k] for k in ("learning_rate", "warmup_steps", "decay_steps")),
            *(hyper[k] for k in ("decay_fraction", "end_lr_fraction", "decay_shape")),
        ),
    }

    def schedule(count):
        s = schedules.paper_step(count)
        values = [formulas[name](s) for name in structure.schedules]  # each [] float32
        if len(values) == 1:
            return values[0]
        return jnp.select([hyper["schedule"] == i for i in range(len(values))], values)

    clip = hyper["grad_clip_norm"] if structure.clip else None
    mask = decay_mask if structure.weight_decay_params == "matrices" else None
    if structure.optimizer:
        kwargs = dict(structure.kwargs) | {k: hyper[f"kwargs.{k}"] for k in structure.traced_kwargs}
        core = optax_by_name.build(
            structure.optimizer, schedule, kwargs, weight_decay=hyper["weight_decay"], mask=mask
        )
        return _chain(core, clip, structure.grad_accum_steps, lr_multipliers), schedule
    adam = {k: hyper[k] for k in ("b1", "b2", "eps")}
    adam["weight_decay"] = hyper["weight_decay"] if structure.adamw else None
    adam["decay_mask"] = mask
    chain = _chain(_recipe(schedule, adam), clip, structure.grad_accum_steps, lr_multipliers)
    return chain, schedule
