"""Learning-rate schedules, of optax's update count.

Sources:
- `paper_schedule`: Vaswani et al. 2017, "Attention Is All You Need", §5.3, eq. (3):
  lr = d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5), with step counted from 1.
- `rsqrt_schedule`: the same shape with the peak given directly (linear warmup, then inverse
  square-root decay), as in T5 (Raffel et al. 2020, §3.1.2) and tensor2tensor.
- `cosine_schedule`: Loshchilov & Hutter 2017, "SGDR", eq. (5), without restarts, after a linear
  warmup.
- `constant_schedule`: a linear warmup, then constant.
- `wsd_schedule`: warmup-stable-decay: a linear warmup, a constant phase, then a decay over the
  last `decay_fraction` of the run, "linear" (Hu et al. 2024, "MiniCPM", §4.1), "cosine", or
  "sqrt" (1 - sqrt of the progress: Hägele et al. 2024, "Scaling Laws and Compute-Optimal
  Training Beyond Fixed Training Durations", §3). The constant phase does not depend on where
  the run ends, so a decay can branch off any of its checkpoints (docs/training.md, "Branching a
  decay off a stable-phase checkpoint").

All schedules take optax's update count (0 for the first update) and evaluate at s = count + 1, so
the first update never has a zero learning rate and the paper's formula applies as written. The
formulas (`paper_lr`, ...) take s and hyperparameters that are Python numbers or, in a
vectorised sweep (`tfjax.training.optim.traced_optimizer`), traced float32 scalars.
"""

import numbers

import jax
import jax.numpy as jnp
import optax

from tfjax import errors

SCHEDULES = ("paper", "rsqrt", "cosine", "constant", "wsd")
DECAY_SHAPES = ("linear", "cosine", "sqrt")  # `wsd_schedule`'s decay


def paper_step(count: jax.Array | int) -> jax.Array:
    """optax's count (0 for the first update) → the paper's step s (1 for the first update)."""
    return jnp.asarray(count, jnp.float32) + 1.0


def _warmup_factor(s: jax.Array, warmup_steps) -> jax.Array:
    """Linear warmup s / warmup_steps, capped at 1; 1 throughout when warmup_steps == 0.

    `warmup_steps` is a Python int, or a traced scalar in a vectorised sweep."""
    if isinstance(warmup_steps, numbers.Number):
        if warmup_steps == 0:
            return jnp.ones_like(s)
        return jnp.minimum(1.0, s / warmup_steps)
    ramp = jnp.minimum(1.0, s / jnp.maximum(warmup_steps, 1.0))
    return jnp.where(warmup_steps > 0, ramp, 1.0)


def paper_lr(s, d_model, warmup_steps, scale):
    """`paper_schedule`'s LR at step s (a float32 [] array, from 1)."""
    return scale * d_model**-0.5 * jnp.minimum(s**-0.5, s * warmup_steps**-1.5)


def rsqrt_lr(s, peak, warmup_steps):
    """`rsqrt_schedule`'s LR at step s."""
    return peak * jnp.minimum(s / warmup_steps, jnp.sqrt(warmup_steps / s))


def cosine_lr(s, peak, warmup_steps, decay_steps, end_fraction):
    """`cosine_schedule`'s LR at step s."""
    end = peak * end_fraction
    progress = jnp.clip((s - warmup_steps) / (decay_steps - warmup_steps), 0.0, 1.0)
    decayed = end + (peak - end) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
    return jnp.where(s < warmup_steps, peak * _warmup_factor(s, warmup_steps), decayed)


def constant_lr(s, peak, warmup_steps):
    """`constant_schedule`'s LR at step s."""
    return peak * _warmup_factor(s, warmup_steps)


def _decay_factor(progress: jax.Array, shape) -> jax.Array:
    """The WSD decay's factor, 1 at progress 0 down to 0 at 1; `shape` is one of
    `DECAY_SHAPES` or (a vectorised sweep's trial) a traced int32 index into it."""
    factors = (
        1.0 - progress,
        0.5 * (1.0 + jnp.cos(jnp.pi * progress)),
        1.0 - jnp.sqrt(progress),
    )
    if isinstance(shape, str):
        return factors[DECAY_SHAPES.index(shape)]
    return jnp.select([shape == i for i in range(len(factors))], factors)


def wsd_lr(s, peak, warmup_steps, decay_steps, decay_fraction, end_fraction, shape):
    """`wsd_schedule`'s LR at step s: warmup to `peak`, constant until the decay starts at
    s0 = decay_steps · (1 - decay_fraction), then peak · end_fraction + peak · (1 -
    end_fraction) · factor((s - s0) / (decay_steps - s0)), the progress clipped to [0, 1]."""
    end = peak * end_fraction
    start = decay_steps * (1.0 - decay_fraction)
    progress = jnp.clip((s - start) / jnp.maximum(decay_steps - start, 1e-9), 0.0, 1.0)
    decayed = end + (peak - end) * _decay_factor(progress, shape)
    return jnp.where(s <= start, peak * _warmup_factor(s, warmup_steps), decayed)


