"""Whether a checkpoint's saved config fits the current run: `check_compatible`.

Restoring arrays of another model fails deep inside orbax with a shape error; comparing the
configs first names the settings that differ and how to get the old ones back.
"""

import json
from collections.abc import Collection
from typing import Any

from tfjax import errors

ABSENT = object()  # a config key missing on one side of `differences`


def check_compatible(
    saved_config: dict,
    config: dict,
    *,
    section: str = "model",
    ignore: Collection[str] = (),
) -> None:
    """Checks that `config[section]` equals the one a checkpoint was written with.

    Call it before anything in the workdir is overwritten.

    Args:
        saved_config: the config stored with the checkpoint (`Restored.config`).
        config: the config of the current run, as a JSON dict.
        section: the top-level group to compare, e.g. "model" or "data".
        ignore: dotted keys (e.g. "model.scan_layers") that may differ, or be absent on one
            side: settings that change how the same numbers are computed or laid out, which
            restoring converts (see `Checkpointer.restore`'s `convert`).

    Raises:
        CheckpointError: (a ValueError) on one line, listing each differing key with its saved
            and current value.
    """
    diffs = differences(saved_config, config, sections=(section,), ignore=ignore)
    if not diffs:
        return
    changes = "; ".join(f"{key}: saved {show(old)}, now {show(new)}" for key, old, new in diffs)
    flags = " ".join(f"--config.{key}={show(old)}" for key, old, _ in diffs if old is not ABSENT)
    raise errors.CheckpointError(
        f"the checkpoint in this workdir was written with different `{section}` settings "
        f"({changes}): resuming would mix two runs. Pick another --workdir for the new "
        f"settings, or restore the original ones{' (' + flags + ')' if flags else ''}."
    )


def differences(
    saved_config: dict,
    config: dict,
    *,
    sections: Collection[str],
    ignore: Collection[str] = (),
) -> list[tuple[str, Any, Any]]:
    """(dotted key, saved value, current value) of each key of `sections` that differs, sorted
    by key; `ABSENT` for a key on one side only; `ignore` as in `check_compatible`."""
    saved, now = {}, {}
    for section in sections:
        saved.update(_flatten(saved_config.get(section, {}), section))
        now.update(_flatten(config.get(section, {}), section))
    return [
        (key, saved.get(key, ABSENT), now.get(key, ABSENT))
        for key in sorted((saved.keys() | now.keys()) - set(ignore))
        if saved.get(key, ABSENT) != now.get(key, ABSENT)
    ]


def _flatten(tree: Any, prefix: str) -> dict[str, Any]:
    """Nested dicts as {"a.b.c": leaf}; non-dict values are leaves."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    flat = {}
    for key, value in tree.items():
        flat.update(_flatten(value, f"{prefix}.{key}"))
    return flat


def show(value: Any) -> str:
    """A config value as JSON; "<absent>" for `ABSENT`."""
    return "<absent>" if value is ABSENT else json.dumps(value)
