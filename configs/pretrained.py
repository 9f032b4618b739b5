r"""Fine-tuning runs that start from a pretrained Hugging Face checkpoint (`experiments.convert`).

  python -m experiments.convert --hf_dir=checkpoints/gpt2 --workdir=runs/gpt2 \
      --config=configs/pretrained.py:gpt2_shakespeare
  python -m experiments.train --config=runs/gpt2/config.json --workdir=runs/gpt2
  python -m experiments.convert --hf_dir=checkpoints/opus-mt-en-de --workdir=runs/opus_en_de \
      --config=configs/pretrained.py:marian_multi30k
  python -m experiments.train --config=runs/opus_en_de/config.json \
      --workdir=runs/opus_en_de_m30k --config.train.init_from=runs/opus_en_de
  python -m experiments.convert --hf_dir=checkpoints/bert-base-uncased --workdir=runs/bert \
      --head=mlm --config=configs/pretrained.py:bert_mlm_shakespeare
  python -m experiments.train --config=runs/bert/config.json --workdir=runs/bert

Expected metric and time: not measured (no real checkpoint can be downloaded on the project's
machine; the tests convert and fine-tune tiny random checkpoints). docs/pretrained.md describes
the recipes.

The `model` group here is a placeholder: `experiments.convert` replaces it with the converted
checkpoint's architecture, and the workdir's `config.json` then holds the whole run. These
presets give the rest: the data, a fine-tuning optimizer (AdamW, short warmup, constant rate)
and the loop. The default preset of each model kind reads an embedded task, so a converted
workdir restores (and `experiments.generate` / `translate` / `evaluate` run) without any corpus.
BERT's masked-LM head (`--head=mlm`, also BertForPreTraining checkpoints) fine-tunes on plain
text lines with BERT's masking (`tfjax.training.mlm`, `train.mlm_rate`).

Presets: `decoder_only` (default), `encoder_decoder`, `encoder_only`, `encoder_only_mlm`:
embedded tasks (the last: masked-LM on the sentences of the `reverse` task);
`gpt2_shakespeare` (Tiny Shakespeare, 256-token windows), `marian_multi30k` (Multi30k en->de),
`bert_mlm_shakespeare` (Tiny Shakespeare lines), `bert_mlm_files` (your text file, one example
per line: `--config.data.train_path=corpus.txt`), `tiny`, `tiny_seq2seq` (tests: a few steps),
`t5_tiny` (tests: a converted T5, a few steps).
"""

from configs import common

FINE_TUNE = {
    "optim.optimizer": "adamw",
    "optim.schedule": "constant",
    "optim.learning_rate": 5e-5,
    "optim.warmup_steps": 100,
    "optim.b2": 0.999,
    "optim.eps": 1e-8,
    "optim.weight_decay": 0.01,
    "optim.grad_clip_norm": 1.0,
    "train.label_smoothing": 0.0,
    "train.num_train_steps": 1000,
    "train.global_batch_size": 8,
    "train.eval_batch_size": 16,
    "train.log_every_steps": 50,
    "train.eval_every_steps": 500,
    "train.checkpoint_every_steps": 500,
}

PRESETS = {
    "decoder_only": {"model.kind": "decoder_only", "data.name": "reverse"},
    "encoder_decoder": {"model.kind": "encoder_decoder", "data.name": "copy"},
    "encoder_only": {
        "model.kind": "encoder_only",
        "data.name": "majority",
        "data.max_source_len": 32,
    },
    "encoder_only_mlm": {
        "model.kind": "encoder_only",
        "model.encoder_head": "mlm",
        "data.name": "reverse",
    },
    "bert_mlm_shakespeare": {
        "model.kind": "encoder_only",
        "model.encoder_head": "mlm",
        "data.name": "tinyshakespeare",
        "data.eval_split": "val",
        "data.max_source_len": 64,
        "train.global_batch_size": 32,
    },
    "bert_mlm_files": {
        "model.kind": "encoder_only",
        "model.encoder_head": "mlm",
        "data.name": "files",
        "data.train_path": "corpus.txt",
        "data.max_source_len": 128,
        "train.global_batch_size": 32,
    },
    "gpt2_shakespeare": {
        "model.kind": "decoder_only",
        "data.name": "tinyshakespeare",
        "data.eval_split": "val",
        "data.max_target_len": 256,
        "optim.learning_rate": 1e-4,
    },
    "marian_multi30k": {
        "model.kind": "encoder_decoder",
        "data.name": "multi30k",
        "data.eval_split": "val",
        "data.max_source_len": 64,
        "data.max_target_len": 64,
        "train.global_batch_size": 32,
        "train.num_train_steps": 3000,
    },
    "tiny": {
        "model.kind": "decoder_only",
        "data.name": "reverse",
        "data.num_train_examples": 64,
        "data.num_eval_examples": 16,
        "train.num_train_steps": 4,
        "train.global_batch_size": 8,
        "train.log_every_steps": 1,
        "train.eval_every_steps": 0,
        "train.checkpoint_every_steps": 4,
        "optim.warmup_steps": 0,
        "optim.learning_rate": 3e-3,
    },
}
# tests: a converted T5 (an encoder-decoder) on the embedded copy task, a few steps
PRESETS["t5_tiny"] = {**PRESETS["tiny"], "model.kind": "encoder_decoder", "data.name": "copy"}


# Tests: a converted encoder-decoder (Marian) for a few steps, on the tiny preset's loop.
PRESETS["tiny_seq2seq"] = {
    **PRESETS["tiny"],
    "model.kind": "encoder_decoder",
    "data.name": "copy",
}


def get_config(arg: str | None = None):
    config = common.base_config(
        model={"dropout_rate": 0.0},
        data={
            "max_source_len": 32,
            "max_target_len": 64,
            "num_train_examples": 2000,
            "num_eval_examples": 200,
        },
    )
    config.update_from_flattened_dict(FINE_TUNE)
    return common.apply_preset(config, {"base": PRESETS["decoder_only"], **PRESETS}, arg)
