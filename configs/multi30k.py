r"""English→German translation on Multi30k (Elliott et al. 2016), joint SentencePiece vocabulary.

  python -m experiments.train --config=configs/multi30k.py:hour_rope_swiglu
  python -m experiments.evaluate --workdir=runs/multi30k_hour_rope_swiglu \
      --split=test2016 --beam_size=5 --alpha=1.4 --average_last=5
  python -m experiments.reproduce --row=multi30k_hour_rope_swiglu   # both, and the comparison

Expected on a 2-core x86 CPU, test2016 sacreBLEU (13a, cased, detokenized) and the time of the
training command (data, SentencePiece training, compilation and evaluations included; the
decoding chosen on val; docs/results.md):
  cpu               38.0 +- 0.2 (beam 5, alpha 1.4; seeds 0-2, recorded), 28 min 43 s - 34 min 18 s
  hour              39.0 (beam 5, alpha 1.0, last 5 averaged), 56 min 27 s
  hour_long         39.1 (beam 5, alpha 1.0, last 5 averaged), 56 min 2 s
  hour_rope_swiglu  40.2 +- 0.3 (beam 5, alpha 1.4, last 5 averaged; seeds 0, 1: 40.4, 40.0),
                    50 min 40 s (a fast host) - 65 min 22 s (a slow one)
  small             greedy val BLEU per sweep cell: docs/results.md's ablation tables;
                    14 min 20 s for a cell's 3 seeds as one vectorised program
  base              not measured (for a GPU)
Wall times depend on the host's day (its `jnp.dot` ceiling varied 2-3x): docs/results.md gives
each run's ceiling.

Data: `data.name="multi30k"`, read from `data.dir` (default $TFJAX_DATA_DIR, else
~/.cache/tfjax/data; `python -m experiments.data --corpus=multi30k` puts it there) and checked
against the SHA-256 sums tfjax ships (docs/data.md); train 29,000 pairs, `val` (1,014) evaluated
during training, `test2016` (1,000) reported once. SentencePiece BPE, 8,000 pieces trained on
the English and German training text at the first run (saved as `<workdir>/tokenizer.model`);
embeddings shared by encoder, decoder and output layer. Reverse the direction with
`--config.data.source_lang=de --config.data.target_lang=en`.

Presets (`--config=configs/multi30k.py:NAME`):
  base  the paper's base model (6+6 layers, d_model 512) with the paper's schedule.
  cpu   4+4 layers, d_model 128 (the "tiny" Transformer of the Multi30k literature), cosine
        schedule, 2,500 steps of ~3,800 target tokens (~20 epochs).
  hour  `cpu` with the paper's schedule (warmup 300) and 3,400 steps, sized for the hour.
  hour_long  `hour` continued to 6,000 steps, keeping the last 20 checkpoints.
  hour_rope_swiglu  `hour_long` with rotary positions and a SwiGLU feed-forward of the same
        parameter count (`model.mlp_dim=344`), 5,000 steps.
  small the ablations' model: post-LN, 2+2 layers, d_model 64, 4 heads, d_ff 256, 4,000 pieces,
        cosine schedule, 1,000 steps of 32 packed rows, greedy val BLEU at the end (about a
        sixth of `cpu`'s FLOPs per token, so that every sweep cell has 3 seeds):
          python -m experiments.sweep --config=configs/multi30k.py:small --sweep=score \
              --vectorize --workdir=runs/sweeps
  tiny  seconds, for the tests (on a few stand-in lines; tests/conftest.py, `fake_corpus`).

Sweeps of `small` (seeds 0-2 each; the sweep's seeds.md gives mean ± std): `score`,
`norm_warmup` (post-/pre-LN x the paper's warmup / a constant 1e-3), `norm_peak` (post-/pre-LN
at the paper's peak 8.8e-3 from step 0), `value_rank` (32, 16, 8, 4, 0 = full), `base`
(sinusoid base 10 ... 100,000), `combine` (positions added vs concatenated). Sweeps of `cpu`
(one seed): `vocab`, `dropout`, `smoothing`.
"""

from configs import common

