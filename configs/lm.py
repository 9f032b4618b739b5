"""Decoder-only causal language model on the embedded `reverse` task (no download).

  python -m experiments.train --config=configs/lm.py:cpu
  python -m experiments.generate --workdir=runs/lm_cpu --prompt="s3 s1 s4 s9 |"
  python -m experiments.reproduce --row=lm_reverse

Expected (`cpu`): test token accuracy 0.576 ± 0.001 (3 seeds) and 1 min 33 s - 1 min 46 s for
the training command on a 2-core x86 CPU (docs/results.md); greedy continuations reverse the
prompt. Other presets: not measured.

Each sequence is "source | target": random symbol strings and their reversal, generated from the
seed. The source half is unpredictable, so token accuracy over whole sequences tops out near the
share of target tokens (about 0.58).

Presets (`--config=configs/lm.py:NAME`): `base` (6 layers, d_model 512), `big` (d_model 1024,
16 heads), `1b`, `cpu` (a small model for a 2-core CPU), `tiny` (tests).

`1b` is TinyLlama 1.1B's architecture and optimizer (Zhang et al. 2024, §2.2 and Table 1, after
Llama 2): d_model 2048, 22 pre-RMSNorm layers, 32 query and 4 key/value heads, a SwiGLU MLP 5632
wide, rotary positions, no biases but the output layer's (which Llama lacks), an untied
32,000-token output layer, 2048-token rows: 1,100,080,384 parameters; AdamW with β2 0.95, weight
decay 0.1, clipping at 1.0, cosine from 4e-4 to 4e-5 after 2,000 warmup steps; bf16 compute,
float32 parameters and Adam moments. It is sized for an accelerator slice; plan one with
  python -m experiments.plan --config=configs/lm.py:1b --topology=v5p:2x2x2 --mesh=fsdp:8
Its data is still the toy task: point `data` at a real corpus to train it.

Sweeps: `positional` (sinusoidal, rotary, alibi, relative), `norm` (post-LN vs pre-LN).
"""

from configs import common

PRESETS = {
    "base": {},
    "big": common.BIG,
    "1b": {
        "model.vocab_size": 32000,
        "model.embed_dim": 2048,
        "model.num_layers": 22,
        "model.num_heads": 32,
        "model.num_kv_heads": 4,
        "model.mlp_dim": 5632,
        "model.max_len": 2048,
        "model.activation": "swiglu",
        "model.norm": "rmsnorm",
        "model.norm_position": "pre",
        "model.layer_norm_epsilon": 1e-5,
        "model.positional": "rotary",
        "model.use_bias": False,
        "model.tie_output": False,
        "model.scale_embeddings": False,
        "model.dropout_rate": 0.0,
        "model.dtype": "bfloat16",
        "data.max_target_len": 2048,
        "optim.optimizer": "adamw",
        "optim.schedule": "cosine",
        "optim.learning_rate": 4e-4,
        "optim.warmup_steps": 2000,
        "optim.b2": 0.95,
        "optim.eps": 1e-8,
        "optim.weight_decay": 0.1,
        "optim.grad_clip_norm": 1.0,
        "optim.end_lr_fraction": 0.1,
        "train.global_batch_size": 16,
    },
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
