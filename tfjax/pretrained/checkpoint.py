"""Reading and writing Hugging Face checkpoint directories, and applying a family's weight table.

A directory as `save_pretrained` writes it holds `config.json` and the weights in
`model.safetensors` (or shards listed in `model.safetensors.index.json`, or PyTorch's
`pytorch_model.bin`, read with torch). A family (`tfjax.pretrained.gpt2`, ...) describes its
weights as a table of `Entry` rows: which Hugging Face tensors make which tfjax parameter, and
how (`to_params`, `to_tensors`). Every shape is checked and every tensor accounted for: a
missing, unknown or misshapen tensor is a `ConversionError` that names it.

Layouts: a torch `Linear` stores y = x W^T + b with W [out, in] ("linear"); GPT-2's `Conv1D`
stores W [in, out] like a Flax kernel ("kernel"); vectors and tables are "same". Several tensors
of one row are concatenated along the output axis (q, k and v into one fused "qkv" kernel), then
reshaped to the tfjax shape, e.g. [D, 3 N H] -> [D, 3N, H] (q heads, then k, then v).
"""

import dataclasses
import json
import logging
import os
import pathlib
import re
from collections.abc import Iterable

import numpy as np

from tfjax import errors

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_FILE = "pytorch_model.bin"
LAYOUTS = ("linear", "kernel", "same")

ConversionError = errors.ConversionError


@dataclasses.dataclass(frozen=True)
class Entry:
    """One tfjax parameter and the Hugging Face tensors it is made of.

    Attributes:
        path: the parameter's path in the tfjax tree, "/"-separated.
        names: the Hugging Face tensor names, concatenated along the output axis in order.
        shapes: the Hugging Face shape of each, as the config implies it.
        layout: "linear" (torch [out, in]), "kernel" ([in, out]) or "same" (vectors, tables).
    """

    path: str
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    layout: str = "same"


def read_config(directory: str | os.PathLike) -> dict:
    """The directory's `config.json` as a dict.

    Raises:
        FileNotFoundError: without a directory or its config.json.
        ConversionError: when config.json is not a JSON object with a "model_type".
    """
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(
            f"no checkpoint directory {directory}: pass the folder save_pretrained (or "
            "hf download REPO --local-dir DIR) wrote"
        )
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{directory} has no {CONFIG_FILE}: is it a Hugging Face checkpoint directory?"
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ConversionError(f"{path} is not valid JSON: {err}") from err
    if not isinstance(config, dict) or "model_type" not in config:
        raise ConversionError(f"{path} has no 'model_type': is it a transformers config.json?")
    return config


def read_tensors(directory: pathlib.Path) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint as float32 numpy arrays, by name.

    Raises:
        FileNotFoundError: when the directory has no weights file.
        tfjax.errors.DependencyError: for a file whose reader (safetensors, torch) is missing.
        ConversionError: for a weights file that is damaged or cut short (named).
    """
    directory = pathlib.Path(directory)
    if (directory / SAFETENSORS_INDEX).is_file():
        index = json.loads((directory / SAFETENSORS_INDEX).read_text(encoding="utf-8"))
        files = sorted(set(index["weight_map"].values()))
        return {k: v for f in files for k, v in _read_safetensors(directory / f).items()}
    if (directory / SAFETENSORS_FILE).is_file():
        return _read_safetensors(directory / SAFETENSORS_FILE)
    if (directory / TORCH_FILE).is_file():
        return _read_torch(directory / TORCH_FILE)
    raise FileNotFoundError(
        f"{directory} has no weights ({SAFETENSORS_FILE}, {SAFETENSORS_INDEX} or {TORCH_FILE})"
    )


def _read_safetensors(path: pathlib.Path) -> dict[str, np.ndarray]:
    safetensors = _import("safetensors", "safetensors", path)
    safetensors_numpy = _import("safetensors.numpy", "safetensors", path)
    try:
        tensors = safetensors_numpy.load_file(str(path))
    except safetensors.SafetensorError as err:  # e.g. "incomplete metadata": cut short
        raise _damaged(path, err) from err
    except (TypeError, ValueError):  # numpy has no bfloat16: torch reads those files
        safetensors_torch = _import("safetensors.torch", "torch for bfloat16 weights", path)
        tensors = {k: v.float().numpy() for k, v in safetensors_torch.load_file(str(path)).items()}
    return {name: np.asarray(tensor, np.float32) for name, tensor in tensors.items()}


def _read_torch(path: pathlib.Path) -> dict[str, np.ndarray]:
    torch = _import("torch", "torch", path)
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except (EOFError, OSError, RuntimeError) as err:  # what a cut-short zip archive raises
        raise _damaged(path, err) from err
    return {name: tensor.float().numpy() for name, tensor in state.items()}


def _damaged(path: pathlib.Path, error: BaseException) -> ConversionError:
    """The error for a weights file its reader cannot parse, with the reader's first line."""
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    return ConversionError(
        f"{path} is damaged or incomplete ({reason}): download it again (a download that "
        "stopped early leaves such a file)"
    )


