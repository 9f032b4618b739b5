r"""Small SCAN encoder-decoders for the positional-encoding ablations of docs/results.md.

  python -m experiments.sweep --config=configs/scan_ablation.py --sweep=positional \
      --vectorize --workdir=runs/sweeps

Expected: the tables of docs/results.md, "Positional encodings and length generalisation
(SCAN)" (on the `length` split, greedy exact match 0.0-6.1% for every encoding, ALiBi best);
about 6 minutes for the 3 seeds of one setting as one vectorised program on a quiet 2-core x86
CPU, the final evaluation included (measured for ALiBi).

SCAN (Lake & Baroni 2018) is generated in-process. The default split is `length` (train on
action sequences of at most 22 actions, test on the 3,920 commands with 24 to 48); the metric is
greedy exact match on the whole test split.

Presets (`--config=configs/scan_ablation.py:NAME`):
  small   (default) post-LN, d_model 64, 2+2 layers, 4 heads, d_ff 256, dropout 0.1, label
          smoothing 0.1, Adam(0.9, 0.98, 1e-9), 200 warmup steps, cosine from 4e-3 to 0 over
          1,000 steps of 64 packed rows.
  long    `small` with relative positions and 3,000 steps (`--sweep=seeds`: seeds 0-2).
  no_eos  `small` with relative positions trained without EOS (`train.predict_eos=False`:
          Newman et al. 2020's "-EOS" models), decoded with oracle lengths
          (`experiments.evaluate --beam_size=1 --oracle_length`).
  tiny    for the tests.

Sweeps (`--sweep=NAME --vectorize`; the sweep's seeds.md gives mean ± std over seeds 0-2):
  positional  model.positional in (sinusoidal, learned, relative, rotary, alibi, none) on the
              `length` and `addprim_jump` splits (36 runs);
  positional_length  `positional` on the `length` split only (for `no_eos`; 18 runs);
  base        the sinusoid's base in (10, 100, 1,000, 10,000, 100,000);
  combine     sinusoidal positions added to the 64-wide embedding vs concatenated (48-wide
              tokens + 16-wide positions);
  score       the attention score (scaled_dot, dot, general, additive) on the `simple` split,
              which this model learns, so that the scores can differ;
  seeds       seeds 0-2 of the chosen preset.
"""

from configs import base, common

SEEDS = (0, 1, 2)
POSITIONALS = ("sinusoidal", "learned", "relative", "rotary", "alibi", "none")

PRESETS = {
    # configs/base.py's SCAN `cpu` optimiser with half its width, for 1,000 steps instead of 2,000.
    "small": {
        **base.PRESETS["cpu"],
        "model.embed_dim": 64,
        "train.num_train_steps": 1000,
        "train.eval_every_steps": 1000,
        "train.checkpoint_every_steps": 500,
        "train.max_eval_examples": 500,
    },
    "tiny": base.PRESETS["tiny"],
}
# `small` with relative positions trained three times as long: does longer training help on
# the `length` split?
PRESETS["long"] = {
    **PRESETS["small"],
    "model.positional": "relative",
    "train.num_train_steps": 3000,
    "train.eval_every_steps": 3000,
    "train.checkpoint_every_steps": 1000,
}
# `small` with relative positions, not trained to predict EOS (decode with oracle lengths).
PRESETS["no_eos"] = {
    **PRESETS["small"],
    "model.positional": "relative",
    "train.predict_eos": False,
}

SWEEPS = {
    "seeds": [{"seed": seed} for seed in SEEDS],
    "positional": [
        {"data.scan_split": split, "model.positional": positional, "seed": seed}
        for split in ("length", "addprim_jump")
        for positional in POSITIONALS
        for seed in SEEDS
    ],
    "positional_length": [
        {"model.positional": positional, "seed": seed}
        for positional in POSITIONALS
        for seed in SEEDS
    ],
    "base": [
        {"model.sinusoidal_base": base, "seed": seed}
        for base in (10.0, 100.0, 1000.0, 10000.0, 100000.0)
        for seed in SEEDS
    ],
    "combine": [
        {"model.positional_combine": "add", "model.positional_dim": 0, "seed": seed}
        for seed in SEEDS
    ]
    + [
        {"model.positional_combine": "concat", "model.positional_dim": 16, "seed": seed}
        for seed in SEEDS
    ],
    "score": [
        {"data.scan_split": "simple", "model.score": score, "seed": seed}
        for score in ("scaled_dot", "dot", "general", "additive")
        for seed in SEEDS
    ],
}


def get_config(arg: str | None = None):
    config = common.base_config(
        model={"kind": "encoder_decoder"},
        data={
            "name": "scan",
            "scan_split": "length",
            "max_source_len": 10,
            "max_target_len": 50,
            "pack": True,
            "packed_source_len": 32,
        },
    )
    return common.apply_preset(config, PRESETS, arg or "small")


def get_sweep(arg: str | None = None):
    return common.get_sweep(SWEEPS, arg)
