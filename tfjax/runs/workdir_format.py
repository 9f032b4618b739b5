"""A workdir's `config.json` and its checkpoints' config copies: written, read, checked.

`write_config_json` writes the resolved config of a run to `workdir/config.json`, with two
records beside the config groups: the SHA-256 of the workdir's tokenizer
(`provenance.TOKENIZER_RECORD`) and the workdir format (`FORMAT_RECORD`: the format's number
and the tfjax version that wrote it). Each checkpoint keeps a copy of the config with the same
format record (`stamped`). `load_config_json` is the one reader of config.json.

A workdir of another format is refused in one line that names the tfjax version that wrote it
(`check_format`): tfjax converts no older format. The one conversion kept is a feature, not a
migration: a checkpoint saved with the other `model.scan_layers` layout restores into this
run's (`layout_conversion`), so a run may be resumed or decoded with the layers stacked or not.

`check_resumable` is the one check that a checkpoint's settings are those of the run that
resumes it (a training run, a vectorised sweep's trials, `train.init_from`);
`check_checkpoint_settings` applies it to a workdir's newest checkpoint before a run is built,
and `check_config_json` refuses to write over a config.json that checkpoints depend on.
"""

import json
import logging
import os
import pathlib
from collections.abc import Collection

import ml_collections

import tfjax
from tfjax import errors, models
from tfjax.nn import stacking
from tfjax.runs import provenance
from tfjax.training import checkpointing

log = logging.getLogger(__name__)

# The record of the workdir format: {"version": FORMAT_VERSION, "tfjax": the version that
# wrote it}. Bump FORMAT_VERSION when config.json or the checkpoints change in a way an older
# workdir cannot be read in (a config field added or renamed, another train-state layout).
FORMAT_RECORD = "workdir_format"
FORMAT_VERSION = 1
# The last tfjax version that wrote workdirs without a format record.
UNRECORDED_BY = "0.2.0"

# Model settings a checkpoint may differ in from the run that restores it: they change how the
# same numbers are computed (remat) or laid out (scan_layers, converted by `layout_conversion`).
LAYOUT_KEYS = ("model.scan_layers", "model.remat")


def config_dict(config: ml_collections.ConfigDict) -> dict:
    """JSON-safe nested dict of a config (tuples become lists)."""
    return json.loads(config.to_json_best_effort())


def stamped(tree: dict) -> dict:
    """`tree` (a config as JSON) with this tfjax's `FORMAT_RECORD`."""
    return {**tree, FORMAT_RECORD: {"version": FORMAT_VERSION, "tfjax": tfjax.__version__}}


def check_format(tree: dict, where: str | os.PathLike) -> None:
    """Refuses a config (config.json, or a checkpoint's copy, read from `where`) that another
    workdir format wrote.

    Raises:
        tfjax.errors.WorkdirError: naming the tfjax version that wrote it and what to do.
    """
    record = tree.get(FORMAT_RECORD)
    if isinstance(record, dict) and record.get("version") == FORMAT_VERSION:
        return
    if isinstance(record, dict):
        writer = f"tfjax {record.get('tfjax')} (workdir format {record.get('version')})"
    else:
        writer = f"tfjax {UNRECORDED_BY} or earlier (no workdir format recorded)"
    raise errors.WorkdirError(
        f"{where} was written by {writer}; this tfjax {tfjax.__version__} reads workdir format "
        f"{FORMAT_VERSION} only and converts none: train again in a new --workdir, or use the "
        "tfjax that wrote it"
    )


def write_config_json(workdir: pathlib.Path, config: ml_collections.ConfigDict) -> None:
    """Writes `workdir/config.json`: the resolved config, the format record, and the SHA-256
    of the workdir's tokenizer that later commands check it against."""
    tree = provenance.with_record(stamped(config_dict(config)), config.data.tokenizer, workdir)
    (workdir / "config.json").write_text(json.dumps(tree, indent=2))


