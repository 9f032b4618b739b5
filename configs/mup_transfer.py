r"""μP learning-rate transfer on Tiny Shakespeare characters (docs/results.md, "Tune small,
train large: the transfer measured"; docs/sweeps.md, "Tune small, train large").

  python -m experiments.sweep --config=configs/mup_transfer.py --sweep=transfer --vectorize \
      --workdir=runs/sweeps
  python -m experiments.reproduce --row=mup_transfer_w256_mup --seeds=0,1,2

Expected: docs/results.md's table (the best learning rate per width and parametrization,
mean ± std of the final val loss over seeds 0-2); under the standard parametrization the best
learning rate falls as the model widens, under μP (base width 64) it stays put. Each
(parametrization, width) is one vectorised program of 21 trials (7 learning rates × 3 seeds),
the eight programs one after another; on the shared 2-core CPU the sweep took the time
docs/results.md gives.

Model: configs/shakespeare_char.py's decoder (pre-LN, GELU, learned positions, tied output,
unscaled embeddings) cut to one layer of 4 heads, feed-forward 2 × width, context 32, 8 windows a
step, no dropout, Adam(0.9, 0.99) at a warmup-stable-decay schedule (10 warmup steps, linear
decay over the last 20% of 80 steps). Widths 64, 128, 256, 512 (head_dim 16 to 128; the heads'
number is fixed, as μP assumes: `tfjax.models.mup`).

Presets (`--config=configs/mup_transfer.py:NAME`):
  proxy    (default) width 64, μP at base width 64: the model the sweep tunes (at width 64 μP
           is the standard model).
  wide     width 512, μP with base width 64: where the proxy's learning rate goes.
  w256_mup, w256_standard  width 256 at the proxy's best learning rate, 0.01, under μP and
           the standard parametrization (the rows `mup_transfer_w256_*` of docs/results.md).
  tiny     seconds, for the tests.

Sweeps (`--sweep=NAME --vectorize`):
  transfer   7 learning rates (10^-3.33 to 10^-1.33, 3 a decade) × seeds 0-2 × widths 64, 128,
             256, 512 × parametrization standard, mup (168 trials, 8 programs).
  transfer_512  `transfer`'s width 512 alone (42 trials, 2 programs).
  proxy_lr   7 learning rates × seeds 0-2 at width 64 (the proxy sweep alone).
"""

from configs import common

SEEDS = (0, 1, 2)
WIDTHS = (64, 128, 256, 512)
LEARNING_RATES = tuple(round(10 ** (-10 / 3 + k / 3), 6) for k in range(7))
BASE_WIDTH = 64


def _width(width: int) -> dict:
    return {"model.embed_dim": width, "model.mlp_dim": 2 * width}


PRESETS = {
    "proxy": {"model.parametrization": "mup", **_width(BASE_WIDTH)},
    "wide": {"model.parametrization": "mup", **_width(512)},
    # The results rows (experiments.results): width 256 at the width-64 proxy's best
    # learning rate (0.01, the same under both parametrizations: μP at base width is the
    # standard model).
    "w256_mup": {"model.parametrization": "mup", **_width(256), "optim.learning_rate": 0.01},
    "w256_standard": {
        "model.parametrization": "standard",
        **_width(256),
        "optim.learning_rate": 0.01,
    },
    "tiny": {
        **common.TINY,
        "model.base_width": 32,
        "data.max_target_len": 17,
        "data.lm_stride": 64,
        "optim.warmup_steps": 2,
        "train.max_eval_examples": 16,
        "train.final_eval_examples": 16,
    },
}

SWEEPS = {
    "transfer": [
        {
            "model.parametrization": parametrization,
            **_width(width),
            "optim.learning_rate": lr,
            "seed": seed,
        }
        for width in WIDTHS
        for parametrization in ("standard", "mup")
        for lr in LEARNING_RATES
        for seed in SEEDS
    ],
    # `transfer`'s width 512 alone (its two programs), as the results page ran it.
    "transfer_512": [
        {
            "model.parametrization": parametrization,
            **_width(512),
            "optim.learning_rate": lr,
            "seed": seed,
        }
        for parametrization in ("standard", "mup")
        for lr in LEARNING_RATES
        for seed in SEEDS
    ],
    "proxy_lr": [
        {"optim.learning_rate": lr, "seed": seed} for lr in LEARNING_RATES for seed in SEEDS
    ],
}


def get_config(arg: str | None = None):
    config = common.base_config(
        model={
            "kind": "decoder_only",
            "norm_position": "pre",
            "activation": "gelu",
            "positional": "learned",
            "scale_embeddings": False,
            "num_layers": 1,
            "num_heads": 4,
            "dropout_rate": 0.0,
            "base_width": BASE_WIDTH,
        },
        data={
            "name": "tinyshakespeare",
            "tokenizer": "char",
            "eval_split": "val",
            "max_target_len": 33,
            "lm_stride": 16,
        },
        optim_overrides={
            "schedule": "wsd",
            "warmup_steps": 10,
            "decay_fraction": 0.2,
            "learning_rate": 1e-2,
            "b2": 0.99,
        },
        train={
            "label_smoothing": 0.0,
            "num_train_steps": 80,
            "global_batch_size": 8,
            "eval_batch_size": 128,
            "eval_every_steps": 1000,
            "checkpoint_every_steps": 80,
            "log_every_steps": 10,
            "max_eval_examples": 256,
            "final_eval_examples": 256,
        },
    )
    return common.apply_preset(config, PRESETS, arg or "proxy")


def get_sweep(arg: str | None = None):
    return common.get_sweep(SWEEPS, arg)
