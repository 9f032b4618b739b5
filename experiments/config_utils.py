"""ml_collections config handling shared by the entry points (train, evaluate, sweep).

A config is named by a spec, `path/to/file.py[:arg]`: the file is loaded as a module and its
`get_config(arg)` called; or by a workdir's resolved `config.json` (to fine-tune a
converted checkpoint with its model group, say). Command-line overrides `--config.a.b=value`
are pulled out of argv by `split_config_overrides` before absl parses flags (after expanding
absl's `--flagfile=FILE`, so a flagfile may hold them too; a bare `--config.a.b` sets a boolean
field true and `--noconfig.a.b` false), then applied by `load_config`, which parses each value
to the type of the field it replaces and rejects unknown keys with the closest valid ones. The
returned config is locked: code cannot add keys later. The one exception are groups named
`kwargs` (`OPEN_GROUP`, e.g. `optim.kwargs`): they hold the keyword arguments of something the
config names by a string (the optax optimizer of `optim.optimizer`), so an override may add a
key there (`--config.optim.kwargs.b1=0.95`, its value a Python literal or else a string), which
whatever takes them checks. Every refusal is a `tfjax.errors.ConfigError` (a ValueError) with a
one-line message.

Why not `ml_collections.config_flags.DEFINE_config_file` (tried with ml_collections 1.1.0):
`--config.train.num_train_steps=1e5` is refused ("invalid literal for int()"); a misspelt key
ends in an AttributeError traceback instead of one line; the override flags are read from
`sys.argv` (at import time when `--config` is absent), which `cli.main(argv=...)` and a second
entry point in one process (DuplicateFlagError) cannot use; list- and None-typed fields have no
parser. Sweeps apply their overrides as values (`apply_updates`), not as text.
"""

import ast
import difflib
import importlib.util
import pathlib
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

import ml_collections
from absl import flags

from tfjax import errors

_PREFIXES = ("--config.", "-config.")
_NEGATED = ("--noconfig.", "-noconfig.")
NEGATION = "!"  # "!a.b": the override of `--noconfig.a.b`
# Groups of this name take keys the config file does not list (see the module docstring).
OPEN_GROUP = "kwargs"
_TRUE = ("true", "1")
_FALSE = ("false", "0")
_EXAMPLES = {
    bool: ": write true or false",
    int: ": write an integer, e.g. 100",
    float: ": write a number, e.g. 0.5",
}


def _split_spec(spec: str) -> tuple[pathlib.Path, str | None]:
    """`configs/base.py:cpu` -> (Path("configs/base.py"), "cpu"); no or empty arg -> None."""
    path, _, arg = spec.partition(":")
    return pathlib.Path(path), (arg or None)


def load_module(spec: str) -> ModuleType:
    """Loads the Python file of a config spec (the `:arg` part is ignored) as a module.

    Raises:
        FileNotFoundError: if the file does not exist.
        tfjax.errors.ConfigError: if it is not valid Python (file and line in the message).
    """
    path, _ = _split_spec(spec)
    if not path.is_file():
        raise FileNotFoundError(
            f"config file {str(path)!r} (from spec {spec!r}) not found: pass "
            "--config=FILE[:PRESET], e.g. --config=configs/base.py:tiny"
        )
    name = "_tfjax_config_" + "".join(c if c.isalnum() else "_" for c in str(path.resolve()))
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses and pickling look classes up by module name
    try:
        module_spec.loader.exec_module(module)
    except SyntaxError as err:  # the user's file: where, not a traceback into importlib
        raise errors.ConfigError(
            f"config file {str(path)!r} line {err.lineno}: {err.msg}; fix the file"
        ) from err
    return module


