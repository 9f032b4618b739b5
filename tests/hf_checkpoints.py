"""Tiny random Hugging Face checkpoints, written locally for the pretrained-model tests.

Each builder makes a tokenizer from a few sentences (no download), a model of a tiny config
with random weights (norm scales and biases perturbed too, so that a wrong norm or bias mapping
shows), and writes both with `save_pretrained` into a directory. Imported by the tests only
after `pytest.importorskip("transformers")`.
"""

import pathlib

import torch
import transformers

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
