"""Tiny random Hugging Face checkpoints, written locally for the pretrained-model tests.

Each builder makes a tokenizer from a few sentences (no download), a model of a tiny config
with random weights (norm scales and biases perturbed too, so that a wrong norm or bias mapping
shows), and writes both with `save_pretrained` into a directory. Imported by the tests only
after `pytest.importorskip("transformers")`.
"""

import pathlib

import numpy as np
import pytest
import torch
import transformers

from tfjax import errors, pretrained

TEXTS = [
    "A dog runs across the green field.",
    "Two children play with a red ball in the park!",
    "The old man reads a newspaper on the bench.",
    "ROMEO: But soft, what light through yonder window breaks?",
    "s3 s1 s4 | s4 s1 s3",
]


def perturb(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random norm scales around 1 and small random biases, in place; returns the model."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if param.ndim == 1:
                param.add_((0.3 if "norm" in name.lower() or "ln" in name else 0.1) * noise)
    return model.eval()


def gpt2_tokenizer(directory: pathlib.Path) -> transformers.PreTrainedTokenizerBase:
    """A byte-level BPE tokenizer (GPT-2's kind) trained on `TEXTS`, ending in <|endoftext|>."""
    import tokenizers

    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(TEXTS * 4, vocab_size=300, min_frequency=1, special_tokens=[])
    bpe.add_special_tokens(["<|endoftext|>"])
    end = "<|endoftext|>"
    tokenizer = transformers.GPT2TokenizerFast(
        tokenizer_object=bpe._tokenizer, bos_token=end, eos_token=end, unk_token=end
    )
    tokenizer.save_pretrained(str(directory))
    return tokenizer


def gpt2(directory: pathlib.Path, **overrides) -> transformers.GPT2LMHeadModel:
    """A 2-layer GPT-2 (D 16, 4 heads, 24 positions) with its tokenizer, saved in `directory`."""
    tokenizer = gpt2_tokenizer(directory)
    end = tokenizer.eos_token_id
    config = transformers.GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=24,
        n_embd=16,
        n_layer=2,
        n_head=4,
        bos_token_id=end,
        eos_token_id=end,
        initializer_range=0.3,  # pre-activations of order 1: GELU's approximations differ
        **overrides,
    )
    torch.manual_seed(0)
    model = perturb(transformers.GPT2LMHeadModel(config))
    model.save_pretrained(str(directory))
    return model


def bert_tokenizer(directory: pathlib.Path) -> transformers.PreTrainedTokenizerBase:
    """A WordPiece tokenizer (BERT's kind) over the lower-cased words of `TEXTS`."""
    import re

    words = sorted({w for text in TEXTS for w in re.findall(r"\w+|[^\w\s]", text.lower())})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, "##s", "##ing"]
    tokenizer = transformers.BertTokenizer(vocab={token: i for i, token in enumerate(vocab)})
    tokenizer.save_pretrained(str(directory))
    return tokenizer


def bert(
    directory: pathlib.Path, head: str = "mlm", **overrides
) -> transformers.BertPreTrainedModel:
    """A 2-layer BERT (D 16, 4 heads) with an MLM ("mlm"), a 3-class classification
    ("classify") or the pre-training ("pretraining": MLM + next sentence) head."""
    tokenizer = bert_tokenizer(directory)
    config = transformers.BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=32,
        max_position_embeddings=24,
        initializer_range=0.3,
        num_labels=3,
        **overrides,
    )
    torch.manual_seed(0)
    cls = {
        "mlm": transformers.BertForMaskedLM,
        "classify": transformers.BertForSequenceClassification,
        "pretraining": transformers.BertForPreTraining,
    }[head]
    model = perturb(cls(config))
    model.save_pretrained(str(directory))
    return model


def t5_tokenizer(directory: pathlib.Path) -> transformers.PreTrainedTokenizerBase:
    """A SentencePiece unigram model (T5's kind: <pad> 0, </s> 1, <unk> 2) trained on `TEXTS`,
    as a `T5Tokenizer` with 3 sentinels, saved in `directory`."""
    import sentencepiece

    prefix = directory / "spiece"
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(TEXTS * 4),
        model_prefix=str(prefix),
        vocab_size=60,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        minloglevel=2,
    )
    tokenizer = transformers.T5Tokenizer.from_pretrained(str(directory), extra_ids=3)
    tokenizer.save_pretrained(str(directory))
    return tokenizer


T5_VERSIONS = {
    "v1.0": dict(feed_forward_proj="relu"),  # tied output, rescaled by d_model**-0.5
    "v1.1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False),  # untied lm_head
}


def t5(directory: pathlib.Path, version: str = "v1.0", **overrides):
    """A T5ForConditionalGeneration (D 16, 4 heads of width 8, 2 encoder and 3 decoder layers,
    8 relative buckets up to distance 6) of `version` (`T5_VERSIONS`), saved in `directory`.
    v1.1's lm_head is drawn apart from the shared embeddings (untied)."""
    tokenizer = t5_tokenizer(directory)
    config = transformers.T5Config(
        vocab_size=len(tokenizer),
        d_model=16,
        d_kv=8,
        d_ff=32,
        num_layers=2,
        num_decoder_layers=3,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=6,
        decoder_start_token_id=tokenizer.pad_token_id,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **{**T5_VERSIONS[version], **overrides},
    )
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(config)
    if version != "v1.0":
        generator = torch.Generator().manual_seed(1)
        head = torch.randn(model.lm_head.weight.shape, generator=generator)
        model.lm_head.weight = torch.nn.Parameter(head)
    model = perturb(model)
    model.save_pretrained(str(directory))
    return model


