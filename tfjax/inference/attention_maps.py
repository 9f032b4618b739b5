"""Attention weights of every attention layer of a model, from one forward pass.

Every `MultiHeadAttention` sows its attention probabilities [B, N, L, S] into the Flax
"intermediates" collection when, and only when, that collection is mutable (see
`tfjax.nn.attention.module`): the same model definition serves training, where nothing is
computed, and inspection. `capture` runs a model with the collection mutable and names the maps
by layer, "encoder/layer_0/self_attention", "decoder/layer_1/cross_attention", ...; a scanned
stack's [num_layers, ...] weights are split into the same per-layer names. `example_maps` does
that for one example of any model kind and labels both axes with tokens, for `tfjax.viz`.

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

from tfjax.data import tokenizers
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
    kind = model.config.kind
    args, kwargs, labels = [], {}, {}
    if kind in ("encoder_decoder", "encoder_only"):
        source = _ids("inputs", inputs)
        args.append(jnp.asarray(source[None]))
        kwargs["inputs_segment_ids"] = jnp.ones((1, source.size), jnp.int32)
        labels["encoder"] = tokenizer.pieces(source)
    if kind in ("encoder_decoder", "decoder_only"):
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
