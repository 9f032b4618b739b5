r"""Character-level language model on Tiny Shakespeare: nanoGPT's `shakespeare_char` benchmark.

  python -m experiments.train --config=configs/shakespeare_char.py:hour_ctx256
  python -m experiments.reproduce --row=shakespeare_hour_ctx256
  python -m experiments.generate --workdir=runs/shakespeare_char_hour_ctx256 --prompt="ROMEO:" \
      --max_length=400 --temperature=0.8

Expected on a 2-core x86 CPU, val loss in nats/char on the whole split and the time of the
training command (data, compilation and evaluations included; docs/results.md, one seed
unless noted):
  cpu               1.672 ± 0.012 (seeds 0, 1, 2), 2 min 54 s - 3 min 27 s (nanoGPT reports
                    about 1.88 for this setting)
  hour              1.523, 53 min 5 s
  hour_muon         1.478, 47 min 27 s
  hour_rope_swiglu  1.4716 ± 0.0002 (seeds 0, 1), 52 min 30 s - 67 min 1 s
  hour_ctx256       1.4661 ± 0.0036 (seeds 0, 1: 1.4635, 1.4686), 56 min 23 s (a fast host) -
                    82 min 26 s (a slow one)
  search_grid_best  2.447, 2 min 13 s; search_tpe_best 2.454, 2 min 14 s (docs/sweeps.md)
  gpu               not measured on the CPU; on one H200: best val 1.500, 4 min 30 s
                    (nanoGPT's best: 1.4697)
Wall times depend on the host's day (its `jnp.dot` ceiling varied 2-3x): docs/results.md gives
each run's ceiling.

Data: `data.name="tinyshakespeare"`, read from `data.dir` (default $TFJAX_DATA_DIR, else
~/.cache/tfjax/data; `python -m experiments.data --corpus=tinyshakespeare` puts it there) and
checked against the SHA-256 tfjax ships (docs/data.md); the first 90% of the 1,115,394
characters train, the last 10% (111,540) evaluate, as in nanoGPT. One id per character (65
characters plus the 4 special ids, which never occur in the text). Windows of `max_target_len`
= context + 1 characters: the first character of a window is context only, so each window
scores `context` predictions with 1 to `context` characters before them, nanoGPT's block-size
setting. Training windows start every `data.lm_stride` characters; the periodic and final
evaluations score the whole val split once in consecutive windows (`experiments.evaluate` also
reports nanoGPT's estimate over 2,400 random windows).

Model: a GPT-style decoder (pre-LN with a final LayerNorm, GELU, learned positions, output
layer tied to the embedding), Adam(0.9, 0.99) with linear warmup and cosine decay, no label
smoothing (the loss is the reported number).

Presets (`--config=configs/shakespeare_char.py:NAME`):
  cpu   nanoGPT's CPU setting: 4 layers, 4 heads, width 128, context 64, no dropout, 1,500 steps
        of 32 windows.
  hour  sized for an hour on the 2-core CPU: 6 layers, 6 heads, width 192, context 128,
        dropout 0.2, 4,500 steps of 32 windows (~18 passes over the training text).
  hour_muon  `hour` with Muon (0.02 for the hidden kernels, AdamW at 2e-3 for the rest), a
        window at every character (`data.lm_stride=1`), 6,500 steps.
  hour_rope_swiglu  `hour_muon` with rotary positions and a SwiGLU feed-forward
        (`model.mlp_dim=512`: three 192 x 512 kernels, GELU's two 192 x 768 in parameters).
  hour_ctx256  `hour_rope_swiglu` at nanoGPT's context of 256 characters, 16 windows a step
        (the same predicted characters a step), 4,600 steps.
  gpu   nanoGPT's GPU setting: 6 layers, 6 heads, width 384, context 256, dropout 0.2 (residual
        branches, embeddings, attention probabilities), no biases in the linear layers, 5,000
        steps of 64 windows, AdamW (0.9, 0.99) with weight decay 0.1 on the matrices, gradients
        clipped at norm 1, warmup 100 and cosine from 1e-3 to 1e-4, bfloat16 compute.
  search  the cpu preset's optimizer, a 2-layer model of width 64, context 32, 200 steps: an
        Optuna study (`python -m experiments.search --search=lr_warmup`) against the grid of as
        many trials (`python -m experiments.sweep --sweep=search_grid --vectorize`).
  search_grid_best, search_tpe_best  the best trial of each, trained alone.
  pbt   2 layers of width 64, 200 steps, as a population-based training sweep
        (`--sweep=pbt_lr`: four learning rates in one vectorised program; docs/sweeps.md).
  tiny  seconds, for the tests.
"""