# German sides of `TEXTS`' first three sentences, and more, for Marian's target vocabulary.
TARGET_TEXTS = [
    "Ein Hund rennt über die grüne Wiese.",
    "Zwei Kinder spielen mit einem roten Ball im Park!",
    "Der alte Mann liest eine Zeitung auf der Bank.",
    "Eine Frau fährt mit dem Fahrrad durch die Stadt.",
]


def _sentencepiece(texts: list[str], path: pathlib.Path) -> list[str]:
    """Trains a tiny SentencePiece BPE model on `texts` into `path`; returns its pieces."""
    import io

    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(texts * 4),
        model_writer=model,
        model_type="bpe",
        vocab_size=80,
        hard_vocab_limit=False,
        character_coverage=1.0,
        minloglevel=2,
    )
    path.write_bytes(model.getvalue())
    processor = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
    return [
        processor.id_to_piece(i)
        for i in range(processor.get_piece_size())
        if not (processor.is_control(i) or processor.is_unknown(i))
    ]


def marian_tokenizer(directory: pathlib.Path) -> transformers.PreTrainedTokenizerBase:
    """A MarianTokenizer with an English source and a German target SentencePiece model and one
    shared vocab.json laid out as OPUS-MT's: </s> = 0, <unk> = 1, pieces, <pad> last."""
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        scratch = pathlib.Path(scratch)
        pieces = _sentencepiece(TEXTS, scratch / "source.spm")
        pieces += _sentencepiece(TARGET_TEXTS, scratch / "target.spm")
        tokens = ["</s>", "<unk>", *dict.fromkeys(pieces), "<pad>"]
        (scratch / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
        tokenizer = transformers.MarianTokenizer(
            source_spm=str(scratch / "source.spm"),
            target_spm=str(scratch / "target.spm"),
            vocab=str(scratch / "vocab.json"),
        )
        tokenizer.save_pretrained(str(directory))
    return transformers.AutoTokenizer.from_pretrained(str(directory))


def marian(
    directory: pathlib.Path,
    *,
    generation: dict | None = None,
    eos_bias: float = 0.0,
    pad_bias: float = 2.5,
    eos_position: tuple[int, float] | None = (6, 3.0),
    **overrides,
) -> transformers.MarianMTModel:
    """A 2+2-layer Marian (D 16, 4 heads, swish) with its tokenizer and an OPUS-MT style
    generation_config.json (beam 4, pad forbidden, forced EOS, renormalized log-probs).

    Random models either stop at once or never (a repeated token); EOS's embedding row set to
    a multiple of the decoder's position encoding at step p makes EOS likelier near p, so that
    beam search weighs hypotheses of several lengths and the length penalty matters."""
    tokenizer = marian_tokenizer(directory)
    pad = tokenizer.pad_token_id
    fields = dict(
        vocab_size=len(tokenizer),
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        activation_function="swish",
        scale_embedding=True,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=0,
        forced_eos_token_id=0,
        init_std=0.4,
        architectures=["MarianMTModel"],
    )
    config = transformers.MarianConfig(**{**fields, **overrides})
    torch.manual_seed(0)
    model = perturb(transformers.MarianMTModel(config))
    with torch.no_grad():  # a buffer, not a parameter: perturb it too
        generator = torch.Generator().manual_seed(1)
        bias = 0.3 * torch.randn(model.final_logits_bias.shape, generator=generator)
        # <pad> likely enough that it would be generated unless forbidden; EOS (below) likelier
        # near target position `eos_position[0]`, so that hypotheses end at several lengths.
        bias[0, config.eos_token_id] += eos_bias
        bias[0, pad] += pad_bias
        model.final_logits_bias.copy_(bias)
        if eos_position is not None:  # EOS's row along the positions' sinusoid at step p
            step, scale = eos_position
            table = model.model.decoder.embed_positions.weight
            model.model.shared.weight[config.eos_token_id] = scale * table[step]
    model.generation_config = transformers.GenerationConfig(
        **{
            "bad_words_ids": [[pad]],
            "decoder_start_token_id": pad,
            "eos_token_id": 0,
            "forced_eos_token_id": 0,
            "pad_token_id": pad,
            "max_length": 12,
            "num_beams": 4,
            "renormalize_logits": True,
            **(generation or {}),
        }
    )
    model.save_pretrained(str(directory))
    return model


def edited_copy(directory: pathlib.Path, target: pathlib.Path, *, config=None, tensors=None):
    """A copy of the checkpoint in `directory` written to `target`, its config.json dict passed
    through `config` and its tensors (a dict of numpy arrays) through `tensors` when given."""
    import json

    from safetensors import numpy as safetensors_numpy

    hf_config = json.loads((directory / "config.json").read_text())
    weights = safetensors_numpy.load_file(str(directory / "model.safetensors"))
    (target / "config.json").write_text(json.dumps(config(hf_config) if config else hf_config))
    safetensors_numpy.save_file(
        tensors(weights) if tensors else weights, str(target / "model.safetensors")
    )
    return target


def load_error(directory: pathlib.Path, **kwargs) -> str:
    """The one-line error `pretrained.load_params(directory, **kwargs)` must raise."""
    with pytest.raises(errors.UserError) as info:
        pretrained.load_params(directory, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


def assert_same_weights(reloaded: torch.nn.Module, original: torch.nn.Module) -> None:
    """Every tensor of `original`'s state dict equals `reloaded`'s, exactly (export round trips)."""
    for name, value in original.state_dict().items():
        np.testing.assert_array_equal(
            reloaded.state_dict()[name].numpy(), value.numpy(), err_msg=name
        )
