"""tfjax's μP against an independent reference, Microsoft's `mup` package (PyTorch; the
`parity` extra), on the same shapes: a one-layer decoder's parameters at widths 32, 64, 128
with base width 32. Per parameter: the Adam learning-rate multiplier (`mup.MuAdam`'s parameter
groups against `tfjax.training.mup.lr_multipliers`) and how the init scale (the readout's with
its forward multiplier) grows with the width."""

import math

import jax
import numpy as np
import pytest
from mup_runs import config

from tfjax import models
from tfjax.models import mup as model_mup
from tfjax.runs import validation
from tfjax.training import mup as train_mup

torch = pytest.importorskip("torch", reason="the parity extra: pip install 'tfjax[parity]'")
mup = pytest.importorskip("mup", reason="the parity extra: pip install 'tfjax[parity]'")
pytestmark = pytest.mark.slow  # torch, mup and three widths' models: ~10 s on a quiet CPU

BASE, WIDTHS, VOCAB = 32, (32, 64, 128), 13
# tfjax's parameter path -> the reference module's parameter name.
NAMES = {
    "embed/embedding": "embed.weight",
    "decoder/layer_0/self_attention/qkv/kernel": "qkv.weight",
    "decoder/layer_0/self_attention/qkv/bias": "qkv.bias",
    "decoder/layer_0/self_attention/out/kernel": "out.weight",
    "decoder/layer_0/mlp/wi/kernel": "wi.weight",
    "decoder/layer_0/mlp/wo/kernel": "wo.weight",
    "decoder/layer_0/mlp/wo/bias": "wo.bias",
    "decoder/final_norm/scale": "norm.weight",
    "logits_dense/kernel": "readout.weight",
}


class _Reference(torch.nn.Module):
    """The same shapes in PyTorch, μP by `mup`: hidden `Linear`s, `MuReadout`."""

    def __init__(self, width: int):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, width)
        self.wi = torch.nn.Linear(width, 2 * width)
        self.wo = torch.nn.Linear(2 * width, width)
        self.norm = torch.nn.LayerNorm(width)
        self.readout = mup.MuReadout(width, VOCAB)


def _reference(width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    model = _Reference(width)
    return mup.set_base_shapes(model, _Reference(BASE), delta=_Reference(2 * BASE))


def _cfg(width: int):
    return config(
        kind="decoder_only",
        vocab_size=VOCAB,
        embed_dim=width,
        mlp_dim=2 * width,
        num_heads=2,
        tie_output=False,
        norm_position="pre",
        positional="learned",
        scale_embeddings=False,
        parametrization="mup",
        base_width=BASE,
    )


def _paths(tree) -> dict:
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {"/".join(k.key for k in path): leaf for path, leaf in flat}


def test_the_learning_rate_multipliers_are_the_mup_packages():
    for width in WIDTHS:
        reference = _reference(width)
        groups = mup.MuAdam(reference.parameters(), lr=1.0).param_groups
        theirs = {id(p): group["lr"] for group in groups for p in group["params"]}
        by_name = dict(reference.named_parameters())
        cfg = _cfg(width)
        fn = train_mup.lr_multipliers(cfg)
        params = validation.abstract_params(cfg)
        ours = _paths(fn(params)) if fn else {k: 1.0 for k in _paths(params)}
        for path, name in NAMES.items():
            assert ours[path] == pytest.approx(theirs[id(by_name[name])]), (width, path)


def _std(x) -> float:
    return float(np.std(np.asarray(x, np.float64)))


def _slope(stds: list[float]) -> float:
    """The exponent a of std ∝ width^a over `WIDTHS` (least squares in log-log)."""
    return float(np.polyfit(np.log(WIDTHS), np.log(stds), 1)[0])


def test_the_init_scales_grow_with_the_width_as_the_mup_packages():
    """Hidden matrices ∝ width^-1/2, the token table and norms constant, in both; the readout
    with its multiplier ∝ width^-1 in `mup` (constant-variance weights / width) and
    width^-1.5 in tfjax (LeCun-normal weights / width: the base model's own init, still μP,
    whose readout may start anywhere from zero up to mup's scale)."""
    ours, theirs = {k: [] for k in NAMES}, {k: [] for k in NAMES}
    for width in WIDTHS:
        cfg = _cfg(width)
        data = jax.numpy.ones((2, 4), jax.numpy.int32)
        params = _paths(models.create_model(cfg).init(jax.random.key(0), data)["params"])
        reference = dict(_reference(width).named_parameters())
        readout = model_mup.readout_multiplier(cfg)
        for path, name in NAMES.items():
            scale = readout if name == "readout.weight" else 1.0
            ours[path].append(_std(params[path]) * scale)
            mult = 1 / reference["readout.weight"].infshape.width_mult()
            ref_scale = mult if name == "readout.weight" else 1.0
            theirs[path].append(_std(reference[name].detach().numpy()) * ref_scale)
    for path in NAMES:
        if path.endswith("bias") or path.endswith("scale"):
            continue  # zeros and ones in tfjax: no spread to compare
        if path == "logits_dense/kernel":
            assert _slope(theirs[path]) == pytest.approx(-1.0, abs=0.1)
            assert _slope(ours[path]) == pytest.approx(-1.5, abs=0.1)
            continue
        assert _slope(ours[path]) == pytest.approx(_slope(theirs[path]), abs=0.1), path
    assert math.isclose(_slope(ours["decoder/layer_0/mlp/wi/kernel"]), -0.5, abs_tol=0.1)
