"""A run built from its config, and restored from its workdir.

`build(config, workdir)` turns a resolved config into a `Run`: the model, the tokenized
examples, the parallel strategy, the compiled train and eval steps and the abstract train state.
`restore(config, workdir)` adds the parameters of a checkpoint. `load_config_json` reads the
`config.json` a run keeps in its workdir (`provenance.write_config_json` writes it). The training
loop (`tfjax.runs.trainer`) and the decoding tools (`tfjax.runs.trained`) both start here.
Checkpoints written with the other `model.scan_layers` layout, or with the former Muon optimizer
state, are converted as they are read (`layout_conversion`).
"""

import copy
import dataclasses
import functools
import json
import math
import os
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from tfjax import errors, models
from tfjax.data import datasets, pipeline, tokenizers, workdir_tokenizer
from tfjax.inference import decoding
from tfjax.models import kinds, partitioning
from tfjax.nn import stacking
from tfjax.parallel import distributed, layout, strategies
from tfjax.runs import provenance
from tfjax.training import checkpointing, mlm, muon, optim, profiling, steps


@dataclasses.dataclass
class Run:
    """Everything the loop needs, built once from the config."""

    config: ml_collections.ConfigDict
    model_config: models.ModelConfig
    model: Any
    examples: datasets.Examples
    strategy: Any
    train_step: Any
    eval_step: Any
    abstract_state: Any
    optimizer: Any
    greedy: Any  # jitted (params, inputs, segment_ids) -> [B, L] ids, seq2seq runs only


# JSON-safe nested dict of a config; defined beside `provenance.write_config_json`, which
# writes it, and kept here for its many callers.
config_dict = provenance.config_dict


# Model settings a checkpoint may differ in from the run that restores it: they change how the
# same numbers are computed (remat) or laid out (scan_layers, converted by `layout_conversion`).
LAYOUT_KEYS = ("model.scan_layers", "model.remat")
# Field defaults of the config groups a checkpoint must match (`checkpointing.check_compatible`),
# and of `optim`: what `load_config_dict` gives the fields an older config.json lacks.
SECTION_DEFAULTS = {
    "model": dataclasses.asdict(models.ModelConfig()),
    "data": dataclasses.asdict(datasets.DataConfig()),
    "optim": dataclasses.asdict(optim.OptimConfig()),
}


def layout_conversion(model_config: models.ModelConfig) -> checkpointing.ConvertFn:
    """For `Checkpointer.restore`: converts a step saved with the other `scan_layers` layout,
    or with the former hand-written Muon's optimizer state, or both.

    The state's parameters and optimizer moments are stacked or unstacked along the layer axis
    (`stacking.stack_layers`); checkpoints from before `scan_layers` existed are unscanned.
    Muon states are mapped by `muon.to_legacy_state` / `muon.from_legacy_state`.
    """

    def convert(saved_config: dict, saved_keys) -> checkpointing.Conversion | None:
        saved_scan = bool(saved_config["model"].get("scan_layers", False))  # absent: older run
        restack = saved_scan != model_config.scan_layers
        legacy_muon = muon.has_legacy_state(saved_keys)
        if not (restack or legacy_muon):
            return None

        def to_saved(state):
            if restack:
                state = stacking.convert_layout(state, scan=saved_scan)
            return muon.to_legacy_state(state) if legacy_muon else state

        def from_saved(state):
            if legacy_muon:
                state = muon.from_legacy_state(state)
            if restack:
                state = stacking.convert_layout(state, scan=model_config.scan_layers)
            return state

        return checkpointing.Conversion(to_saved=to_saved, from_saved=from_saved)

    return convert


def load_config_json(path: str | os.PathLike) -> ml_collections.ConfigDict:
    """A run's resolved config as written to `workdir/config.json` before step 0, locked.

    Every reader of a workdir's config.json comes here (the decoding tools, `experiments.train
    --config=W/config.json`, `train.init_from`, sweeps).

    Raises:
        FileNotFoundError: for a missing file.
        tfjax.errors.ConfigError: for a file that is not a JSON object (damaged, cut short or
            mistyped), with the way to repair it.
    """
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {path.parent} a tfjax workdir?")
    try:
        tree = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:  # json.JSONDecodeError or UnicodeDecodeError
        raise errors.ConfigError(f"{path} is not valid JSON: {err}; {_repair(path)}") from err
    if not isinstance(tree, dict):
        raise errors.ConfigError(f"{path} is not a JSON object of config groups; {_repair(path)}")
    tree.pop(provenance.TOKENIZER_RECORD, None)  # the workdir's tokenizer, not a setting
    return load_config_dict(tree)


