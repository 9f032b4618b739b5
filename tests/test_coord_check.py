"""μP's coordinate check (Yang, Hu et al. 2022, "Tensor Programs V", §D.1; gpt-neox's
`coord_check`): train a few Adam steps at several widths and compare each layer's activation
RMS across widths. Under μP (base width 64) it stays within a band; under the standard
parametrization the layers after the first updates grow with the width. Fails when a μP
multiplier is dropped (tests/mutations.py: `mup_lr_multiplier`, `mup_readout`,
`mup_attention`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from mup_runs import batch, config, train

from tfjax import models

BASE = 64
# The activations compared: the modules' outputs (flax's captured intermediates) by path.
LAYERS = {
    "attention": ("decoder", "layer_0", "self_attention"),
    "mlp": ("decoder", "layer_0", "mlp"),
    "logits": (),
}


def _cfg(width: int, parametrization: str):
    return config(
        kind="decoder_only",
        vocab_size=32,
        embed_dim=width,
        mlp_dim=2 * width,
        num_heads=2,
        norm_position="pre",
        positional="learned",
        scale_embeddings=False,
        parametrization=parametrization,
        base_width=BASE,
    )


def activation_rms(width: int, parametrization: str, num_steps: int) -> dict[str, float]:
    """RMS of each of `LAYERS`' outputs after `num_steps` Adam steps at LR 0.02."""
    cfg = _cfg(width, parametrization)
    _, _, state = train(cfg, num_steps, lr=0.02)
    data = batch("decoder_only", vocab=cfg.vocab_size)
    logits, found = models.create_model(cfg).apply(
        {"params": state.params},
        data["targets"],
        targets_segment_ids=data["targets_segment_ids"],
        capture_intermediates=True,
        mutable=["intermediates"],
    )
    out = {}
    for name, path in LAYERS.items():
        node = found["intermediates"]
        for key in path:
            node = node[key]
        value = logits if not path else node["__call__"][0]
        out[name] = float(jnp.sqrt(jnp.mean(jnp.square(value.astype(jnp.float32)))))
    return out


def _check(widths, num_steps):
    """Trains μP and standard models at `widths` (the base width, where both are the same
    model, once) and checks the band and the growth; returns the two RMS tables."""
    base = activation_rms(widths[0], "mup", num_steps)
    mup = {widths[0]: base} | {w: activation_rms(w, "mup", num_steps) for w in widths[1:]}
    sp = {widths[0]: base} | {w: activation_rms(w, "standard", num_steps) for w in widths[1:]}
    for layer in LAYERS:  # μP: within a band across widths
        values = [mup[w][layer] for w in widths]
        assert max(values) / min(values) < 1.6, (layer, mup)
    # The standard parametrization: the logits and the hidden layers' outputs grow (by 2.3-4.2x
    # from 64 to 256 after 2 steps; the band above is 1.6).
    factor = (widths[-1] / widths[0]) ** 0.5
    for layer in LAYERS:
        assert sp[widths[-1]][layer] / base[layer] > factor, (layer, sp)
    return mup, sp


@pytest.mark.slow  # ~10 s on a quiet 2-core CPU; the default tier's siblings are below
def test_coordinate_check_two_widths():
    """Widths 64 and 256, 2 steps."""
    _check((64, 256), num_steps=2)


@pytest.mark.slow
def test_coordinate_check_64_to_512():
    _check((64, 128, 256, 512), num_steps=4)


def _init(cfg):
    data = batch("decoder_only", vocab=cfg.vocab_size)
    params = models.create_model(cfg).init(
        jax.random.key(0), data["targets"], targets_segment_ids=data["targets_segment_ids"]
    )["params"]
    return params, data


def test_the_readout_is_scaled_by_base_over_width(monkeypatch):
    """The default tier's sibling for the readout: at 4x the base width the μP model's logits
    (tied, no bias) are the standard model's / 4 on the same parameters, the attention's
    multiplier (tested below) held at 1."""
    from tfjax.models import mup as model_mup

    monkeypatch.setattr(model_mup, "query_multiplier", lambda cfg: 1.0)
    standard, mup = _cfg(256, "standard"), _cfg(256, "mup")
    params, data = _init(standard)
    args = (data["targets"],)
    kwargs = {"targets_segment_ids": data["targets_segment_ids"]}
    sp_logits = models.create_model(standard).apply({"params": params}, *args, **kwargs)
    mup_logits = models.create_model(mup).apply({"params": params}, *args, **kwargs)
    np.testing.assert_allclose(mup_logits, sp_logits / 4, rtol=2e-5, atol=1e-6)


def _logit_spread(cfg, params) -> float:
    """The spread (std over the keys) of the last query's attention logits, read from the
    attention probabilities the model sows (log p = logits - a constant per row), averaged."""
    data = batch("decoder_only", vocab=cfg.vocab_size)
    _, found = models.create_model(cfg).apply(
        {"params": params},
        data["targets"],
        targets_segment_ids=data["targets_segment_ids"],
        mutable=["intermediates"],
    )
    (weights,) = jax.tree.leaves(found["intermediates"])  # [B, N, L, S]
    return float(jnp.mean(jnp.std(jnp.log(weights[:, :, -1, :]), axis=-1)))


def test_attention_logits_scale_as_one_over_head_dim():
    """At 4x the base width the μP model's attention logits are the standard model's times
    sqrt(base / width) = 1/2 on the same parameters: q·k/H · sqrt(H_base) against q·k/sqrt(H)."""
    standard, mup = _cfg(256, "standard"), _cfg(256, "mup")
    params, _ = _init(standard)
    ratio = _logit_spread(mup, params) / _logit_spread(standard, params)
    np.testing.assert_allclose(ratio, 0.5, rtol=1e-3)
