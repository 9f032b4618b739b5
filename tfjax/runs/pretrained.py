"""Pretrained checkpoints and workdirs: convert one into the other, and start a run from one.

    convert(hf_dir, workdir, config)   # an ordinary tfjax workdir: config.json, the tokenizer,
                                        # a checkpoint at step 0 (`experiments.convert`)
    export(workdir, out_dir)            # its latest checkpoint as a Hugging Face directory
    initial_params(config, run)         # `train.init_from`: a converted (or any) workdir, or a
                                        # Hugging Face directory, as a new run's parameters

A converted workdir keeps the checkpoint's tokenizer (`data.tokenizer="pretrained"`, in
`hf_tokenizer/`) and its config.json (`hf_config.json`, what `export` writes back). Its
`model` group is the converted `ModelConfig`; the other groups come from the config it is
given (`configs/pretrained.py`), so `experiments.generate`, `evaluate`, `translate` and
`train` read it like any workdir.
"""

import copy
import dataclasses
import json
import pathlib
import shutil
from collections.abc import Collection
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from tfjax import errors, models, pretrained
from tfjax.data import datasets, pretrained_tokenizer
from tfjax.models import kinds
from tfjax.runs import build, trained, validation, workdir_format
from tfjax.training import checkpointing, steps

HF_CONFIG_FILE = "hf_config.json"  # the converted checkpoint's config.json
# Model fields a run started from a pretrained model may set its own way.
RUN_FIELDS = ("model.dropout_rate", "model.attention_dropout_rate", *workdir_format.LAYOUT_KEYS)
RUN_FIELDS += ("model.dtype", "model.param_dtype", "model.attention_impl")


def converted_config(
    config: ml_collections.ConfigDict, model_config: models.ModelConfig
) -> ml_collections.ConfigDict:
    """`config` with the converted model as its `model` group and the checkpoint's tokenizer."""
    config = copy.deepcopy(config)
    with config.unlocked():
        config.model = dataclasses.asdict(model_config)
    config.data.tokenizer = "pretrained"
    return config


def data_lengths(
    config: ml_collections.ConfigDict,
    model_config: models.ModelConfig,
    limit: int,
    explicit: Collection[str] = (),
) -> dict[str, int]:
    """The data length limits of a run of a converted checkpoint that reads `limit` tokens at
    most (`length_limit` of its family), as {"data.max_source_len": n, ...}.

    An encoder-decoder (a translation model) takes `limit` for source and target, so that
    `translate` and `evaluate` read what the checkpoint reads rather than cutting longer
    sources at a preset's limit. A language model or encoder keeps the preset's length, a
    training window or example length, lowered to `limit` where longer. Keys in `explicit`
    keep the config's value (`validation.check_config` refuses one longer than a learned table).
    """
    lengths = {}
    kind = kinds.get(model_config.kind)
    for key in kind.lengths:
        name = f"data.{key}"
        value = config.data[key]
        if name not in explicit:
            value = limit if kind.facade == "translator" else min(value, limit)
        lengths[name] = value
    return lengths


def convert(
    hf_dir: str | pathlib.Path,
    workdir: str | pathlib.Path,
    config: ml_collections.ConfigDict,
    *,
    head: str | None = None,
    explicit: Collection[str] = (),
) -> ml_collections.ConfigDict:
    """Makes `workdir` an ordinary tfjax workdir holding the checkpoint of `hf_dir`.

    Args:
        hf_dir: a Hugging Face checkpoint directory with its tokenizer.
        workdir: a new (or empty) directory.
        config: the run config (`configs/pretrained.py`); its model group is replaced, and its
            data length limits come from the checkpoint (`data_lengths`).
        head: the head of a family that has several (BERT: "mlm" or "classify").
        explicit: the config keys ("data.max_source_len", ...) the user set: kept as given.

    Returns:
        The config written to `workdir/config.json`.

    Raises:
        tfjax.errors.WorkdirError: if `workdir` already holds a run.
        tfjax.errors.ConversionError, DataError: see `tfjax.pretrained.load`.
    """
    workdir = pathlib.Path(workdir)
    if (workdir / "config.json").exists() or (workdir / "checkpoints").exists():
        raise errors.WorkdirError(f"{workdir} already holds a run: convert into a new directory")
    hf_dir = pathlib.Path(hf_dir)
    model_config, params, tokenizer = pretrained.load(hf_dir, head=head)
    config = converted_config(config, model_config)
    hf_config = pretrained.read_hf_config(hf_dir)
    limit = pretrained.family(hf_config).length_limit(hf_dir, hf_config)
    with config.unlocked():
        config.update_from_flattened_dict(data_lengths(config, model_config, limit, explicit))
    validation.check_config(config)
    workdir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(workdir / datasets.DIRECTORY)
    shutil.copyfile(hf_dir / "config.json", workdir / HF_CONFIG_FILE)
    _write_decoding(hf_dir, workdir)
    run = build.build(config, workdir)
    _save_step0(run, workdir, params)
    workdir_format.write_config_json(workdir, config)
    return config


def _write_decoding(hf_dir: pathlib.Path, workdir: pathlib.Path) -> None:
    """Writes `trained.DECODING_FILE` for families that decode their own way (Marian)."""
    hf_config = pretrained.read_hf_config(hf_dir)
    options = getattr(pretrained.family(hf_config), "decoding_options", None)
    if options is not None:
        text = json.dumps(options(hf_dir, hf_config), indent=2) + "\n"
        (workdir / trained.DECODING_FILE).write_text(text, encoding="utf-8")