def load_config(spec: str, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
    """Builds the config of `spec`, applies `overrides` in order and locks it.

    Args:
        spec: `path/to/file.py[:arg]`; calls `get_config(arg)`, or `get_config()` without arg.
        overrides: `"a.b=value"` strings (`--config.a.b=value` without the `--config.` prefix);
            `"a.b"` sets a boolean field true and `"!a.b"` false (`--config.a.b` and
            `--noconfig.a.b`). Values are parsed to the field's type: int (also "1e5"),
            float, bool (true/false/1/0), str, tuple/list ("1,2", "(1, 2)", "[1,2]"; "()" is
            empty; nested ones as a Python literal, "(('heads', 'tensor'),)"); a field that
            is None takes any Python literal (`ast.literal_eval`), else the raw string.

    Returns:
        The locked config.

    Raises:
        ConfigError: for a file without `get_config`, an override without "=", an unknown key
            (the message lists the valid keys at that level, closest first), a group given a
            value, or a value that cannot be parsed as the field's type.
        FileNotFoundError: if the file does not exist.
    """
    if spec.endswith(".json"):  # a workdir's resolved config.json
        config = _load_json_config(spec)
        for override in overrides:
            apply_override(config, override)
        return config
    module = load_module(spec)
    if not callable(getattr(module, "get_config", None)):
        raise errors.ConfigError(f"config file {spec.partition(':')[0]!r} defines no get_config()")
    _, arg = _split_spec(spec)
    config = module.get_config(arg) if arg is not None else module.get_config()
    if not isinstance(config, ml_collections.ConfigDict):
        raise errors.ConfigError(
            f"get_config of {spec!r} returned {type(config).__name__}, "
            "expected ml_collections.ConfigDict"
        )
    for override in overrides:
        apply_override(config, override)
    config.lock()
    return config


def _load_json_config(spec: str) -> ml_collections.ConfigDict:
    """The locked config of a workdir's config.json (overrides still set its keys)."""
    from tfjax.runs import workdir_format

    path = pathlib.Path(spec)
    if not path.is_file():
        raise FileNotFoundError(
            f"config file {spec!r} not found: pass a workdir's config.json or "
            "--config=FILE[:PRESET], e.g. --config=configs/base.py:tiny"
        )
    return workdir_format.load_config_json(path)


def _unknown_key(key: str, prefix: str, part: str, keys: Sequence[str]) -> errors.ConfigError:
    close = difflib.get_close_matches(part, keys, n=3, cutoff=0.6)
    ordered = [*close, *sorted(k for k in keys if k not in close)]
    where = f"under {prefix!r}" if prefix else "at the top level"
    hint = f"did you mean {', '.join(repr(_join(prefix, k)) for k in close)}? " if close else ""
    return errors.ConfigError(
        f"unknown config key {key!r}; {hint}valid keys {where}: " + ", ".join(ordered)
    )


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _field(config: ml_collections.ConfigDict, key: str) -> tuple[ml_collections.ConfigDict, str]:
    """(the group holding dotted `key`, its last part); unknown keys and groups refused, but
    a key new to an open group (`is_open`) is returned for the caller to add."""
    *parents, leaf = key.split(".")
    node, prefix = config, ""
    for part in parents:
        if part not in node:
            raise _unknown_key(key, prefix, part, list(node.keys()))
        node, prefix = node[part], _join(prefix, part)
        if not isinstance(node, ml_collections.ConfigDict):
            raise errors.ConfigError(
                f"unknown config key {key!r}: config key {prefix!r} is not a group (type "
                f"{type(node).__name__}); cannot set {key!r}"
            )
    if leaf not in node and not is_open(prefix):
        raise _unknown_key(key, prefix, leaf, list(node.keys()))
    if leaf in node and isinstance(node[leaf], ml_collections.ConfigDict):
        fields = [_join(key, k) for k in node[leaf]] or [f"{key}.NAME=VALUE"]
        raise errors.ConfigError(
            f"config key {key!r} is a group; override its fields instead: " + ", ".join(fields)
        )
    return node, leaf


def check_key(config: ml_collections.ConfigDict, key: str, where: str = "") -> None:
    """Raises ConfigError unless `config` has the (non-group) dotted `key`, or `key` is new to
    an open group (`is_open`); the one unknown-key check of overrides, sweeps and presets.

    Args:
        config: the config the key should exist in.
        key: dotted key, e.g. "train.num_train_steps".
        where: what sets the key, put in front of the message (e.g. "preset 'tiny'").

    Raises:
        ConfigError: "unknown config key ..." with the closest valid ones, or a group.
    """
    try:
        _field(config, key)
    except errors.ConfigError as err:
        if not where:
            raise
        raise errors.ConfigError(f"{where}: {err}") from None


def is_open(group: str) -> bool:
    """Whether the group of dotted name `group` takes new keys (`OPEN_GROUP`)."""
    return group.rsplit(".", 1)[-1] == OPEN_GROUP


def _add(node: ml_collections.ConfigDict, leaf: str, value: Any) -> None:
    """Adds key `leaf` to `node`, an open group, even when the config is locked."""
    with node.unlocked():
        node[leaf] = value


def apply_override(config: ml_collections.ConfigDict, override: str) -> None:
    """Applies one `"a.b=value"`, `"a.b"` or `"!a.b"` override in place (see `load_config`).

    Raises:
        ConfigError: as described in `load_config`; also a bare or negated key whose field
            is not a boolean.
    """
    key, sep, raw = override.removeprefix(NEGATION).partition("=")
    if not key or (sep and override.startswith(NEGATION)):
        raise errors.ConfigError(f"config override {override!r} is not of the form 'a.b=value'")
    node, leaf = _field(config, key)
    if leaf not in node:  # a new key of an open group; bare or negated: a boolean
        value = _parse_new(key, raw) if sep else not override.startswith(NEGATION)
        _add(node, leaf, value)
        return
    field_type = node.get_type(leaf)
    if sep:
        node[leaf] = parse_value(key, raw, field_type, node[leaf])
    elif field_type is bool:
        node[leaf] = not override.startswith(NEGATION)
    else:
        flag = f"--noconfig.{key}" if override.startswith(NEGATION) else f"--config.{key}"
        raise errors.ConfigError(
            f"{flag}: config key {key!r} is {field_type.__name__}, not bool, so it needs a "
            f"value: --config.{key}=VALUE"
        )


def override_flag(override: str) -> str:
    """The command-line flag of an override: `"a.b=1"` -> `--config.a.b=1`, `"a.b"` ->
    `--config.a.b`, `"!a.b"` -> `--noconfig.a.b`."""
    if override.startswith(NEGATION):
        return f"--noconfig.{override.removeprefix(NEGATION)}"
    return f"--config.{override}"


def _parse_new(key: str, raw: str) -> Any:
    """The value of a key new to an open group: true or false, else a Python literal (a
    number, None, a tuple), else the string."""
    text = raw.strip().lower()
    return text == "true" if text in ("true", "false") else parse_value(key, raw, type(None))


def apply_updates(config: ml_collections.ConfigDict, updates: Mapping[str, Any]) -> None:
    """Sets dotted keys to Python values in place (`ConfigDict.update_from_flattened_dict`),
    after checking every key as `load_config` does; an int is taken for a float field and a
    list for a tuple field.

    Raises:
        ConfigError: an unknown key (with the closest valid ones), a group, or a value of
            another type than the field's.
    """
    converted = {}
    for key, value in updates.items():
        node, leaf = _field(config, key)
        if leaf not in node:  # a new key of an open group
            _add(node, leaf, value)
            continue
        field_type = node.get_type(leaf)
        if field_type is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        elif field_type is tuple and isinstance(value, list):
            value = tuple(value)
        converted[key] = value
    try:
        config.update_from_flattened_dict(converted)
    except TypeError as err:
        raise errors.ConfigError(" ".join(str(err).split())) from None


def parse_value(key: str, raw: str, field_type: type, current: Any = None) -> Any:
    """Parses the string `raw` as a value of `field_type` (the type of config field `key`).

    Args:
        key: dotted key, for error messages.
        raw: the text after "=".
        field_type: the field's type (`ConfigDict.get_type`); NoneType accepts any literal.
        current: the field's current value; for tuples/lists its elements give their type.

    Returns:
        The parsed value.

    Raises:
        ConfigError: naming key, type and value when `raw` does not parse.
    """
    if field_type in (tuple, list):
        return field_type(_parse_sequence(key, raw, current))
    if field_type is type(None):
        try:
            return ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            return raw
    return _parse_scalar(key, raw, field_type)


def _parse_sequence(key: str, raw: str, current: Any) -> list:
    text = raw.strip()
    if any(bracket in text[1:-1] for bracket in "()[]"):  # nested: a Python literal
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError) as err:
            raise errors.ConfigError(
                f"cannot parse {raw!r} for config key {key!r}: nested values are Python "
                "literals, e.g. (('heads', 'tensor'), ('batch', ('data', 'fsdp')))"
            ) from err
        return list(value) if isinstance(value, list | tuple) else [value]
    if text[:1] + text[-1:] in ("()", "[]"):
        text = text[1:-1]
    pieces = [piece.strip() for piece in text.split(",")]
    if pieces and not pieces[-1]:  # "1," or "(1,)" or ""
        pieces.pop()
    types = {type(item) for item in current or ()}
    element_type = types.pop() if len(types) == 1 else type(None)
    return [parse_value(key, piece, element_type) for piece in pieces]