from configs import common

# The `hour` presets' model, data and schedule (their step counts and optimizers differ).
_HOUR = {
    "model.embed_dim": 192,
    "model.num_layers": 6,
    "model.num_heads": 6,
    "model.mlp_dim": 768,
    "model.dropout_rate": 0.2,
    "data.max_target_len": 129,
    "data.lm_stride": 16,
    "optim.warmup_steps": 200,
    "train.global_batch_size": 32,
    "train.eval_every_steps": 1000,
    "train.checkpoint_every_steps": 500,
    "train.log_every_steps": 100,
}

PRESETS = {
    "cpu": {
        "model.embed_dim": 128,
        "model.num_layers": 4,
        "model.num_heads": 4,
        "model.mlp_dim": 512,
        "model.dropout_rate": 0.0,
        "data.max_target_len": 65,
        "data.lm_stride": 16,
        "optim.warmup_steps": 100,
        "train.num_train_steps": 1500,
        "train.global_batch_size": 32,
        "train.eval_every_steps": 500,
        "train.checkpoint_every_steps": 500,
        "train.log_every_steps": 100,
    },
    "hour": {**_HOUR, "train.num_train_steps": 4500},
    "hour_muon": {
        **_HOUR,
        "data.lm_stride": 1,  # a window at every character (lower val loss than 16)
        "optim.optimizer": "muon",
        "optim.muon_learning_rate": 0.02,
        "train.num_train_steps": 6500,
    },
    "gpu": {
        "model.embed_dim": 384,
        "model.num_layers": 6,
        "model.num_heads": 6,
        "model.mlp_dim": 1536,
        "model.dropout_rate": 0.2,
        "model.attention_dropout_rate": 0.2,
        "model.use_bias": False,
        "model.dtype": "bfloat16",
        "data.max_target_len": 257,
        "data.lm_stride": 1,  # nanoGPT draws windows at random offsets
        "optim.optimizer": "adamw",
        "optim.weight_decay": 0.1,
        "optim.weight_decay_params": "matrices",
        "optim.grad_clip_norm": 1.0,
        "optim.end_lr_fraction": 0.1,
        "optim.learning_rate": 1e-3,
        "optim.warmup_steps": 100,
        "train.num_train_steps": 5000,
        "train.global_batch_size": 64,
        "train.eval_every_steps": 250,
        "train.checkpoint_every_steps": 1000,
        "train.log_every_steps": 50,
    },
    "tiny": {
        **common.TINY,
        "data.max_target_len": 17,
        "data.lm_stride": 64,
        "optim.warmup_steps": 2,
        "train.max_eval_examples": 16,
    },
}

# hour_muon with rotary positions and a SwiGLU feed-forward of the same parameter count
# (3 x 192 x 512 against GELU's 2 x 192 x 768).
PRESETS["hour_rope_swiglu"] = {
    **PRESETS["hour_muon"],
    "model.positional": "rotary",
    "model.activation": "swiglu",
    "model.mlp_dim": 512,
}

# hour_rope_swiglu at nanoGPT's context, 256 characters, with the same characters per step.
PRESETS["hour_ctx256"] = {
    **PRESETS["hour_rope_swiglu"],
    "data.max_target_len": 257,
    "train.global_batch_size": 16,
    "train.num_train_steps": 4600,
}