def _import(module: str, what: str, path: pathlib.Path):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise errors.DependencyError(
            f"reading {path} needs {what}: pip install \"tfjax[hf]\" (and torch, the 'parity' "
            "extra)"
        ) from err


def write(directory: pathlib.Path, config: dict, tensors: dict[str, np.ndarray]) -> None:
    """Writes `config.json` and `model.safetensors` (float32) into `directory`."""
    safetensors_numpy = _import("safetensors.numpy", "safetensors", directory)
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    arrays = {k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()}
    safetensors_numpy.save_file(
        arrays, str(directory / SAFETENSORS_FILE), metadata={"format": "pt"}
    )


def to_params(
    tensors: dict[str, np.ndarray],
    table: Iterable[Entry],
    expected: dict[str, tuple[int, ...]],
    *,
    where: str,
) -> dict:
    """The tfjax parameter tree that `table` makes of `tensors` (which it empties).

    Args:
        tensors: Hugging Face tensors by name; the ones the table reads are removed.
        table: the family's rows.
        expected: the tfjax model's parameter shapes by "/"-path (`flat_shapes`).
        where: the checkpoint, named in messages.

    Raises:
        ConversionError: for a missing tensor, a tensor of another shape, or a tfjax parameter
            the table does not make (a table out of step with the model).
    """
    flat = {}
    for entry in table:
        missing = [name for name in entry.names if name not in tensors]
        if missing:
            raise ConversionError(
                f"{where} lacks tensor {missing[0]} (for {entry.path}): the checkpoint does not "
                "match its config.json, or is of another architecture"
            )
        arrays = [tensors.pop(name) for name in entry.names]
        for name, array, shape in zip(entry.names, arrays, entry.shapes, strict=True):
            if array.shape != shape:
                raise ConversionError(
                    f"{where}: tensor {name} has shape {list(array.shape)}, but config.json "
                    f"implies {list(shape)}"
                )
        if entry.path not in expected:
            raise ConversionError(f"{where}: the weight table's {entry.path} is no model parameter")
        if entry.layout == "linear":
            arrays = [a.T for a in arrays]
        joined = np.concatenate(arrays, axis=-1) if len(arrays) > 1 else arrays[0]
        flat[entry.path] = joined.reshape(expected[entry.path]).astype(np.float32)
    unmade = sorted(set(expected) - set(flat))
    if unmade:
        raise ConversionError(f"{where}: nothing in the weight table makes {unmade[0]}")
    return unflatten(flat)


def to_tensors(params: dict, table: Iterable[Entry]) -> dict[str, np.ndarray]:
    """The Hugging Face tensors of a tfjax parameter tree: `to_params` backwards.

    Raises:
        ConversionError: when the tree lacks a parameter of the table or has one it lacks.
    """
    flat = flatten(params)
    tensors, used = {}, set()
    for entry in table:
        if entry.path not in flat:
            raise ConversionError(f"the parameters lack {entry.path}: is this the model's tree?")
        used.add(entry.path)
        value = np.asarray(flat[entry.path], np.float32)
        if len(entry.shapes[0]) == 1:
            parts = np.split(value.reshape(-1), np.cumsum([s[0] for s in entry.shapes])[:-1])
        elif entry.layout == "linear":
            matrix = value.reshape(entry.shapes[0][1], -1)  # [in, sum of outs]
            outs = [s[0] for s in entry.shapes]
            parts = [p.T for p in np.split(matrix, np.cumsum(outs)[:-1], axis=1)]
        else:
            matrix = value.reshape(entry.shapes[0][0], -1)  # [in, sum of outs]
            outs = [s[-1] for s in entry.shapes]
            parts = np.split(matrix, np.cumsum(outs)[:-1], axis=1)
        for name, part, shape in zip(entry.names, parts, entry.shapes, strict=True):
            tensors[name] = np.ascontiguousarray(part.reshape(shape))
    unused = sorted(set(flat) - used)
    if unused:
        raise ConversionError(f"the weight table has no place for parameter {unused[0]}")
    return tensors


def drop_tied_and_buffers(
    tensors: dict[str, np.ndarray], tied: dict[str, str], buffers: Iterable[str], where: str
) -> None:
    """Removes the copies of tied tensors (checked equal to their source) and known buffers.

    Raises:
        ConversionError: for a "tied" copy that differs from its source: an untied layer.
    """
    for copy, source in tied.items():
        if copy in tensors and source in tensors:
            if not np.array_equal(tensors[copy], tensors[source]):
                raise ConversionError(
                    f"{where}: tensor {copy} differs from {source}, to which config.json ties "
                    "it; an untied layer would need tie_word_embeddings=false in config.json"
                )
            del tensors[copy]
    for name in [n for n in tensors if any(re.fullmatch(b, n) for b in buffers)]:
        del tensors[name]