def paper_schedule(d_model: int, warmup_steps: int, scale: float = 1.0) -> optax.Schedule:
    """Vaswani et al. 2017 §5.3: scale · d_model^-0.5 · min(s^-0.5, s · warmup_steps^-1.5).

    Args:
        d_model: model width D.
        warmup_steps: the step of the peak, scale · (d_model · warmup_steps)^-0.5.
        scale: a multiplier on the paper's formula (1 in the paper).

    Returns:
        A schedule mapping optax's count c (from 0) to a float32 LR evaluated at s = c + 1.
    """
    if d_model <= 0 or warmup_steps <= 0:
        raise errors.ConfigError(
            f"d_model, warmup_steps: expected > 0, got {d_model}, {warmup_steps}"
        )

    def schedule(count):
        return paper_lr(paper_step(count), d_model, warmup_steps, scale)

    return schedule


def rsqrt_schedule(peak: float, warmup_steps: int) -> optax.Schedule:
    """Linear warmup to `peak` at s = warmup_steps, then peak · sqrt(warmup_steps / s).

    Returns:
        A schedule mapping optax's count c (from 0) to a float32 LR evaluated at s = c + 1, so
        the first update uses peak / warmup_steps.
    """
    if warmup_steps <= 0:
        raise errors.ConfigError(f"warmup_steps: expected > 0, got {warmup_steps}")

    def schedule(count):
        return rsqrt_lr(paper_step(count), peak, warmup_steps)

    return schedule


def cosine_schedule(
    peak: float, warmup_steps: int, decay_steps: int, end_fraction: float = 0.0
) -> optax.Schedule:
    """Linear warmup to `peak`, then cosine decay to peak · end_fraction at s = decay_steps.

    Args:
        peak: the LR at s = warmup_steps.
        warmup_steps: warmup length (0 = start at the peak).
        decay_steps: the step at which the floor is reached, warmup included; constant after.
        end_fraction: the floor as a fraction of `peak`.

    Returns:
        A schedule mapping optax's count c (from 0) to a float32 LR evaluated at s = c + 1.
    """
    if not 0 <= warmup_steps < decay_steps:
        raise errors.ConfigError(
            f"warmup_steps, decay_steps: expected 0 <= warmup_steps < decay_steps, "
            f"got {warmup_steps}, {decay_steps}"
        )

    def schedule(count):
        return cosine_lr(paper_step(count), peak, warmup_steps, decay_steps, end_fraction)

    return schedule


def constant_schedule(peak: float, warmup_steps: int) -> optax.Schedule:
    """Linear warmup to `peak` over warmup_steps (none when 0), then constant."""

    def schedule(count):
        return constant_lr(paper_step(count), peak, warmup_steps)

    return schedule


def wsd_schedule(
    peak: float,
    warmup_steps: int,
    decay_steps: int,
    decay_fraction: float,
    end_fraction: float = 0.0,
    shape: str = "linear",
) -> optax.Schedule:
    """Warmup-stable-decay: linear warmup to `peak`, constant, then a decay to peak ·
    end_fraction over the last `decay_fraction` of `decay_steps` (`wsd_lr`).

    Args:
        peak: the LR of the stable phase.
        warmup_steps: warmup length (0 = start at the peak).
        decay_steps: the step at which the floor is reached (the run's length), warmup included.
        decay_fraction: the decay's share of `decay_steps`, in (0, 1]; the decay starts after
            s0 = decay_steps · (1 - decay_fraction), which must be >= warmup_steps.
        end_fraction: the floor as a fraction of `peak`.
        shape: the decay's shape, one of `DECAY_SHAPES`.

    Returns:
        A schedule mapping optax's count c (from 0) to a float32 LR evaluated at s = c + 1.
    """
    start = decay_steps * (1.0 - decay_fraction)
    if not (0 < decay_fraction <= 1 and warmup_steps <= start + 1e-6):
        raise errors.ConfigError(
            f"decay_steps, decay_fraction: expected decay_fraction in (0, 1] and warmup_steps "
            f"({warmup_steps}) <= the decay's start decay_steps · (1 - decay_fraction) < "
            f"decay_steps, got {decay_steps}, {decay_fraction}"
        )
    if shape not in DECAY_SHAPES:
        raise errors.ConfigError(f"decay_shape: expected one of {DECAY_SHAPES}, got {shape!r}")

    def schedule(count):
        s = paper_step(count)
        return wsd_lr(s, peak, warmup_steps, decay_steps, decay_fraction, end_fraction, shape)

    return schedule
