"""Small SCAN encoder-decoders for the ablations of docs/results.md (a few minutes a run).

SCAN (Lake & Baroni 2018) is generated in-process: no download. The default split is `length`
(train on action sequences of at most 22 actions, test on the 3,920 commands whose action
sequences have 24 to 48), the split on which vanilla Transformers fail to generalise; the
metric is greedy exact match on the whole test split (the final evaluation).

Model (preset `small`, the default): post-LN, d_model 64, 2+2 layers, 4 heads, d_ff 256,
dropout 0.1, label smoothing 0.1, Adam(0.9, 0.98, 1e-9) with 200 warmup steps and cosine decay
from 4e-3 to 0 over 1,000 steps of 64 packed rows (about 6 minutes for 3 seeds vectorised on a
quiet 2-core CPU, the final evaluation included; measured for the ALiBi group). `long` is
`small` with relative positions and 3,000 steps (`--sweep=seeds` trains seeds 0-2 of it).
`no_eos` is `small` with relative positions trained without EOS (`train.predict_eos=False`:
EOS targets get no loss, Newman et al. 2020's "-EOS" models), to be decoded with oracle
lengths (`experiments.evaluate --beam_size=1 --oracle_length`); `--sweep=seeds` trains seeds
0-2 of it and `--sweep=positional_length` every positional encoding on the `length` split.
`tiny` is for the tests.

Sweeps (`python -m experiments.sweep --config=configs/scan_ablation.py --sweep=NAME
--vectorize`; the three seeds of a setting train as one vectorised program, and the sweep's
seeds.md gives mean ± standard deviation over them):
  positional  model.positional in (sinusoidal, learned, relative, rotary, alibi, none) on the
              `length` and `addprim_jump` splits, seeds 0-2 (36 runs);
  positional_length  `positional` on the `length` split only (for `no_eos`; 18 runs);
  base        the sinusoid's base n in (10, 100, 1,000, 10,000, 100,000), seeds 0-2;
  combine     sinusoidal positions added to the 64-wide embedding vs concatenated (48-wide
              tokens + 16-wide positions: the same total width), seeds 0-2;
  score       the attention score (scaled_dot, dot, general, additive) on the `simple` split
              (a random 80/20 split of all commands: the algorithmic task that this model
              learns, so that the scores can differ), seeds 0-2.
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
# `small` with relative positions trained three times as long (issue 21's length target).
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