def drop_unused(tensors: dict[str, np.ndarray], unused: dict[str, str], where: str) -> None:
    """Removes the tensors `unused` names (name -> why the model has no place for it), saying
    in one warning what was dropped and why; absent names are ignored."""
    dropped = [name for name in unused if name in tensors]
    for name in dropped:
        del tensors[name]
    if dropped:
        reasons = "; ".join(
            f"{', '.join(n for n in dropped if unused[n] == why)}: {why}"
            for why in dict.fromkeys(unused[n] for n in dropped)
        )
        logging.getLogger(__name__).warning(
            "%s: dropped %d tensors the model has no place for (%s)", where, len(dropped), reasons
        )


def check_all_used(tensors: dict[str, np.ndarray], where: str, family: str) -> None:
    """Raises ConversionError naming the first tensor no tfjax parameter was made of."""
    if tensors:
        unused = sorted(tensors)
        raise ConversionError(
            f"{where}: tensor {unused[0]} (of {len(unused)} unused) has no place in tfjax's "
            f"{family} model: a head or option this import does not support, or a checkpoint "
            "of another architecture"
        )


def check_options(hf: dict, family: str, unsupported: dict, activations: dict, key: str) -> None:
    """ConversionError for a config.json option tfjax's model cannot compute.

    Args:
        hf: config.json.
        family: its model_type, named in messages.
        unsupported: option -> the values tfjax computes (absent options take the first).
        activations: the activation names config.json may give -> tfjax's.
        key: the config.json key of the activation.
    """
    for option, allowed in unsupported.items():
        value = hf.get(option, allowed[0])
        if value not in allowed:
            raise ConversionError(
                f"config.json sets {option}={value!r}, which tfjax's {family} model does not "
                f"compute (supported: {', '.join(repr(a) for a in allowed)})"
            )
    if hf.get(key) not in activations:
        raise ConversionError(
            f"config.json sets {key}={hf.get(key)!r}, an activation tfjax's {family} import "
            f"does not map (supported: {', '.join(activations)})"
        )


def check_head(head: str | None, heads: tuple, family: str) -> None:
    """ConversionError for a `head` the family has not (`heads`; (None,): one output layer
    only, so no head may be named)."""
    if head in heads:
        return
    if heads == (None,):
        raise ConversionError(
            f"head={head!r}: a {family} checkpoint has no {head} head, only its one output "
            "layer (the language model's); convert it without a head (no --head)"
        )
    raise ConversionError(
        f"head={head!r}: a {family} checkpoint has the heads {', '.join(map(repr, heads))}"
    )


def norm(path: str, name: str, d: int, *, bias: bool = True) -> list[Entry]:
    """The rows of a norm: "scale" from `name`.weight (and "bias" from `name`.bias)."""
    rows = [Entry(path + "/scale", (name + ".weight",), ((d,),))]
    return rows + ([Entry(path + "/bias", (name + ".bias",), ((d,),))] if bias else [])


def dense(
    path: str, name: str, d_in: int, d_out: int, layout: str, *, bias: bool = True
) -> list[Entry]:
    """The rows of one dense layer `name` ([out, in] "linear" or [in, out] "kernel")."""
    shape = (d_out, d_in) if layout == "linear" else (d_in, d_out)
    rows = [Entry(path + "/kernel", (name + ".weight",), (shape,), layout)]
    return rows + ([Entry(path + "/bias", (name + ".bias",), ((d_out,),))] if bias else [])


def fused(path: str, names: Iterable[str], d_in: int, d_out: int, *, bias: bool) -> list[Entry]:
    """The rows of a fused tfjax projection made of several torch Linear layers `names`."""
    names = tuple(names)
    rows = [
        Entry(
            path + "/kernel",
            tuple(n + ".weight" for n in names),
            ((d_out, d_in),) * len(names),
            "linear",
        )
    ]
    if bias:
        rows.append(
            Entry(path + "/bias", tuple(n + ".bias" for n in names), ((d_out,),) * len(names))
        )
    return rows


def flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    """{"a": {"b": x}} -> {"a/b": x}."""
    flat = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if hasattr(value, "items"):  # a dict or FrozenDict; arrays have none
            flat.update(flatten(dict(value), path + "/"))
        else:
            flat[path] = value
    return flat


def unflatten(flat: dict[str, object]) -> dict:
    """{"a/b": x} -> {"a": {"b": x}}."""
    tree: dict = {}
    for path, value in flat.items():
        *parents, leaf = path.split("/")
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return tree


def flat_shapes(abstract_params: dict) -> dict[str, tuple[int, ...]]:
    """ "/"-paths to shapes of a parameter tree (arrays or `jax.ShapeDtypeStruct`s)."""
    return {path: tuple(x.shape) for path, x in flatten(abstract_params).items()}