def saved_steps(workdir: str | os.PathLike) -> list[int]:
    """The steps of the workdir's checkpoint directories, ascending (damaged ones included;
    those moved aside as `<step>.corrupt` not), without opening them."""
    directory = pathlib.Path(workdir) / "checkpoints"
    return sorted(int(p.name) for p in directory.glob("*") if p.name.isdigit() and p.is_dir())


def _repair(path: pathlib.Path) -> str:
    """How to repair a damaged config.json: from the copy its newest checkpoint keeps."""
    newest = checkpointing.newest_config(path.parent / "checkpoints")
    if newest is not None:
        return f"each checkpoint keeps a copy of it: cp {newest[0]} {path}"
    return "repair it by hand (it holds the run's resolved config)"


def load_config_dict(tree: dict) -> ml_collections.ConfigDict:
    """A run's config from the JSON dict of `config_dict` (e.g. one saved in a checkpoint),
    locked; fields newer than the run get the values it had."""
    config = ml_collections.ConfigDict(tree)
    for key, value in _PARALLEL_SINCE_TENSOR.items():  # runs from before tensor parallelism
        if "parallel" in config and key not in config.parallel:
            config.parallel[key] = value
    for key, value in _TRAIN_SINCE.items():
        if "train" in config and key not in config.train:
            config.train[key] = value
    for section, defaults in SECTION_DEFAULTS.items():  # options added since: off by default
        if section in config:
            for key, value in defaults.items():
                if key not in config[section]:
                    config[section][key] = value
    config.lock()
    return config


# `parallel` fields newer than some workdirs' config.json, with the values those runs had.
_PARALLEL_SINCE_TENSOR = {"tensor": 1, "rules": layout.DEFAULT_RULES}
# `train` fields newer than some workdirs' config.json (init_from, masked-LM training, -EOS
# training, profiling), with the values those runs had.
_TRAIN_SINCE = {
    "init_from": "",
    "mlm_rate": 0.15,
    "predict_eos": True,
    "final_eval_examples": 0,
    "profile_steps": (),
}


# Fields of the `train` group that must be >= 1 (0 would divide by zero in the loop) or >= 0.
_TRAIN_POSITIVE = (
    "global_batch_size",
    "eval_batch_size",
    "log_every_steps",
    "checkpoint_every_steps",
    "keep_checkpoints",
)
_TRAIN_NON_NEGATIVE = (
    "num_train_steps",
    "eval_every_steps",
    "max_eval_examples",
    "final_eval_examples",
)


def check_config(config: ml_collections.ConfigDict) -> None:
    """Refuses a config the run cannot use, before any data is read or anything written.

    Builds the `data`, `model` and `optim` dataclasses (whose checks name the field and the
    allowed values) and checks the `train` and `parallel` groups. Touches no device, so it may
    run before `tfjax.training.host.tune_glibc_malloc`.

    Raises:
        tfjax.errors.ConfigError: naming the key, its value and what it may be.
    """
    datasets.DataConfig(**config.data)
    vocab_size = config.model.vocab_size or 2  # 0: the tokenizer's size, known after the data
    models.ModelConfig(**{**config.model.to_dict(), "vocab_size": vocab_size})
    optim_config(config)
    _check_positions(config)
    for field in _TRAIN_POSITIVE + _TRAIN_NON_NEGATIVE:
        value, least = config.train[field], int(field in _TRAIN_POSITIVE)
        if not isinstance(value, int) or value < least:
            raise errors.ConfigError(f"train.{field} must be an integer >= {least}, got {value!r}")
    if not 0 <= config.train.label_smoothing < 1:
        raise errors.ConfigError(
            f"train.label_smoothing must be in [0, 1), got {config.train.label_smoothing}"
        )
    profiling.check_steps(config.train.profile_steps)
    if not 0 < config.train.mlm_rate < 1:
        raise errors.ConfigError(f"train.mlm_rate must be in (0, 1), got {config.train.mlm_rate}")
    if not config.train.predict_eos and kinds.get(config.model.kind).scores != "targets":
        raise errors.ConfigError(
            "train.predict_eos=False is for models that generate "
            f"({', '.join(kinds.names(scores='targets'))}); drop it for this "
            f"{config.model.kind} run"
        )
    if config.parallel.mode not in strategies.MODES:
        raise errors.ConfigError(
            f"parallel.mode={config.parallel.mode!r} is not one of {strategies.MODES}"
        )
    for field in ("initialization_timeout_seconds", "heartbeat_timeout_seconds"):
        value = config.parallel[field]
        if not isinstance(value, int) or value < 1:
            raise errors.ConfigError(f"parallel.{field} must be an integer >= 1, got {value!r}")
    _check_layout(config)


