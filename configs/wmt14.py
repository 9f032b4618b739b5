"""The paper's WMT 2014 English→German setting (Vaswani et al. 2017, §5.1), for accelerators.

  python -m experiments.train --config=configs/wmt14.py:base
  python -m experiments.evaluate --workdir=runs/wmt14_base --split=test --average_last=5

Expected: not measured (it needs an accelerator; the paper trained `base` for 12 hours on 8
P100s). The paper reports 27.3 (base) and 28.4 (big) tokenized BLEU on newstest2014; expect a
little less as detokenized sacreBLEU. The tests check that the presets build and that the same
pipeline trains and evaluates `tiny` on a local JSON-lines sample through the same hub code path.

Data: WMT14 En-De through Hugging Face `datasets` (`hub_name="wmt14"`, `hub_config="de-en"`,
the `hub` extra: pip install "tfjax[hub]"; downloads about 1.4 GB on the first run): 4.5M
training pairs, newstest2013 (`validation`) evaluated during training, newstest2014 (`test`)
reported by `experiments.evaluate --split=test`. A shared SentencePiece BPE vocabulary of
37,000 pieces (the paper's size; trained on a 2M-sentence sample), sequences up to 256 pieces,
packed rows of 256 tokens, 96 rows per step (~25,000 target tokens, the paper's batch).

Presets (`--config=configs/wmt14.py:NAME`): `base` (default, 100k steps with the paper's
schedule), `big` (300k steps), `tiny` (tests, on local JSON lines).
"""

from configs import common

PRESETS = {
    "base": {},
    "big": {**common.BIG, "train.num_train_steps": 300_000},
    "tiny": {
        **common.TINY,
        "model.num_decoder_layers": 1,
        "data.hub_name": "json",  # the tests point train_path/eval_path at local JSON lines
        "data.vocab_size": 200,
        "data.max_source_len": 48,
        "data.max_target_len": 48,
        "data.packed_source_len": 48,
        "data.packed_target_len": 48,
        "train.max_eval_examples": 8,
    },
}


def get_config(arg: str | None = None):
    config = common.base_config(
        model={"kind": "encoder_decoder"},
        data={
            "name": "hub",
            "hub_name": "wmt14",
            "hub_config": "de-en",
            "source_lang": "en",
            "target_lang": "de",
            "eval_split": "validation",
            "tokenizer": "sentencepiece",
            "vocab_size": 37000,
            "max_source_len": 256,
            "max_target_len": 256,
            "pack": True,
            "packed_source_len": 256,
            "packed_target_len": 256,
        },
        train={
            "num_train_steps": 100_000,
            "global_batch_size": 96,
            "eval_every_steps": 5000,
            "max_eval_examples": 0,
            "checkpoint_every_steps": 2500,
            "keep_checkpoints": 5,
        },
    )
    return common.apply_preset(config, PRESETS, arg)
