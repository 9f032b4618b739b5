"""Encoder-only classifier ([CLS]-pooled, BERT-style head) on the embedded `majority` task.

  python -m experiments.train --config=configs/classify.py:cpu
  python -m experiments.reproduce --row=classify_majority

Expected (`cpu`): test accuracy 1.000 (1,000 examples, 3 seeds) and 24-29 s for the training
command on a 2-core x86 CPU (docs/results.md). Other presets: not measured.

Task: is there more "1" than "0" in an odd-length 0/1 string (generated from the seed, no
download)? `--config.data.name=parity` sets the much harder parity task.

Presets (`--config=configs/classify.py:NAME`): `base` (6 layers, d_model 512), `big` (d_model
1024, 16 heads), `cpu` (2 layers, d_model 64, 1,000 steps), `tiny` (tests).
Sweeps: `task` (majority, parity), `layers` (1, 2, 4).
"""

from configs import common

PRESETS = {
    "base": {},
    "big": common.BIG,
    "cpu": {
        "model.embed_dim": 64,
        "model.num_layers": 2,
        "model.num_heads": 4,
        "model.mlp_dim": 128,
        "model.dropout_rate": 0.0,
        "optim.schedule": "cosine",
        "optim.warmup_steps": 200,
        "optim.learning_rate": 3e-3,
        "train.num_train_steps": 1000,
        "train.global_batch_size": 64,
        "train.eval_every_steps": 500,
        "train.checkpoint_every_steps": 500,
        "train.log_every_steps": 50,
    },
    "tiny": {
        **common.TINY,
        "data.num_train_examples": 64,
        "data.num_eval_examples": 16,
    },
}

SWEEPS = {
    "task": [{"data.name": name} for name in ("majority", "parity")],
    "layers": [{"model.num_layers": n} for n in (1, 2, 4)],
}


def get_config(arg: str | None = None):
    config = common.base_config(
        model={"kind": "encoder_only", "encoder_head": "classify", "num_classes": 2},
        data={
            "name": "majority",
            "task_min_len": 1,
            "task_max_len": 21,
            "max_source_len": 22,
            "num_train_examples": 20000,
            "num_eval_examples": 1000,
        },
        train={"label_smoothing": 0.0},
    )
    return common.apply_preset(config, PRESETS, arg)


def get_sweep(arg: str | None = None):
    return common.get_sweep(SWEEPS, arg)
