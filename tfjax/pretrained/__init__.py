"""Pretrained Hugging Face checkpoints as tfjax models, and tfjax models back as checkpoints.

    from tfjax import models, pretrained
    config, params, tokenizer = pretrained.load("checkpoints/gpt2")   # a local directory
    logits = models.create_model(config).apply({"params": params}, targets)
    pretrained.save("exported/gpt2", config, params, hf_config=pretrained.read_hf_config(...))

A checkpoint directory is what `save_pretrained` (or `hf download REPO --local-dir DIR`)
writes: `config.json`, the weights (`model.safetensors`, shards, or `pytorch_model.bin`) and the
tokenizer's files. Nothing is downloaded. Each family has one module with its `ModelConfig`
mapping and its explicit weight table (`checkpoint.Entry` rows): `gpt2` (decoder-only), `bert`
(encoder-only, masked-LM or classification head; BertForPreTraining loads as masked-LM), `t5`
(encoder-decoder, v1.0 and v1.1), `marian` (encoder-decoder translation, OPUS-MT). The
conversion checks every tensor: a checkpoint of another architecture, a missing, unknown or
misshapen tensor, or a config option the model cannot compute is a one-line
`tfjax.errors.ConversionError` naming it; a tokenizer whose size does not fit the model's
embedding table (the tokenizer's files missing, or another checkpoint's) a `DataError`
(`load_tokenizer`). Each family also gives the longest sequence its checkpoint reads
(`length_limit(directory, hf_config)`). `transformers` is needed for the tokenizer and
`safetensors` for the weights (the `hf` extra); torch only for `pytorch_model.bin`.
"""

import pathlib
import re
from types import ModuleType

import jax
import jax.numpy as jnp
import numpy as np

from tfjax import errors, models
from tfjax.data import pretrained_tokenizer
from tfjax.models import kinds
from tfjax.nn import stacking
from tfjax.pretrained import bert, checkpoint, gpt2, marian, t5

FAMILIES: dict[str, ModuleType] = {m.MODEL_TYPE: m for m in (gpt2, bert, t5, marian)}

read_hf_config = checkpoint.read_config


def family(hf_config: dict, expected: str | None = None) -> ModuleType:
    """The family module of a config.json (checked to be `expected` when given).

    Raises:
        tfjax.errors.ConversionError: for a model_type tfjax does not convert, or not `expected`.
    """
    model_type = hf_config.get("model_type")
    if expected is not None and model_type != expected:
        raise errors.ConversionError(
            f"the checkpoint is a {model_type!r} model, not {expected!r}: pass a {expected} "
            "checkpoint directory"
        )
    if model_type not in FAMILIES:
        raise errors.ConversionError(
            f"model_type {model_type!r} is not one tfjax converts (supported: "
            f"{', '.join(FAMILIES)})"
        )
    return FAMILIES[model_type]


def model_config(hf_config: dict, *, head: str | None = None) -> models.ModelConfig:
    """The tfjax `ModelConfig` of a config.json (see the family modules)."""
    return family(hf_config).model_config(hf_config, head)


def abstract_params(config: models.ModelConfig) -> dict:
    """The model's parameters as `jax.ShapeDtypeStruct`s (nothing is allocated)."""
    model = models.create_model(config)
    row = jax.ShapeDtypeStruct((1, 1), jnp.int32)
    args = (row,) * len(kinds.get(config.kind).fields)  # one row per positional argument
    init = lambda *a: model.init(jax.random.key(0), *a)  # noqa: E731
    return jax.eval_shape(init, *args)["params"]


def _names(tensors: dict, fam: ModuleType) -> dict:
    """Names without the head model's prefix ("transformer.", "bert.", "model."), in today's
    spelling (`fam.rename`)."""
    rename = getattr(fam, "rename", lambda name: name)
    return {rename(name.removeprefix(fam.PREFIX)): value for name, value in tensors.items()}


def load_params(
    directory: str | pathlib.Path, *, head: str | None = None, family_name: str | None = None
) -> tuple[models.ModelConfig, dict]:
    """(ModelConfig, parameters as float32 jax arrays) of a checkpoint directory.

    Args:
        directory: the checkpoint.
        head: for families with several heads (BERT: "mlm" or "classify"); None: the one
            config.json's `architectures` names.
        family_name: refuse a checkpoint whose model_type is not this.

    Raises:
        FileNotFoundError: for a missing directory, config.json or weights file.
        tfjax.errors.ConversionError: see the module docstring.
    """
    directory = pathlib.Path(directory)
    hf = checkpoint.read_config(directory)
    fam = family(hf, family_name)
    config = fam.model_config(hf, head)
    tensors = _names(checkpoint.read_tensors(directory), fam)
    where = str(directory)
    tied = fam.tied(config) if hasattr(fam, "tied") else fam.TIED  # T5: by the config
    checkpoint.drop_tied_and_buffers(tensors, tied, fam.BUFFERS, where)
    checkpoint.drop_unused(tensors, getattr(fam, "unused", lambda c: {})(config), where)
    expected = checkpoint.flat_shapes(abstract_params(config))
    params = checkpoint.to_params(tensors, fam.table(config), expected, where=where)
    checkpoint.check_all_used(tensors, where, fam.MODEL_TYPE)
    return config, jax.tree.map(jnp.asarray, params)