def load_config_json(path: str | os.PathLike) -> ml_collections.ConfigDict:
    """A run's resolved config as written to `workdir/config.json` before step 0, locked.

    Every reader of a workdir's config.json comes here (the decoding tools, `experiments.train
    --config=W/config.json`, `train.init_from`, sweeps).

    Raises:
        FileNotFoundError: for a missing file.
        tfjax.errors.ConfigError: for a file that is not a JSON object (damaged, cut short or
            mistyped), with the way to repair it.
        tfjax.errors.WorkdirError: for a file of another workdir format (`check_format`).
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
    check_format(tree, path)
    return load_config_dict(tree)


def load_config_dict(tree: dict) -> ml_collections.ConfigDict:
    """A run's config from its JSON dict (`config_dict`, e.g. one saved in a checkpoint),
    without the records beside its groups, locked."""
    records = (FORMAT_RECORD, provenance.TOKENIZER_RECORD)
    config = ml_collections.ConfigDict({k: v for k, v in tree.items() if k not in records})
    config.lock()
    return config


def _repair(path: pathlib.Path) -> str:
    """How to repair a damaged config.json: from the copy its newest checkpoint keeps."""
    newest = checkpointing.newest_config(path.parent / "checkpoints")
    if newest is not None:
        return f"each checkpoint keeps a copy of it: cp {newest[0]} {path}"
    return "repair it by hand (it holds the run's resolved config)"


def saved_steps(workdir: str | os.PathLike) -> list[int]:
    """The steps of the workdir's checkpoint directories, ascending (damaged ones included;
    those moved aside as `<step>.corrupt` not), without opening them."""
    directory = pathlib.Path(workdir) / "checkpoints"
    return sorted(int(p.name) for p in directory.glob("*") if p.name.isdigit() and p.is_dir())


def newest_checkpoint_config(directory: pathlib.Path) -> dict | None:
    """The config copy of the newest readable step under `directory` (a `checkpoints`
    folder), format-checked; None if there is none (`checkpointing.newest_config`)."""
    newest = checkpointing.newest_config(directory)
    if newest is None:
        return None
    check_format(newest[1], newest[0])
    return newest[1]


def check_resumable(
    saved: dict,
    current: dict,
    *,
    sections: Collection[str] = ("model", "data"),
    ignore: Collection[str] = LAYOUT_KEYS,
) -> None:
    """Refuses to resume (or start from) a checkpoint whose `sections` differ from the run's.

    Args:
        saved: the config the checkpoint was written with, as JSON.
        current: the run's config, as JSON (`config_dict`).
        sections: the config groups that must match.
        ignore: dotted keys that may differ (default: the layout, which restoring converts).

    Raises:
        tfjax.errors.CheckpointError: on one line, naming each key that differs.
    """
    for section in sections:
        checkpointing.check_compatible(saved, current, section=section, ignore=ignore)


def check_config_json(workdir: pathlib.Path) -> None:
    """Refuses to write over a damaged config.json, or one of another workdir format, that
    checkpoints depend on (the message says what to do); warns before writing over one that
    none do."""
    path = workdir / "config.json"
    if not path.is_file():
        return
    try:
        load_config_json(path)
    except (errors.ConfigError, errors.WorkdirError) as err:
        other_format = isinstance(err, errors.WorkdirError)
        if saved_steps(workdir):
            if other_format:
                raise  # its own one line: the version that wrote it, what to do
            raise errors.WorkdirError(
                f"not resuming {workdir}, which holds checkpoints: {err}; then rerun"
            ) from err
        what = "is of another workdir format" if other_format else "is damaged"
        log.warning("%s %s and no checkpoint needs it: this run writes over it", path, what)


def check_checkpoint_settings(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> None:
    """Refuses a run whose model or data settings differ from those of the workdir's newest
    checkpoint (the copy of its config each keeps), or checkpoints of another workdir format,
    before anything is built: a changed `data.tokenizer` is then named as such, not as a
    missing or damaged tokenizer."""
    saved = newest_checkpoint_config(workdir / "checkpoints")
    if saved is not None:
        check_resumable(saved, config_dict(config))


def layout_conversion(model_config: models.ModelConfig) -> checkpointing.ConvertFn:
    """For `Checkpointer.restore` into the state of `model_config`: converts a step saved with
    the other `model.scan_layers` layout (parameters and optimizer moments stacked or
    unstacked along the layer axis, `stacking.convert_layout`)."""
    scan_layers = model_config.scan_layers

    def convert(saved_config: dict, saved_keys) -> checkpointing.Conversion | None:
        del saved_keys  # the layout is the saved config's
        saved_scan = bool(saved_config["model"]["scan_layers"])
        if saved_scan == scan_layers:
            return None
        return checkpointing.Conversion(
            to_saved=lambda state: stacking.convert_layout(state, scan=saved_scan),
            from_saved=lambda state: stacking.convert_layout(state, scan=scan_layers),
        )

    return convert