def _parse_scalar(key: str, raw: str, field_type: type) -> Any:
    text = raw.strip()
    try:
        if field_type is bool:
            if text.lower() in _TRUE + _FALSE:
                return text.lower() in _TRUE
        elif field_type is int:
            number = float(text) if any(c in text.lower() for c in ".e") else int(text)
            if float(number).is_integer():
                return int(number)
        elif field_type is float:
            return float(text)
        elif field_type is str:
            return raw
        else:
            return field_type(raw)
    except (TypeError, ValueError, OverflowError):
        pass
    raise errors.ConfigError(
        f"cannot parse {raw!r} as {field_type.__name__} for config key {key!r}"
        + _EXAMPLES.get(field_type, "")
    )


def split_config_overrides(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Takes every config override out of argv, after expanding `--flagfile=FILE`s.

    absl would reject the overrides as unknown flags, so entry points call this before
    `app.run`. A flagfile (absl's convention) holds one flag a line, `#` starts a comment line:
    its lines take its place in argv, so they may be overrides too. The forms: `--config.a.b=V`;
    `--config.a.b V` when V does not look like a flag (a negative number is a value); a bare
    `--config.a.b` (followed by a flag, `--` or nothing) -> `"a.b"`, and `--noconfig.a.b` ->
    `"!a.b"`: true and false for a boolean field (`apply_override`). Processing stops at a bare
    `--`; `--config=spec` itself stays in argv.

    Args:
        argv: the full argument list, program name first (e.g. `sys.argv`).

    Returns:
        (the remaining argv, the overrides in command-line order).

    Raises:
        ConfigError: a flagfile that cannot be read, or `--noconfig.a.b=V`.
    """
    args, remaining, overrides, i = _expand_flagfiles(argv), [], [], 0
    while i < len(args):
        arg, i = args[i], i + 1
        if arg == "--":
            remaining.extend(args[i - 1 :])
            break
        if arg.startswith(_NEGATED):
            key = arg.partition(".")[2]
            if "=" in key:
                raise errors.ConfigError(
                    f"{arg}: a --noconfig flag takes no value; write "
                    f"--config.{key.partition('=')[0]}=VALUE"
                )
            overrides.append(NEGATION + key)
            continue
        prefix = next((p for p in _PREFIXES if arg.startswith(p)), None)
        if prefix is None:
            remaining.append(arg)
            continue
        override = arg[len(prefix) :]
        if "=" not in override and i < len(args) and not _looks_like_a_flag(args[i]):
            override, i = f"{override}={args[i]}", i + 1
        overrides.append(override)
    return remaining, overrides


def _looks_like_a_flag(arg: str) -> bool:
    """`--x`, `-x` or `--`, but not a negative number such as `-1` or `-1e-3`."""
    if not arg.startswith("-"):
        return False
    try:
        float(arg)
    except ValueError:
        return True
    return False


def _expand_flagfiles(argv: Sequence[str]) -> list[str]:
    """argv with each `--flagfile=FILE` replaced by the flags in FILE (absl's reader)."""
    argv = list(argv)
    try:
        return argv[:1] + flags.FLAGS.read_flags_from_files(argv[1:], force_gnu=True)
    except flags.CantOpenFlagFileError as err:
        reason = str(err).removeprefix("ERROR:: Unable to open flagfile: ")
        raise errors.ConfigError(
            f"cannot read a --flagfile: {reason}; a flagfile holds one flag a line, e.g. "
            "--config.train.num_train_steps=100"
        ) from None


def get_sweep(spec: str, name: str) -> list[dict[str, object]]:
    """The runs of sweep `name`: the config file's `get_sweep(name)`, validated.

    Args:
        spec: the config spec; its `:arg` part is ignored (a sweep never changes presets).
        name: the sweep's name.

    Returns:
        One dict of dotted-key overrides per run.

    Raises:
        ConfigError: if the file has no `get_sweep`, does not know `name` (the message lists
            the sweeps of its `SWEEPS` dict when it has one), or returns something else than a
            list of dicts with string keys.
    """
    module = load_module(spec)
    path = spec.partition(":")[0]
    if not callable(getattr(module, "get_sweep", None)):
        raise errors.ConfigError(f"config file {path!r} defines no get_sweep(name)")
    known = sorted(getattr(module, "SWEEPS", {}) or {})
    try:
        runs = module.get_sweep(name)
    except (KeyError, ValueError) as err:
        detail = f"choose one of: {', '.join(known)}" if known else str(err)
        raise errors.ConfigError(f"unknown sweep {name!r} in {path!r}; {detail}") from err
    if not isinstance(runs, list | tuple) or not all(
        isinstance(run, dict) and all(isinstance(k, str) for k in run) for run in runs
    ):
        raise errors.ConfigError(
            f"get_sweep({name!r}) of {path!r} must return a list of dicts of "
            f"dotted-key overrides, got {runs!r}"
        )
    return [dict(run) for run in runs]