def _check_positions(config: ml_collections.ConfigDict) -> None:
    """A learned position table (`model.positional="learned"`) must have a row for every
    position of the data: the model would otherwise clip the positions past it to its last
    row inside compiled code, where nothing can be checked.

    Raises:
        tfjax.errors.ConfigError: naming the data length, the table's size and the fix.
    """
    model = config.model
    if model.positional != "learned":
        return
    for key in kinds.get(model.kind).lengths:  # the longest row (or packed segment) of a stack
        length = config.data[key]
        if length > model.max_len:
            raise errors.ConfigError(
                f"data.{key}={length} is longer than the model's learned position table "
                f"(model.max_len={model.max_len} positions): set data.{key} <= {model.max_len}"
            )


def _check_layout(config: ml_collections.ConfigDict) -> None:
    """The mesh sizes and `parallel.rules`, and, in mode "sharded" with fsdp or tensor > 1, that
    every parameter of the model gets a layout that divides (shapes from `jax.eval_shape`:
    nothing is allocated)."""
    parallel = config.parallel
    for axis in strategies.MESH_AXES[1:]:
        if not isinstance(parallel[axis], int) or parallel[axis] < 1:
            raise errors.ConfigError(
                f"parallel.{axis} must be an integer >= 1, got {parallel[axis]!r}"
            )
    rules = layout.check_rules(parallel.rules, partitioning.LOGICAL_AXES)
    if parallel.mode != "sharded":
        for axis in strategies.MESH_AXES[1:]:
            if parallel[axis] != 1:
                raise errors.ConfigError(
                    f"parallel.{axis}={parallel[axis]} needs --config.parallel.mode=sharded"
                )
        return
    sizes = {axis: parallel[axis] for axis in strategies.MESH_AXES[1:]}
    if all(size == 1 for size in sizes.values()):
        return  # plain data parallelism: every parameter is replicated, nothing to divide
    # 0: the tokenizer's size, known after the data; a stand-in every mesh axis divides.
    vocab_size = config.model.vocab_size or 2 * math.prod(sizes.values())
    params = abstract_params(make_model_config(config, vocab_size))
    axes = partitioning.logical_axes(params)
    jax.tree_util.tree_map_with_path(
        lambda path, x, names: layout.param_spec(
            jax.tree_util.keystr(path, simple=True, separator="/"),
            tuple(x.shape),
            names,
            rules,
            sizes,
            strategies.FSDP_MIN_SIZE,
        ),
        params,
        axes,
    )


def abstract_params(model_config: models.ModelConfig) -> Any:
    """The model's parameters as `jax.ShapeDtypeStruct`s, from a one-token-row sample."""
    model = models.create_model(model_config)
    row = jax.ShapeDtypeStruct((1, 1), jnp.int32)  # a shape, not an array: no device touched
    args, kwargs = steps.model_inputs({"inputs": row, "targets": row}, model_config.kind)
    init = lambda *a, **k: model.init(jax.random.key(0), *a, **k)  # noqa: E731
    return jax.eval_shape(init, *args, **kwargs)["params"]