def _save_step0(run: build.Run, workdir: pathlib.Path, params: dict) -> None:
    """Writes the checkpoint at step 0: the converted parameters, fresh optimizer moments."""
    params = jax.tree.map(jnp.asarray, params)
    state = steps.TrainState(
        step=jnp.zeros((), jnp.int32), params=params, opt_state=run.optimizer.init(params)
    )
    _, dropout_rng = jax.random.split(jax.random.key(run.config.seed))
    iterator = build.train_iterator(run)  # the loop's, exactly
    with checkpointing.Checkpointer(workdir / "checkpoints") as checkpointer:
        checkpointer.save(
            0,
            run.strategy.checkpoint_state(run.strategy.put_state(state)),
            rng=dropout_rng,
            data_state=iterator.get_state(),
            config=workdir_format.stamped(workdir_format.config_dict(run.config)),
            force=True,
        )


def export(workdir: str | pathlib.Path, out_dir: str | pathlib.Path, *, step: int | None = None):
    """Writes the workdir's checkpoint (latest, or `step`) as a Hugging Face directory.

    Raises:
        tfjax.errors.WorkdirError: for a workdir not converted from a Hugging Face checkpoint.
    """
    workdir = pathlib.Path(workdir)
    if not (workdir / HF_CONFIG_FILE).is_file():
        raise errors.WorkdirError(
            f"{workdir} has no {HF_CONFIG_FILE}: only workdirs made by experiments.convert (or "
            "trained from one with train.init_from) export to Hugging Face"
        )
    hf_config = json.loads((workdir / HF_CONFIG_FILE).read_text(encoding="utf-8"))
    restored = trained.load(workdir, step=step)
    tokenizer = restored.tokenizer
    pretrained.save(
        out_dir,
        restored.run.model_config,
        restored.params,
        hf_config=hf_config,
        tokenizer=tokenizer
        if isinstance(tokenizer, pretrained_tokenizer.PretrainedTokenizer)
        else None,
    )
    return restored.step


def is_hf_dir(path: pathlib.Path) -> bool:
    """Whether `path` is a Hugging Face checkpoint directory rather than a tfjax workdir."""
    return (path / "config.json").is_file() and not (path / "checkpoints").exists()


def prepare_workdir(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> None:
    """For a run with `train.init_from`: copies the tokenizer and `hf_config.json` it needs.

    Raises:
        tfjax.errors.ConfigError: for an `init_from` that is neither a workdir nor a checkpoint.
    """
    source = pathlib.Path(config.train.init_from)
    if not (source / "config.json").is_file():
        raise errors.ConfigError(
            f"train.init_from={str(source)!r} is neither a tfjax workdir nor a Hugging Face "
            "checkpoint directory (no config.json)"
        )
    hf = is_hf_dir(source)
    hf_config = source / ("config.json" if hf else HF_CONFIG_FILE)
    if hf_config.is_file() and not (workdir / HF_CONFIG_FILE).exists():
        shutil.copyfile(hf_config, workdir / HF_CONFIG_FILE)
    decoding = trained.DECODING_FILE
    if hf and not (workdir / decoding).exists():
        _write_decoding(source, workdir)
    elif (source / decoding).is_file() and not (workdir / decoding).exists():
        shutil.copyfile(source / decoding, workdir / decoding)
    target = workdir / datasets.DIRECTORY
    if config.data.tokenizer != "pretrained" or target.exists():
        return
    if hf:
        pretrained.load_tokenizer(source).save(target)
    elif (source / datasets.DIRECTORY).is_dir():
        shutil.copytree(source / datasets.DIRECTORY, target)


def initial_params(config: ml_collections.ConfigDict, run: build.Run) -> Any:
    """The parameters `train.init_from` names, for the model of `run`.

    A tfjax workdir gives its latest checkpoint's parameters (its model group must be this
    run's, up to `RUN_FIELDS`); a Hugging Face directory its converted weights.

    Raises:
        tfjax.errors.CheckpointError: for a workdir with another model, or no checkpoint.
        tfjax.errors.ConversionError: for a checkpoint of another architecture.
    """
    source = pathlib.Path(config.train.init_from)
    current = workdir_format.config_dict(run.config)
    if is_hf_dir(source):
        model_config, params = pretrained.load_params(
            source, head=pretrained.head_of(run.model_config)
        )
        saved = {"model": dataclasses.asdict(model_config)}
        workdir_format.check_resumable(saved, current, sections=("model",), ignore=RUN_FIELDS)
        return params
    saved_config = workdir_format.load_config_json(source / "config.json")
    saved = workdir_format.config_dict(saved_config)
    workdir_format.check_resumable(saved, current, sections=("model",), ignore=RUN_FIELDS)
    optimizer, _ = build.make_optimizer(saved_config, run.model_config)
    shapes = datasets.train_row_shapes(
        datasets.DataConfig(**saved_config.data),
        kinds.get(run.model_config.kind),
        run.model_config.encoder_head,
    )
    sample = {k: jnp.zeros((1, *s), jnp.int32) for k, s in shapes.items()}  # shapes only
    abstract = build.abstract_train_state(run.model, optimizer, sample, run.model_config.kind)
    with checkpointing.Checkpointer(source / "checkpoints") as checkpointer:
        restored = checkpointer.restore(
            abstract, convert=workdir_format.layout_conversion(run.model_config)
        )
    if restored is None:
        raise errors.CheckpointError(
            f"train.init_from={str(source)!r} holds no checkpoint to start from"
        )
    return restored.state.params
