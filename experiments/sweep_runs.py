"""The runs of a sweep: a config file's `get_sweep(NAME)` expanded into named runs and their
training commands (`experiments.sweep` prints or runs them).

Each run is named from its overrides, short where the names stay unique
(`optim.learning_rate=0.5, model.num_layers=2` -> `lr0.5-layers2`), else `key=value,...`, with
`-1`, `-2`, ... added to repeats; it trains in `ROOT/NAME/<run name>` with

    python -m experiments.train --config=SPEC --workdir=ROOT/NAME/RUN --config.a.b=v ...

(the overrides common to the sweep first, then the run's own). `expand` checks every override
against the config before it returns, so a typo fails before the first run starts.
"""

import dataclasses
import hashlib
import pathlib
import re
from collections.abc import Mapping, Sequence

import ml_collections

from experiments import config_utils
from experiments.sweep_summary import format_value

TRAIN_MODULE = "experiments.train"
# Short names for common fields in run names; other fields use their last key component.
ABBREVIATIONS = {
    "learning_rate": "lr",
    "num_layers": "layers",
    "num_encoder_layers": "enclayers",
    "num_decoder_layers": "declayers",
    "num_heads": "heads",
    "num_kv_heads": "kvheads",
    "embed_dim": "dim",
    "mlp_dim": "mlp",
    "dropout_rate": "dropout",
    "warmup_steps": "warmup",
    "global_batch_size": "bs",
    "num_train_steps": "steps",
    "weight_decay": "wd",
    "label_smoothing": "ls",
}
_MAX_NAME_LEN = 100


@dataclasses.dataclass
class Run:
    """One run of a sweep.

    Attributes:
        name: directory name of the run, unique within the sweep.
        workdir: the run's workdir, `ROOT/SWEEP/name`.
        overrides: the run's own dotted-key overrides, as returned by `get_sweep`.
        command: argv of the training command (starting with "python").
        config: the run's resolved config.
    """

    name: str
    workdir: pathlib.Path
    overrides: dict[str, object]
    command: list[str]
    config: ml_collections.ConfigDict | None = None


def _sanitize(text: str) -> str:
    text = re.sub(r"[^A-Za-z0-9._,=+-]+", "_", text)
    if len(text) > _MAX_NAME_LEN:
        digest = hashlib.sha1(text.encode()).hexdigest()[:8]
        text = f"{text[: _MAX_NAME_LEN - 9]}-{digest}"
    return text


def _short_name(overrides: Mapping[str, object]) -> str:
    parts = []
    for key, value in overrides.items():
        field = key.rsplit(".", 1)[-1]
        parts.append(ABBREVIATIONS.get(field, field) + format_value(value))
    return _sanitize("-".join(parts)) if parts else "default"


def _long_name(overrides: Mapping[str, object]) -> str:
    text = ",".join(f"{key}={format_value(value)}" for key, value in overrides.items())
    return _sanitize(text) if text else "default"


def run_names(sweep: Sequence[Mapping[str, object]]) -> list[str]:
    """Unique directory names: short ones (`lr0.5-layers2`) unless two would collide.

    Falls back to full `key=value,...` names for the whole sweep, and adds `-1`, `-2`, ... to
    repeats of identical overrides.
    """
    names = [_short_name(overrides) for overrides in sweep]
    if len(set(names)) < len(names):
        names = [_long_name(overrides) for overrides in sweep]
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        count = seen.get(name, 0)
        seen[name] = count + 1
        unique.append(f"{name}-{count}" if count else name)
    return unique


def build_command(spec: str, workdir: pathlib.Path, overrides: Sequence[str]) -> list[str]:
    """`python -m experiments.train --config=SPEC --workdir=DIR --config.a.b=v ...` as argv."""
    return [
        "python",
        "-m",
        TRAIN_MODULE,
        f"--config={spec}",
        f"--workdir={workdir}",
        *(config_utils.override_flag(override) for override in overrides),
    ]


def expand(
    spec: str, sweep_name: str, common_overrides: Sequence[str], root: str | pathlib.Path
) -> list[Run]:
    """The runs of sweep `sweep_name` of the config file in `spec`.

    Args:
        spec: config spec `path/to/file.py[:preset]`, passed on to every run.
        sweep_name: name given to the file's `get_sweep`.
        common_overrides: `"a.b=value"` overrides for every run, applied before the run's own.
        root: the sweep's runs go to `root/sweep_name/<run name>`.

    Returns:
        One `Run` per override dict, in the sweep's order.

    Raises:
        ValueError: for an unknown sweep, or an override the config rejects (checked for every
            run before returning, so a typo fails before the first run starts).
    """
    sweep = config_utils.get_sweep(spec, sweep_name)
    directory = pathlib.Path(root) / sweep_name
    runs = []
    for name, overrides in zip(run_names(sweep), sweep, strict=True):
        config = config_utils.load_config(spec, common_overrides)
        config_utils.apply_updates(config, overrides)  # the values themselves, not their text
        own = [f"{key}={format_value(value)}" for key, value in overrides.items()]
        workdir = directory / name
        command = build_command(spec, workdir, [*common_overrides, *own])
        runs.append(Run(name, workdir, dict(overrides), command, config))
    return runs