def optim_config(config: ml_collections.ConfigDict) -> optim.OptimConfig:
    """`OptimConfig(**config.optim)`; cosine `decay_steps` 0 = the whole run, in updates."""
    fields = config.optim.to_dict()
    if fields["schedule"] == "cosine" and not fields["decay_steps"]:
        # 0 = decay over the whole run, counted in applied updates.
        fields["decay_steps"] = config.train.num_train_steps // fields["grad_accum_steps"]
    return optim.OptimConfig(**fields)


def load_examples(
    config: ml_collections.ConfigDict, workdir: pathlib.Path, trained: bool | None = None
) -> datasets.Examples:
    """The run's examples; the tokenizer is built and saved by process 0 alone.

    The other processes of a multi-process run wait for it, then read the saved one (a shared
    workdir) or build the same one from the same data (a workdir on each host's own disk).
    Once the workdir holds checkpoints, its tokenizer is theirs: it must be there, is never
    built again, and must have the SHA-256 config.json records (`provenance`). Every process
    checks that before process 0 may write anything, so a bad tokenizer stops all of them
    alike, not process 0 alone while the others wait for it. `trained`: whether checkpoints
    were trained with the workdir's tokenizer (default: whether `workdir` holds any; a
    vectorised sweep keeps its trials' checkpoints elsewhere).
    """
    trained = bool(saved_steps(workdir)) if trained is None else trained
    expected = provenance.recorded_sha256(workdir, config.data.tokenizer) if trained else None
    load = functools.partial(
        datasets.load,
        datasets.DataConfig(**config.data),
        kinds.get(config.model.kind),
        seed=config.seed,
        workdir=workdir,
        encoder_head=config.model.encoder_head,
        trained=trained,
        tokenizer_sha256=expected,
    )
    if jax.process_count() > 1:  # read only: process 0 writes a new tokenizer after the barrier
        workdir_tokenizer.load(
            config.data.tokenizer, workdir, trained=trained, expected_sha256=expected
        )
        distributed.barrier("tfjax_tokenizer_checked")
    chief = jax.process_index() == 0
    examples = load() if chief else None
    distributed.barrier("tfjax_tokenizer_saved")
    return examples if chief else load(save_tokenizer=False)


