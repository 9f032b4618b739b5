"""Attention weights of every attention layer of a model, from one forward pass.

Every `MultiHeadAttention` sows its attention probabilities [B, N, L, S] into the Flax
"intermediates" collection when, and only when, that collection is mutable (see
`tfjax.nn.attention.module`): the same model definition serves training, where nothing is
computed, and inspection. `capture` runs a model with the collection mutable and names the maps
by layer, "encoder/layer_0/self_attention", "decoder/layer_1/cross_attention", ...; a scanned
stack's [num_layers, ...] weights are split into the same per-layer names. `example_maps` does
that for one example of any model kind and labels both axes with tokens, for `tfjax.viz`.
`statistics` summarises every layer over many examples: how spread out the attention is
(entropy, the largest weight) and how far apart the scores are (the spread of the logits).

The weights are softmax(scores + bias) over the keys the mask allows, before probability
dropout, recomputed from each layer's own queries and keys by the reference formula
(`core.attention_weights`): they exist whichever attention implementation ran (XLA, cuDNN,
the blocked local window), and rows sum to 1 over the allowed keys.
"""

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tfjax.data import pipeline, tokenizers
from tfjax.models import kinds
from tfjax.nn import stacking
from tfjax.nn.attention import module as attention_module

INTERMEDIATES = attention_module.INTERMEDIATES
ATTENTION_WEIGHTS = attention_module.ATTENTION_WEIGHTS


def capture(
    model: nn.Module, variables: Mapping, *args, method: Any = None, **kwargs
) -> tuple[Any, dict[str, jax.Array]]:
    """`model.apply(variables, *args, **kwargs)` and the attention weights of that call.

    Args:
        model: any tfjax model (or a module holding `MultiHeadAttention`s).
        variables: {"params": ...} (other collections may come along).
        *args, method, **kwargs: as `model.apply` takes them (not `mutable`).

    Returns:
        (the call's output, {layer name: weights [B, N, L, S] float32}) with layer names as in
        `collect`.
    """
    output, state = model.apply(variables, *args, method=method, mutable=[INTERMEDIATES], **kwargs)
    return output, collect(state.get(INTERMEDIATES, {}))


def collect(intermediates: Mapping) -> dict[str, jax.Array]:
    """The attention weights in an "intermediates" collection, by layer name.

    A module path ("decoder", "layer_1", "cross_attention") gives the name
    "decoder/layer_1/cross_attention". A scanned stack sows [num_layers, B, N, L, S] under
    `stacking.SCANNED`; it is split into "layer_0", "layer_1", ... as if unscanned. A module
    called k > 1 times in one apply gives "name#0" ... "name#{k-1}".
    """
    flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(intermediates))
    maps = {}
    for path, sown in flat.items():
        if path[-1] != ATTENTION_WEIGHTS:
            continue
        names = list(path[:-1])
        for call, weights in enumerate(sown):
            suffix = f"#{call}" if len(sown) > 1 else ""
            if stacking.SCANNED not in names:
                maps["/".join(names) + suffix] = weights
                continue
            at = names.index(stacking.SCANNED)
            for layer in range(weights.shape[0]):
                layer_names = [
                    *names[:at],
                    stacking.layer_name(layer, scan=False),
                    *names[at + 1 :],
                ]
                maps["/".join(layer_names) + suffix] = weights[layer]
    return dict(sorted(maps.items(), key=lambda item: _natural_key(item[0])))


def _natural_key(name: str) -> list:
    """Sorts "layer_10" after "layer_9"."""
    return [int(part) if part.isdigit() else part for part in name.replace("_", "/").split("/")]


@dataclasses.dataclass(frozen=True)
class Maps:
    """The attention of one example, ready to draw (`tfjax.viz.attention_heads`).

    Attributes:
        weights: layer name -> [N, L, S] float32 numpy array.
        queries: layer name -> the L token labels of its rows.
        keys: layer name -> the S token labels of its columns.
    """

    weights: dict[str, np.ndarray]
    queries: dict[str, list[str]]
    keys: dict[str, list[str]]

    def layers(self, kind: str) -> list[str]:
        """The names of one kind of layer, in order: "self_attention" or "cross_attention"."""
        return [name for name in self.weights if name.split("/")[-1].split("#")[0] == kind]


def _ids(name: str, ids: Sequence[int] | np.ndarray | None) -> np.ndarray:
    if ids is None:
        raise ValueError(f"this model kind needs {name}= (token ids of one example)")
    array = np.asarray(ids, np.int32)
    if array.ndim != 1 or not array.size:
        raise ValueError(
            f"{name} must be one example's ids, a non-empty [L] list; got {array.shape}"
        )
    return array