# An Optuna study against the grid of as many trials (docs/sweeps.md, "Searches"): the cpu
# preset's optimizer on a 2-layer model of width 64, context 32, 16 windows a step, 200 steps.
PRESETS["search"] = {
    **PRESETS["cpu"],
    "model.embed_dim": 64,
    "model.num_layers": 2,
    "model.num_heads": 2,
    "model.mlp_dim": 256,
    "data.max_target_len": 33,
    "optim.warmup_steps": 20,
    "train.num_train_steps": 200,
    "train.global_batch_size": 16,
    "train.eval_every_steps": 50,
    "train.max_eval_examples": 256,
    "train.checkpoint_every_steps": 100,
    "train.log_every_steps": 50,
}

# The best trial of each (docs/sweeps.md, "Searches"; rows shakespeare_search_grid and
# shakespeare_search_tpe of docs/results.md), trained alone.
PRESETS["search_grid_best"] = {
    **PRESETS["search"],
    "optim.learning_rate": 0.01,
    "optim.warmup_steps": 40,
}
PRESETS["search_tpe_best"] = {
    **PRESETS["search"],
    "optim.learning_rate": 0.0044296495704642955,
    "optim.warmup_steps": 37,
}

# Population-based training against its grid (docs/sweeps.md): a small model (2 layers, width
# 64) for 200 steps, the trials ranked on 128 val windows every 40 steps; the worst of the four
# copies the best and multiplies its learning rate by 0.8 or 1.25. Its grid: the same command
# with --config.sweep.pbt.interval=0.
PRESETS["pbt"] = {
    **PRESETS["cpu"],
    "model.embed_dim": 64,
    "model.num_layers": 2,
    "model.mlp_dim": 256,
    "optim.warmup_steps": 20,
    "train.num_train_steps": 200,
    "train.eval_every_steps": 40,
    "train.checkpoint_every_steps": 100,
    "train.log_every_steps": 40,
    "train.max_eval_examples": 128,
    "sweep.vectorize": True,
    "sweep.pbt.interval": 40,
}

SWEEPS = {
    "lr": [{"optim.learning_rate": v} for v in (1e-3, 2e-3, 4e-3)],
    # Four peak learning rates for PBT or a grid (preset `pbt`); one shape: one program.
    "pbt_lr": [{"optim.learning_rate": v} for v in (5e-4, 1e-3, 4e-3, 1.6e-2)],
    "positional": [{"model.positional": p} for p in ("learned", "rotary", "alibi")],
    # The grid of the `search` preset's study: 4 peak learning rates x 2 warmups, one program.
    "search_grid": [
        {"optim.learning_rate": lr, "optim.warmup_steps": warmup}
        for lr in (1e-3, 3e-3, 1e-2, 3e-2)
        for warmup in (5, 40)
    ],
}

SEARCHES = {
    # The same ranges as `search_grid`, as many trials: TPE after 4 random ones, 4 a program,
    # the median pruner at each evaluation after the first (every 50 steps).
    "lr_warmup": {
        "space": {
            "optim.learning_rate": {"log_uniform": (1e-3, 3e-2)},
            "optim.warmup_steps": {"int": (5, 40)},
        },
        "trials": 8,
        "per_generation": 4,
        "sampler": {"name": "tpe", "n_startup_trials": 4},
        "pruner": {"name": "median", "n_startup_trials": 2, "n_warmup_steps": 50},
    },
}


def get_config(arg: str | None = None):
    config = common.base_config(
        model={
            "kind": "decoder_only",
            "norm_position": "pre",
            "activation": "gelu",
            "positional": "learned",
            "scale_embeddings": False,
        },
        data={
            "name": "tinyshakespeare",
            "tokenizer": "char",
            "eval_split": "val",
            "max_target_len": 65,
        },
        optim_overrides={"schedule": "cosine", "learning_rate": 2e-3, "b2": 0.99},
        train={"label_smoothing": 0.0, "eval_batch_size": 256},
    )
    return common.apply_preset(config, PRESETS, arg or "cpu")


def get_sweep(arg: str | None = None):
    return common.get_sweep(SWEEPS, arg)


def get_search(arg: str | None = None):
    return common.get_search(SEARCHES, arg)
