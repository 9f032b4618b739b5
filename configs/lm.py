"""Decoder-only causal language model on an embedded algorithmic task (no download).

Each training sequence is "source | target" for the `reverse` task (random symbol strings and
their reversal, generated from the seed): the model must copy the source tokens' reversal after
the separator, while the source half itself is unpredictable, so token accuracy over whole
sequences tops out near the share of target tokens.

Presets (`--config=configs/lm.py:NAME`): `base` (paper-sized stack: 6 layers, d_model 512),
`big` (d_model 1024, 16 heads), `cpu` (a small model for a 2-core CPU), `tiny` (tests).
  python -m experiments.train --config=configs/lm.py:cpu
Expected on a 2-core x86 CPU: about 2 minutes; test token accuracy about 0.58 (the ceiling: the
random source half cannot be predicted) and greedy continuations of "s3 s1 s4 s9 |" that
reverse the prompt (`python -m experiments.generate --workdir=runs/lm_cpu --prompt "..."`).

Sweeps: `positional` (sinusoidal, rotary, alibi, relative), `norm` (post-LN vs pre-LN).
"""

from configs import common

PRESETS = {
    "base": {},
    "big": common.BIG,
    "cpu": {
        "model.embed_dim": 128,
        "model.num_layers": 2,
        "model.num_heads": 4,
        "model.mlp_dim": 256,
        "model.dropout_rate": 0.0,
        "optim.schedule": "cosine",
        "optim.warmup_steps": 200,
        "optim.learning_rate": 3e-3,
        "train.num_train_steps": 2000,
        "train.global_batch_size": 64,
        "train.eval_every_steps": 1000,
        "train.checkpoint_every_steps": 1000,
        "train.log_every_steps": 50,
    },
    "tiny": {
        **common.TINY,
        "data.num_train_examples": 64,
        "data.num_eval_examples": 16,
    },
}

SWEEPS = {
    "positional": [{"model.positional": p} for p in ("sinusoidal", "rotary", "alibi", "relative")],
    "norm": [{"model.norm_position": p} for p in ("post", "pre")],
}


def get_config(arg: str | None = None):
    config = common.base_config(
        model={"kind": "decoder_only"},
        data={
            "name": "reverse",
            "task_min_len": 2,
            "task_max_len": 12,
            "max_target_len": 27,
            "num_train_examples": 20000,
            "num_eval_examples": 1000,
            "pack": True,
        },
    )
    return common.apply_preset(config, PRESETS, arg)


def get_sweep(arg: str | None = None):
    return common.get_sweep(SWEEPS, arg)