def example_maps(
    model: nn.Module,
    params: Any,
    tokenizer: Any,
    *,
    inputs: Sequence[int] | np.ndarray | None = None,
    targets: Sequence[int] | np.ndarray | None = None,
) -> Maps:
    """Every attention map of one example, with token labels on both axes.

    Args:
        model: an `EncoderDecoder` (give `inputs` and `targets`), `DecoderOnly` (`targets`) or
            `EncoderOnly` (`inputs`); its `config.kind` says which.
        params: its parameters.
        tokenizer: the run's tokenizer (for the labels: `tokenizer.pieces`).
        inputs: the source ids, EOS included, no padding.
        targets: the target ids the decoder is teacher-forced with (for a translation: the
            decoded output up to and including EOS; for a prompt: its ids).

    Returns:
        `Maps`. Encoder self-attention: rows and columns are the input tokens. Decoder layers
        read the targets shifted right (BOS first): a decoder row is labelled with the token it
        predicts (`targets[i]`); self-attention columns are the tokens it reads ("<bos>",
        targets[0], ...); cross-attention columns are the input tokens.
    """
    fields = kinds.get(model.config.kind).fields
    args, kwargs, labels = [], {}, {}
    if "inputs" in fields:
        source = _ids("inputs", inputs)
        args.append(jnp.asarray(source[None]))
        kwargs["inputs_segment_ids"] = jnp.ones((1, source.size), jnp.int32)
        labels["encoder"] = tokenizer.pieces(source)
    if "targets" in fields:
        target = _ids("targets", targets)
        args.append(jnp.asarray(target[None]))
        kwargs["targets_segment_ids"] = jnp.ones((1, target.size), jnp.int32)
        labels["predicted"] = tokenizer.pieces(target)
        labels["read"] = tokenizer.pieces([model.config.bos_id, *target[:-1].tolist()])
    _, maps = capture(model, {"params": params}, *args, deterministic=True, **kwargs)
    weights, queries, keys = {}, {}, {}
    for name, value in maps.items():
        weights[name] = np.asarray(value[0])  # [N, L, S]
        layer = name.split("/")[-1].split("#")[0]
        if name.startswith("encoder/"):
            queries[name] = keys[name] = labels["encoder"]
        else:
            queries[name] = labels["predicted"]
            keys[name] = labels["encoder"] if layer == "cross_attention" else labels["read"]
    return Maps(weights, queries, keys)


def until_eos(generated: Sequence[int] | np.ndarray, eos_id: int = tokenizers.EOS_ID) -> list[int]:
    """A decoded row as targets for `example_maps`: its ids up to and including the first EOS
    (`eos_id`: the tokenizer's; all of them when there is none), without the padding after it."""
    out = []
    for token in np.asarray(generated).tolist():
        out.append(int(token))
        if token == eos_id:
            break
    return out


STATISTICS = ("entropy", "max_weight", "logit_std")


def row_statistics(weights: jax.Array, rows: jax.Array) -> dict[str, jax.Array]:
    """Summaries of the attention rows of one layer, summed over the rows that count.

    Per row (one query of one head) over the keys it attends to (weight > 0; masked keys have
    weight exactly 0): the entropy -sum p log p in nats, the largest weight, and the standard
    deviation of the attention logits. Softmax leaves logits less a per-row constant in
    log p, so that deviation is the std of log p over the row's keys; a key whose weight
    underflowed to 0 (a logit more than ~100 below the row's largest) is left out like a
    masked one.

    Args:
        weights: [B, N, L, S] attention probabilities, as `capture` returns them.
        rows: [B, L] bool, the real query positions (not padding).

    Returns:
        {"rows": how many rows count, "entropy", "max_weight", "logit_std": their sums}. A
        row counts when its query is real and it attends to at least two keys (a causal
        row with one key has no spread to measure).
    """
    weights = weights.astype(jnp.float32)
    allowed = weights > 0
    keys = allowed.sum(-1)
    log_p = jnp.where(allowed, jnp.log(jnp.where(allowed, weights, 1.0)), 0.0)
    mean = log_p.sum(-1) / jnp.maximum(keys, 1)
    deviation = jnp.where(allowed, log_p - mean[..., None], 0.0)
    std = jnp.sqrt((deviation**2).sum(-1) / jnp.maximum(keys, 1))
    counted = rows[:, None, :] & (keys >= 2)

    def total(values: jax.Array) -> jax.Array:
        return jnp.where(counted, values, 0.0).sum()

    return {
        "rows": counted.sum(),
        "entropy": total(-(weights * log_p).sum(-1)),
        "max_weight": total(weights.max(-1)),
        "logit_std": total(std),
    }


def statistics(
    model: nn.Module, params: Any, examples: Sequence[pipeline.Example], *, batch_size: int = 64
) -> dict[str, dict[str, float]]:
    """Mean `row_statistics` of every attention layer over `examples`, teacher-forced.

    Args:
        model: any tfjax model; it reads the examples' `inputs` and/or `targets` (with their
            segment ids) as its kind takes them, deterministically (no dropout).
        params: its parameters.
        examples: padded examples of the run's format (`Examples.eval`, for instance).
        batch_size: rows per forward pass (the last batch is padded with padding rows).

    Returns:
        {layer name: {"entropy", "max_weight", "logit_std": means over the rows that count,
        "rows": their number}}, layers named as by `capture`. Encoder layers' rows are the
        input tokens, decoder layers' the target tokens.
    """
    if not examples:
        raise ValueError("no examples to summarise attention over")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    fields = list(kinds.get(model.config.kind).fields)

    @jax.jit
    def sums(params, batch):
        segments = {f"{field}_segment_ids": batch[f"{field}_segment_ids"] for field in fields}
        args = [batch[field] for field in fields]
        _, maps = capture(model, {"params": params}, *args, deterministic=True, **segments)
        out = {}
        for name, weights in maps.items():
            side = "inputs" if name.startswith("encoder/") or "targets" not in fields else "targets"
            out[name] = row_statistics(weights, batch[f"{side}_segment_ids"] > 0)
        return out

    keys = [*fields, *(f"{field}_segment_ids" for field in fields)]
    batch_size = min(batch_size, len(examples))
    totals: dict[str, dict[str, float]] = {}
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        stacked = {key: np.stack([example[key] for example in chunk]) for key in keys}
        batch = pipeline.pad_batch(stacked, batch_size)
        for name, values in jax.device_get(sums(params, batch)).items():
            layer = totals.setdefault(name, dict.fromkeys(("rows", *STATISTICS), 0.0))
            for key, value in values.items():
                layer[key] += float(value)
    return {
        name: {
            **{key: layer[key] / max(layer["rows"], 1.0) for key in STATISTICS},
            "rows": int(layer["rows"]),
        }
        for name, layer in totals.items()
    }