PRESETS = {
    "base": {
        "train.num_train_steps": 100_000,
        "train.global_batch_size": 64,
    },
    "cpu": {
        "model.embed_dim": 128,
        "model.num_layers": 4,
        "model.num_decoder_layers": 4,
        "model.num_heads": 4,
        "model.mlp_dim": 512,
        "model.dropout_rate": 0.2,
        "optim.schedule": "cosine",
        "optim.learning_rate": 3e-3,
        "optim.warmup_steps": 300,
        "train.num_train_steps": 2500,
        "train.global_batch_size": 48,
        "train.eval_every_steps": 500,
        "train.checkpoint_every_steps": 125,
        "train.keep_checkpoints": 5,
        "train.log_every_steps": 50,
    },
    "small": {
        "model.embed_dim": 64,
        "model.num_layers": 2,
        "model.num_decoder_layers": 2,
        "model.num_heads": 4,
        "model.mlp_dim": 256,
        "model.dropout_rate": 0.1,
        "data.vocab_size": 4000,
        "optim.schedule": "cosine",
        "optim.learning_rate": 4e-3,
        "optim.warmup_steps": 200,
        "train.num_train_steps": 1000,
        "train.global_batch_size": 32,
        "train.eval_every_steps": 1000,
        "train.checkpoint_every_steps": 500,
        "train.log_every_steps": 100,
    },
    "tiny": {
        **common.TINY,
        "model.num_decoder_layers": 1,
        "data.vocab_size": 200,
        "train.max_eval_examples": 8,
    },
}

# `cpu` with the paper's schedule instead of the cosine (peak 128^-0.5 * 300^-0.5 = 5.1e-3,
# then falling as step^-0.5) and as many steps as fit the hour on the 2-core CPU; four greedy
# evaluations, and checkpoints 100 steps apart for averaging.
PRESETS["hour"] = {
    **PRESETS["cpu"],
    "optim.schedule": "paper",
    "optim.learning_rate": 1.0,
    "train.num_train_steps": 3400,
    "train.eval_every_steps": 850,
    "train.checkpoint_every_steps": 100,
}

# `hour`, longer (the paper's schedule does not depend on the total, so the same run continued),
# keeping 20 checkpoints for averaging.
PRESETS["hour_long"] = {
    **PRESETS["hour"],
    "train.num_train_steps": 6000,
    "train.keep_checkpoints": 20,
}

# `hour_long` with rotary positions in the self-attentions (no sinusoids) and a SwiGLU
# feed-forward of the ReLU layer's parameter count (3 x 128 x 344 against 2 x 128 x 512), for
# the 5,000 steps that fit the hour at its slower pace.
PRESETS["hour_rope_swiglu"] = {
    **PRESETS["hour_long"],
    "model.positional": "rotary",
    "model.activation": "swiglu",
    "model.mlp_dim": 344,
    "train.num_train_steps": 5000,
    "train.eval_every_steps": 1250,
}

SEEDS = (0, 1, 2)


def _seeded(settings: list[dict]) -> list[dict]:
    return [{**setting, "seed": seed} for setting in settings for seed in SEEDS]


SWEEPS = {
    "score": _seeded([{"model.score": s} for s in ("scaled_dot", "dot", "general", "additive")]),
    "norm_warmup": _seeded(
        [
            {"model.norm_position": norm, **schedule}
            for norm in ("post", "pre")
            for schedule in (
                {"optim.schedule": "paper", "optim.learning_rate": 1.0},
                {
                    "optim.schedule": "constant",
                    "optim.learning_rate": 1e-3,
                    "optim.warmup_steps": 0,
                },
            )
        ]
    ),
    # The paper's peak rate for this preset, d_model^-0.5 * 200^-0.5 = 8.8e-3, from step 0.
    "norm_peak": _seeded(
        [
            {
                "model.norm_position": norm,
                "optim.schedule": "constant",
                "optim.learning_rate": 8.8e-3,
                "optim.warmup_steps": 0,
            }
            for norm in ("post", "pre")
        ]
    ),
    "value_rank": _seeded([{"model.value_rank": r} for r in (32, 16, 8, 4, 0)]),
    "base": _seeded([{"model.sinusoidal_base": n} for n in (10.0, 100.0, 1e3, 1e4, 1e5)]),
    "combine": _seeded(
        [
            {"model.positional_combine": "add", "model.positional_dim": 0},
            {"model.positional_combine": "concat", "model.positional_dim": 16},
        ]
    ),
    "vocab": [{"data.vocab_size": v} for v in (4000, 8000, 16000)],
    "dropout": [{"model.dropout_rate": v} for v in (0.1, 0.2, 0.3)],
    "smoothing": [{"train.label_smoothing": v} for v in (0.0, 0.1)],
}


def get_config(arg: str | None = None):
    config = common.base_config(
        model={"kind": "encoder_decoder"},
        data={
            "name": "multi30k",
            "source_lang": "en",
            "target_lang": "de",
            "eval_split": "val",
            "tokenizer": "sentencepiece",
            "vocab_size": 8000,
            "max_source_len": 80,
            "max_target_len": 80,
            "pack": True,
            "packed_source_len": 80,
            "packed_target_len": 80,
        },
        train={"eval_batch_size": 128},
    )
    return common.apply_preset(config, PRESETS, arg)


def get_sweep(arg: str | None = None):
    return common.get_sweep(SWEEPS, arg)