def build(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> Run:
    """The run of `config`; with the tokenizer saved in `workdir` no data is read here (the
    examples' splits are read when first used, `datasets.Examples.deferred`)."""
    examples = load_examples(config, workdir)
    model_config = make_model_config(config, examples.tokenizer.vocab_size)
    model = models.create_model(model_config)
    optimizer, schedule = make_optimizer(config, model_config)
    strategy = make_strategy(config)
    abstract_state = abstract_train_state(model, optimizer, sample_batch(config), model_config.kind)
    masking = make_masking(config, examples.tokenizer)
    eos_id = examples.tokenizer.eos_id
    train_step = make_train_step(config, model, optimizer, schedule, masking, eos_id)
    eval_step = jax.jit(
        steps.make_eval_step(
            model,
            kind=model_config.kind,
            label_smoothing=config.train.label_smoothing,
            masking=masking,
            unscored_id=unscored_id(config, eos_id),
        )
    )
    return Run(
        config,
        model_config,
        model,
        examples,
        strategy,
        strategy.compile_train_step(train_step, abstract_state),
        eval_step,
        abstract_state,
        optimizer,
        make_greedy(model, config.data.max_target_len, examples.tokenizer.eos_id),
    )


def train_iterator(run: Run) -> pipeline.BatchIterator:
    """This process's rows of every global training batch (all of them in one process)."""
    global_batch_size = run.config.train.global_batch_size
    dataset = pipeline.make_host_dataset(
        run.examples.train,
        global_batch_size=global_batch_size,
        rows=run.strategy.host_rows(global_batch_size),
        seed=run.config.seed,
    )
    return pipeline.BatchIterator(dataset)


# The pieces of `build` that need no data: ahead-of-time planning (`tfjax.runs.plan`) builds
# the same model, optimizer, step and strategy from them, so it plans what training runs.


def sample_batch(config: ml_collections.ConfigDict) -> dict[str, np.ndarray]:
    """A batch of one training row, int32 zeros [1, ...] on the host, of the shapes
    `datasets.train_row_shapes` gives: what the abstract train state needs, no data read."""
    rows = datasets.train_row_shapes(
        datasets.DataConfig(**config.data),
        kinds.get(config.model.kind),
        config.model.encoder_head,
    )
    return {key: np.zeros((1, *shape), np.int32) for key, shape in rows.items()}


def make_model_config(
    config: ml_collections.ConfigDict, tokenizer_vocab_size: int
) -> models.ModelConfig:
    """`ModelConfig(**config.model)`; `model.vocab_size` 0 takes the tokenizer's size."""
    fields = config.model.to_dict()
    fields["vocab_size"] = fields["vocab_size"] or tokenizer_vocab_size
    return models.ModelConfig(**fields)


def make_optimizer(config: ml_collections.ConfigDict, model_config: models.ModelConfig):
    """(optimizer, schedule) of `config.optim` (`tfjax.training.optim.make_optimizer`)."""
    return optim.make_optimizer(optim_config(config), model_config.embed_dim)


def make_strategy(config: ml_collections.ConfigDict, devices=None):
    """The strategy of `config.parallel` over `devices` (default: the job's devices); mode
    "sharded" lays parameters out by their logical axes (`tfjax.models.partitioning`)."""
    parallel = config.parallel
    return strategies.create(
        parallel.mode,
        fsdp=parallel.fsdp,
        tensor=parallel.tensor,
        rules=parallel.rules,
        logical_axes=partitioning.state_axes,
        devices=devices,
    )


def make_masking(config: ml_collections.ConfigDict, tokenizer=None) -> mlm.Masking | None:
    """The masking of a masked-LM run (`model.encoder_head="mlm"`), else None; without a
    `tokenizer` (planning ahead of the data) a stand-in that masks the same shapes.

    Raises:
        tfjax.errors.ConfigError: for a tokenizer without a mask token.
    """
    if kinds.get(config.model.kind).example_format(config.model.encoder_head) != datasets.MLM:
        return None
    if tokenizer is None:
        return mlm.Masking(mask_id=1, vocab_size=2, special_ids=(0,), rate=config.train.mlm_rate)
    return mlm.masking_for(tokenizer, config.train.mlm_rate)


def unscored_id(config: ml_collections.ConfigDict, eos_id: int = tokenizers.EOS_ID) -> int | None:
    """The target id the steps leave out of the loss: `eos_id` when `train.predict_eos` is
    False (a "-EOS" model), else None."""
    return None if config.train.predict_eos else eos_id


def make_train_step(
    config: ml_collections.ConfigDict,
    model,
    optimizer,
    schedule,
    masking=None,
    eos_id: int = tokenizers.EOS_ID,
):
    """The pure train step of `config` (`tfjax.training.steps.make_train_step`), not compiled;
    `masking` for a masked-LM run (default: `make_masking`'s stand-in); `eos_id`, the
    tokenizer's, is left out of the loss when `train.predict_eos` is False (`unscored_id`)."""
    return steps.make_train_step(
        model,
        optimizer,
        schedule,
        kind=config.model.kind,
        label_smoothing=config.train.label_smoothing,
        grad_accum_steps=config.optim.grad_accum_steps,
        masking=masking or make_masking(config),
        unscored_id=unscored_id(config, eos_id),
    )


def abstract_train_state(model, optimizer, sample: dict, kind: str) -> steps.TrainState:
    """The train state as `jax.ShapeDtypeStruct`s (`jax.eval_shape`: nothing is allocated);
    `sample` is a batch (arrays or `ShapeDtypeStruct`s) that only provides shapes."""
    return jax.eval_shape(
        lambda: steps.create_train_state(model, optimizer, jax.random.key(0), sample, kind)
    )


def make_greedy(model, max_length: int, eos_id: int = tokenizers.EOS_ID):
    """Cached greedy decoding (`decoding.generate`) that stops at `eos_id`, jitted once."""

    def greedy(params, inputs, segment_ids):
        return decoding.generate(
            model,
            params,
            inputs=inputs,
            inputs_segment_ids=segment_ids,
            max_length=max_length,
            eos_id=eos_id,
        )

    return jax.jit(greedy)


class NoCheckpointError(FileNotFoundError):
    """`restore` found no checkpoint in the workdir (other missing files raise their own errors)."""


def restore(
    config: ml_collections.ConfigDict,
    workdir: str | pathlib.Path,
    step: int | None = None,
    *,
    average_last: int = 1,
) -> tuple[Run, checkpointing.Restored]:
    """The run built from `config` and its checkpoint `step` (default: the latest good one).

    `average_last=N > 1` instead averages the parameters of the last N saved checkpoints
    (`Checkpointer.restore_average`); `step` must then be None. The state goes to the first
    local device, whatever `parallel` settings trained it (8-way FSDP restores on 1 device).

    Raises:
      NoCheckpointError: if `workdir` has no checkpoint (a `FileNotFoundError`).
      FileNotFoundError: for a missing data file or directory that building the run reads.
      ValueError: for `average_last` with a `step`, or more checkpoints than are saved.
    """
    workdir = pathlib.Path(workdir)
    if average_last > 1 and step is not None:
        raise ValueError("average the last checkpoints or restore one step, not both")
    if not saved_steps(workdir):  # before the build: nothing to read the tokenizer for
        raise _no_checkpoint(workdir)
    config = copy.deepcopy(config)
    config.parallel.mode, config.parallel.fsdp = "pmap", 1  # the run's strategy goes unused
    config.parallel.tensor = 1
    run = build(config, workdir)
    convert = layout_conversion(run.model_config)
    try:
        with checkpointing.Checkpointer(workdir / "checkpoints") as checkpointer:
            if average_last > 1 and checkpointer.all_steps():
                restored = checkpointer.restore_average(
                    run.abstract_state, last=average_last, convert=convert
                )
            else:
                restored = checkpointer.restore(run.abstract_state, step=step, convert=convert)
    except checkpointing.CheckpointMismatchError as err:
        raise explain_mismatch(err, run, workdir, config_file=True) from err
    if restored is None:
        raise _no_checkpoint(workdir)
    return run, restored


def _no_checkpoint(workdir: pathlib.Path) -> NoCheckpointError:
    return NoCheckpointError(
        f"no checkpoint in {workdir / 'checkpoints'}: train first with "
        f"python -m experiments.train --workdir={workdir}"
    )


def explain_mismatch(
    error: checkpointing.CheckpointMismatchError,
    run: Run,
    workdir: pathlib.Path,
    *,
    config_file: bool,
) -> errors.CheckpointError:
    """`provenance.explain_mismatch` for `run`: names the config keys or the tokenizer file
    that disagree with the checkpoints (`config_file`: the run's config is config.json).

    It stays here, not in `provenance`, which this module imports: the arrays a config gives
    (`_state_shapes`) are built by this module's functions, and imports may not cycle."""
    try:  # today's fields filled in, as for `current`
        saved = config_dict(load_config_dict(error.saved_config))
    except Exception:  # not a run's config (None, or another layout): compare nothing
        saved = None
    return provenance.explain_mismatch(
        error,
        saved=saved,
        current=config_dict(run.config),
        workdir=workdir,
        vocab_size=run.model_config.vocab_size,
        config_file=config_file,
        shapes=functools.partial(_state_shapes, vocab_size=run.model_config.vocab_size),
        ignore=LAYOUT_KEYS,
    )


def _state_shapes(tree: dict, vocab_size: int) -> dict[str, tuple[int, ...]] | None:
    """{key path: shape} of the abstract train state of the config `tree` (JSON), with
    `vocab_size` where it leaves the size to the tokenizer; None if it builds no state."""
    try:
        config = load_config_dict(copy.deepcopy(tree))
        model_config = make_model_config(config, vocab_size)
        optimizer, _ = make_optimizer(config, model_config)
        model = models.create_model(model_config)
        state = abstract_train_state(model, optimizer, sample_batch(config), model_config.kind)
    except Exception:  # an invalid combination of settings: other arrays than `tree`'s
        return None
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    return {jax.tree_util.keystr(path): tuple(leaf.shape) for path, leaf in leaves}