def load(
    directory: str | pathlib.Path, *, head: str | None = None
) -> tuple[models.ModelConfig, dict, pretrained_tokenizer.PretrainedTokenizer]:
    """(ModelConfig, parameters, tokenizer) of a checkpoint directory with its tokenizer.

    Raises:
        As `load_params`; tfjax.errors.DataError when the directory has no tokenizer, or one
        whose vocabulary does not fit the model's (`load_tokenizer`).
    """
    config, params = load_params(directory, head=head)
    return config, params, load_tokenizer(directory)


# A table may have more rows than its tokenizer has ids: the padding up to a multiple of this
# (T5's 32,100 ids in 32,128 rows). Other gaps mean the tokenizer is not the model's.
VOCAB_PADDING_MULTIPLE = 128


def load_tokenizer(directory: str | pathlib.Path) -> pretrained_tokenizer.PretrainedTokenizer:
    """The tokenizer of a checkpoint directory, checked against config.json's `vocab_size`.

    Its size must equal the model's embedding rows, or be smaller by the padding up to a
    multiple of `VOCAB_PADDING_MULTIPLE` only. Anything else is another tokenizer: the one
    `transformers` (>= 5) makes up from config.json alone when the tokenizer's files are
    missing (a T5 tokenizer of `<pad>`, `</s>`, `<unk>` and 100 sentinels), or another
    checkpoint's, which would read every word as other ids (or <unk>).

    Raises:
        FileNotFoundError, tfjax.errors.ConversionError: for the directory or its config.json.
        tfjax.errors.DataError: for a directory without a usable tokenizer, or whose
            tokenizer's size does not fit the model's, naming both sizes and the files to copy.
    """
    directory = pathlib.Path(directory)
    hf = checkpoint.read_config(directory)
    fam = family(hf)
    tokenizer = pretrained_tokenizer.PretrainedTokenizer.load(directory)
    rows, size = hf["vocab_size"], tokenizer.vocab_size
    padded = -(-size // VOCAB_PADDING_MULTIPLE) * VOCAB_PADDING_MULTIPLE
    if not size <= rows <= padded:
        raise errors.DataError(
            f"{directory}: the tokenizer has {size} ids but the {fam.MODEL_TYPE} model's "
            f"embedding table has {rows} rows (config.json vocab_size), so it is not the "
            "checkpoint's tokenizer (are its files missing?): copy the checkpoint's tokenizer "
            f"files ({' / '.join(fam.TOKENIZER_FILES)}) into {directory}"
        )
    return tokenizer


def save(
    directory: str | pathlib.Path,
    config: models.ModelConfig,
    params: dict,
    *,
    hf_config: dict,
    tokenizer: pretrained_tokenizer.PretrainedTokenizer | None = None,
) -> None:
    """Writes a checkpoint directory `transformers` loads: config.json, model.safetensors and
    (given one) the tokenizer's files.

    Args:
        directory: where to write (created if needed).
        config, params: the tfjax model (parameters as a tree of arrays, not under "params").
        hf_config: the config.json the model was converted from; its architecture must be the
            one `config` describes (fine-tuning changes weights, not shapes).
        tokenizer: written beside the weights when given.

    Raises:
        tfjax.errors.ConversionError: when `config` is not the architecture of `hf_config`.
    """
    fam = family(hf_config)
    _check_same_architecture(config, fam.model_config(hf_config, head_of(config)))
    hf_config = getattr(fam, "export_config", lambda h, c: h)(hf_config, config)
    params = jax.device_get(params)
    if config.scan_layers:  # the table names unscanned layers
        params = stacking.convert_layout(params, scan=False)
    tensors = checkpoint.to_tensors(params, fam.table(config))
    prefix = fam.PREFIX if _prefixed(hf_config, fam) else ""
    unprefixed = getattr(fam, "UNPREFIXED", ())  # head tensors outside the prefixed model
    tensors = {
        ("" if name.startswith(unprefixed) else prefix) + name: np.asarray(value)
        for name, value in tensors.items()
    }
    checkpoint.write(pathlib.Path(directory), dict(hf_config), tensors)
    if tokenizer is not None:
        tokenizer.save(directory)


def head_of(config: models.ModelConfig) -> str | None:
    """The head of an encoder-only model ("mlm", "classify"); None for the other kinds (those
    without `kinds.ModelKind.heads`)."""
    return config.encoder_head if kinds.get(config.kind).heads else None


def _prefixed(hf_config: dict, fam: ModuleType) -> bool:
    """Whether the architecture's weights carry the family prefix (a head model's do)."""
    architectures = hf_config.get("architectures") or []
    return any(re.search(fam.PREFIXED_ARCHITECTURES, a) for a in architectures)


# Fields a fine-tuning run may change without changing the architecture.
_RUN_FIELDS = (
    "dropout_rate",
    "attention_dropout_rate",
    "attention_impl",
    "dtype",
    "param_dtype",
    "scan_layers",
    "remat",
)


def _check_same_architecture(config: models.ModelConfig, converted: models.ModelConfig) -> None:
    for field in config.__dataclass_fields__:
        if field in _RUN_FIELDS:
            continue
        if getattr(config, field) != getattr(converted, field):
            raise errors.ConversionError(
                f"ModelConfig.{field}={getattr(config, field)!r}, but the checkpoint's "
                f"config.json gives {getattr(converted, field)!r}: export writes the "
                "architecture it was converted from"
            )
