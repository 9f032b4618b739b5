"""English→German translation on Multi30k (Elliott et al. 2016), joint SentencePiece vocabulary.

Data: `data.name="multi30k"`, read from `data.dir` (default $TFJAX_DATA_DIR, else
../shared/data) and checked against its SHA256SUMS; train 29,000 pairs, `val` (1,014) evaluated
during training, `test2016` (1,000) reported once. Subwords: SentencePiece BPE, 8,000 pieces
trained on the English and German training text at the first run (saved as
`<workdir>/tokenizer.model`); embeddings shared by encoder, decoder and output layer.
Reverse the direction with `--config.data.source_lang=de --config.data.target_lang=en`.

Presets (`--config=configs/multi30k.py:NAME`):
  base  the paper's base model (6+6 layers, d_model 512) with the paper's schedule: for a GPU.
  cpu   a 4+4-layer d_model 128 model (the "tiny" Transformer size of the Multi30k literature)
        for a 2-core CPU, cosine schedule, 2,500 steps of ~3,800 target tokens (~20 epochs):
          python -m experiments.train --config=configs/multi30k.py:cpu
          python -m experiments.evaluate --workdir=runs/multi30k_cpu --split=test2016 \
              --beam_size=5
        Measured on a quiet 2-core x86 CPU (jnp.dot ceiling ~205 GFLOP/s): 40 min 16 s for the
        training command (data, SentencePiece training, compilation and five greedy-BLEU
        evaluations on val included); test2016 sacreBLEU 37.7, chrF 63.0 with beam 5 and the
        length penalty chosen on val (alpha 1.4; greedy 37.5). An earlier run on another host:
        38.6 with beam 5 at alpha 0.6.
  hour  `cpu` with the paper's schedule (warmup 300) instead of the cosine and 3,400 steps, to
        fit the hour on the 2-core CPU (docs/results.md gives the measured run):
          python -m experiments.train --config=configs/multi30k.py:hour
        Measured on the quiet 2-core CPU: 56 min 27 s for the training command; test2016
        sacreBLEU 39.0, chrF 63.5 with beam 5, alpha 1.0 and the last 5 checkpoints averaged
        (both chosen on val; greedy 37.6).
  hour_long  `hour` continued to 6,000 steps (the paper's schedule does not depend on the total,
        so this is the same run, longer), keeping the last 20 checkpoints; measured on the quiet
        2-core CPU on a day its jnp.dot ceiling was 421-469 GFLOP/s (2.3x that of the `hour`
        run's day), as 3,400 steps then resumed to 6,000: 30 min 31 s + 25 min 31 s = 56 min 2 s:
          python -m experiments.train --config=configs/multi30k.py:hour_long
        test2016 sacreBLEU 39.1, chrF 63.8 with beam 5, alpha 1.0 and the last 5 checkpoints
        averaged (chosen on val: 41.8; averaging 10 or 20 gave less).
  hour_rope_swiglu  `hour_long` with rotary positions (`model.positional="rotary"`) and a
        SwiGLU feed-forward of the same parameter count (`model.activation="swiglu"`,
        `model.mlp_dim=344`), 5,000 steps (greedy evaluations every 1,250):
          python -m experiments.train --config=configs/multi30k.py:hour_rope_swiglu
        Measured on the quiet 2-core CPU (jnp.dot ceiling 438-491 GFLOP/s before, 450-478
        after): 50 min 40 s for the training command. Decoding chosen on val among beam 5
        with the last 5 checkpoints averaged at alpha 0.6 / 1.0 / 1.4, the last 10 and the
        last alone at alpha 1.0: the last 5 at alpha 1.4 (val 41.49); test2016 sacreBLEU
        40.4, chrF 64.7 (greedy 39.9). On val it is 0.27 below `hour_long` (41.76): see the
        docs/results.md for what that means for the choice between the two.
  small the ablations' model (issue 21): post-LN, 2+2 layers, d_model 64, 4 heads, d_ff 256,
        4,000 joint pieces, cosine schedule, 1,000 steps of 32 packed rows, greedy val BLEU at
        the end; about a sixth of `cpu`'s FLOPs per token, so that every cell of a sweep has 3
        seeds: 14 min 20 s for a cell's 3 seeds as one vectorised program on the quiet 2-core
        CPU (data, compilation and the final greedy BLEU on val included):
          python -m experiments.sweep --config=configs/multi30k.py:small --sweep=score \
              --vectorize --workdir=runs/sweeps
        Sweeps for it (seeds 0-2 each; the sweep's seeds.md gives mean ± std): `score`
        (scaled_dot, dot, general, additive), `norm_warmup` (post-/pre-LN x the paper's
        warmup schedule / a constant 1e-3 without warmup), `norm_peak` (post-/pre-LN at the
        paper's peak rate 8.8e-3 from step 0, no warmup), `value_rank` (32, 16, 8, 4,
        0 = full: last, as it is `score`'s scaled_dot cell again), `base` (sinusoid base 10
        ... 100,000), `combine` (positions added to the 64-wide embedding vs 48 + 16
        concatenated). All run (tables in docs/results.md), except `value_rank`'s full cell (the
        `score` sweep's scaled_dot cell stands for it).
  tiny  seconds, for the tests (needs only a small multi30k/ folder with a SHA256SUMS file).
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

# `hour`, longer: as many steps as fit the hour on a faster day of the same 2-core CPU.
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
