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
        Measured on a 2-core x86 CPU: 1 h 33 min for the training command (data, SentencePiece
        training, compilation and five greedy-BLEU evaluations on val included); test2016
        sacreBLEU 38.6 and chrF 62.4 with beam 5 (greedy 36.8; `--average_last=5` 38.56).
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
    "tiny": {
        **common.TINY,
        "model.num_decoder_layers": 1,
        "data.vocab_size": 200,
        "train.max_eval_examples": 8,
    },
}

SWEEPS = {
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
