"""Muon (tfjax.training.muon, optimizer="muon"): Newton-Schulz against numpy and the exact polar
factor, the kernels' matrix axes, the first two updates written out, training and resuming."""

import json
import shutil
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import test_workdir_format
from optax import contrib

from experiments import config_utils
from tfjax import errors
from tfjax.runs import restoration, trainer, workdir_format
from tfjax.training import checkpointing, muon, optim


def _newton_schulz_numpy(u, steps=5):
    """The quintic iteration written out in float64, on a wide (m <= n) copy of u."""
    x = np.asarray(u, np.float64)
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / (np.linalg.norm(x) + 1e-7)
    for _ in range(steps):
        a = x @ x.T
        x = 3.4445 * x + (-4.7750 * a + 2.0315 * a @ a) @ x
    return x.T if tall else x


def _first_direction(tree):
    """`muon.scale_by_muon`'s first update of `tree` taken as the gradient: with one step the
    bias-corrected Nesterov momentum is a positive multiple of the gradient, which the
    Newton-Schulz normalisation drops. Leaves that take no Muon come back unchanged."""
    mask = muon.muon_mask(tree)
    transform = optax.masked(muon.scale_by_muon(0.5), mask)
    out, _ = transform.update(tree, transform.init(tree))
    return out


@pytest.mark.parametrize("shape", [(6, 10), (10, 6), (8, 8)])
def test_newton_schulz_matches_numpy_and_approaches_the_polar_factor(shape):
    u = np.random.default_rng(0).normal(size=shape)
    tree = {"mlp": {"wi": {"kernel": jnp.asarray(u, jnp.float32)}}}
    got = _first_direction(tree)["mlp"]["wi"]["kernel"] / np.sqrt(max(1, shape[1] / shape[0]))
    np.testing.assert_allclose(got, _newton_schulz_numpy(u), atol=2e-5)
    # The polar factor U V^T of u = U S V^T; Newton-Schulz leaves singular values in ~[0.6, 1.2].
    left, _, right = np.linalg.svd(u, full_matrices=False)
    singular = np.linalg.svd(got, compute_uv=False)
    assert singular.min() > 0.6 and singular.max() < 1.25, singular
    polar = left @ right
    cosine = np.sum(got * polar) / np.linalg.norm(got) / np.linalg.norm(polar)
    assert cosine > 0.95, cosine


def _kernel_tree():
    rng = np.random.default_rng(1)
    r = lambda *s: jnp.asarray(rng.normal(size=s), jnp.float32)  # noqa: E731
    return {
        "embed": {"embedding": r(11, 8)},
        "decoder": {
            "layer_0": {
                "self_attention": {
                    "qkv": {"kernel": r(8, 6, 4), "bias": r(6, 4)},
                    "out": {"kernel": r(2, 4, 8), "bias": r(8)},
                },
                "cross_attention": {"query": {"kernel": r(8, 2, 4)}, "kv": {"kernel": r(8, 4, 4)}},
                "mlp": {"wi": {"kernel": r(8, 16)}, "wo": {"kernel": r(16, 8)}},
                "mlp_residual": {"norm": {"scale": r(8)}},
            },
            # A scanned stack of 3 layers: the layer axis comes first.
            "layers": {
                "mlp": {"wi_gate": {"kernel": r(3, 8, 16)}},
                "self_attention": {"out": {"kernel": r(3, 2, 4, 8)}},
            },
        },
        "pooler": {"kernel": r(8, 8)},
        "classifier": {"kernel": r(8, 3)},
    }


def test_muon_dimensions_names_the_hidden_kernels_and_their_fan_in():
    axes = {
        jax.tree_util.keystr(p): a
        for p, a in jax.tree_util.tree_leaves_with_path(
            muon.muon_dimensions(_kernel_tree()),
            is_leaf=lambda x: x is None or isinstance(x, muon.MuonDimensionNumbers),
        )
    }
    layer = "['decoder']['layer_0']"
    D = muon.MuonDimensionNumbers  # reduction axes = fan-in, output axes = fan-out
    expected = {
        f"{layer}['self_attention']['qkv']['kernel']": D((0,), (1, 2)),
        f"{layer}['self_attention']['out']['kernel']": D((0, 1), (2,)),
        f"{layer}['cross_attention']['query']['kernel']": D((0,), (1, 2)),
        f"{layer}['cross_attention']['kv']['kernel']": D((0,), (1, 2)),
        f"{layer}['mlp']['wi']['kernel']": D((0,), (1,)),
        f"{layer}['mlp']['wo']['kernel']": D((0,), (1,)),
        "['decoder']['layers']['mlp']['wi_gate']['kernel']": D((1,), (2,)),
        "['decoder']['layers']['self_attention']['out']['kernel']": D((1, 2), (3,)),
    }
    assert {k: v for k, v in axes.items() if v is not None} == expected
    # Embeddings, heads, biases and norm scales keep Adam.
    assert axes["['embed']['embedding']"] is None and axes["['pooler']['kernel']"] is None
    assert axes[f"{layer}['self_attention']['qkv']['bias']"] is None


def test_kernels_are_orthogonalised_over_fan_in_and_fan_out_and_layers_apart():
    tree = _kernel_tree()
    got = _first_direction(tree)
    layer, got_layer = tree["decoder"]["layer_0"], got["decoder"]["layer_0"]
    out = layer["self_attention"]["out"]["kernel"]  # [N=2, H=4, D=8]
    want = _newton_schulz_numpy(np.asarray(out).reshape(8, 8)).reshape(2, 4, 8)
    np.testing.assert_allclose(got_layer["self_attention"]["out"]["kernel"], want, atol=2e-5)
    qkv = layer["self_attention"]["qkv"]["kernel"]  # [D=8, 6, 4]: wide
    want = _newton_schulz_numpy(np.asarray(qkv).reshape(8, 24)) * np.sqrt(24 / 8)
    np.testing.assert_allclose(
        got_layer["self_attention"]["qkv"]["kernel"], want.reshape(8, 6, 4), atol=5e-5
    )
    stacked = tree["decoder"]["layers"]["mlp"]["wi_gate"]["kernel"]  # [3, 8, 16]
    for i in range(3):
        want = _newton_schulz_numpy(np.asarray(stacked[i])) * np.sqrt(2.0)
        np.testing.assert_allclose(
            got["decoder"]["layers"]["mlp"]["wi_gate"]["kernel"][i], want, atol=5e-5
        )
    # The rest (embeddings, heads, biases) is not Muon's: it passes through unchanged.
    np.testing.assert_array_equal(got["embed"]["embedding"], tree["embed"]["embedding"])


def _muon_config(**fields) -> optim.OptimConfig:
    """Constant learning rates: 0.01 for the Adam part, 0.05 for Muon."""
    constant = dict(schedule="constant", warmup_steps=0, learning_rate=0.01)
    return optim.OptimConfig(optimizer="muon", muon_learning_rate=0.05, **constant, **fields)


def test_the_first_two_updates_written_out():
    config = _muon_config(muon_momentum=0.9, b1=0.9, b2=0.99, eps=1e-8)
    optimizer, _ = optim.make_optimizer(config, d_model=8)
    rng = np.random.default_rng(2)
    params = {"mlp": {"wi": {"kernel": jnp.zeros((4, 6)), "bias": jnp.zeros(6)}}}
    grads = [
        {
            "mlp": {
                "wi": {
                    "kernel": jnp.asarray(rng.normal(size=(4, 6)), jnp.float32),
                    "bias": jnp.asarray(rng.normal(size=6), jnp.float32),
                }
            }
        }
        for _ in range(2)
    ]
    state = optimizer.init(params)
    updates = []
    for g in grads:
        update, state = optimizer.update(g, state, params)
        updates.append(update)
    g1, g2 = (np.asarray(g["mlp"]["wi"]["kernel"], np.float64) for g in grads)
    m1 = 0.1 * g1
    m2 = 0.9 * m1 + 0.1 * g2
    scale = np.sqrt(6 / 4)
    # Nesterov with Adam's bias correction (optax): at step t, beta M_t / (1 - beta^(t+1)) +
    # (1 - beta) G_t / (1 - beta^t).
    ahead1 = 0.9 * m1 / (1 - 0.9**2) + 0.1 * g1 / (1 - 0.9)
    ahead2 = 0.9 * m2 / (1 - 0.9**3) + 0.1 * g2 / (1 - 0.9**2)
    for update, ahead in zip(updates, (ahead1, ahead2), strict=True):
        want = -0.05 * scale * _newton_schulz_numpy(ahead)
        np.testing.assert_allclose(update["mlp"]["wi"]["kernel"], want, atol=5e-6)
    # The bias takes Adam at learning_rate: its first step is -lr * g / (|g| + eps).
    b1 = np.asarray(grads[0]["mlp"]["wi"]["bias"])
    np.testing.assert_allclose(updates[0]["mlp"]["wi"]["bias"], -0.01 * np.sign(b1), rtol=1e-5)


def test_muon_weight_decay_reaches_both_parts():
    config = _muon_config(weight_decay=0.1, weight_decay_params="matrices")
    optimizer, _ = optim.make_optimizer(config, d_model=8)
    params = {
        "embed": {"embedding": jnp.full((3, 4), 2.0)},
        "mlp": {"wo": {"kernel": jnp.full((4, 4), 2.0), "bias": jnp.full(4, 2.0)}},
    }
    zeros = jax.tree.map(jnp.zeros_like, params)
    update, _ = optimizer.update(zeros, optimizer.init(params), params)
    np.testing.assert_allclose(update["mlp"]["wo"]["kernel"], -0.05 * 0.1 * 2.0, rtol=1e-5)
    np.testing.assert_allclose(update["embed"]["embedding"], -0.01 * 0.1 * 2.0, rtol=1e-5)
    np.testing.assert_allclose(update["mlp"]["wo"]["bias"], 0.0)


def test_muon_is_refused_in_a_vectorised_sweep_and_checks_its_fields():
    with pytest.raises(errors.ConfigError, match=r"muon.*vectorised"):
        optim.traced_structure([optim.OptimConfig(optimizer="muon")])
    with pytest.raises(errors.ConfigError, match="muon_momentum"):
        optim.OptimConfig(optimizer="muon", muon_momentum=1.0)
    with pytest.raises(errors.ConfigError, match="muon_learning_rate"):
        optim.OptimConfig(optimizer="muon", muon_learning_rate=0.0)


@pytest.mark.parametrize(
    "spec, scan",
    [
        pytest.param("configs/base.py:tiny", False, marks=pytest.mark.slow),
        ("configs/lm.py:tiny", True),
        pytest.param("configs/classify.py:tiny", False, marks=pytest.mark.slow),
    ],
)
def test_every_model_kind_trains_with_muon_and_resumes_exactly(spec, scan, tmp_path):
    flags = ["optim.optimizer=muon", f"model.scan_layers={scan}"]
    straight = config_utils.load_config(spec, [*flags, "train.num_train_steps=6"])
    assert np.isfinite(trainer.train_and_evaluate(straight, tmp_path / "straight")["loss"])
    first = config_utils.load_config(spec, [*flags, "train.num_train_steps=4"])
    trainer.train_and_evaluate(first, tmp_path / "resumed")
    trainer.train_and_evaluate(straight, tmp_path / "resumed")  # resumes at step 4

    def params(run):
        config = workdir_format.load_config_json(tmp_path / run / "config.json")
        return restoration.restore(config, tmp_path / run)[1].state.params

    want, got = params("straight"), params("resumed")
    jax.tree.map(np.testing.assert_array_equal, want, got)
    mask = jax.tree.leaves(muon.muon_mask(want))
    assert 0 < sum(mask) < len(mask)  # hidden kernels take Muon, the rest Adam


class _FormerMuonState(NamedTuple):
    """The former hand-written Muon's state, written out here: its momentum buffer only."""

    momentum: optax.Updates


def _is_optax_muon(node):
    return isinstance(node, tuple) and len(node) == 2 and isinstance(node[0], contrib.MuonState)


def _write_former_muon_workdir(tmp_path, state_class=_FormerMuonState, recorded=True):
    """A 2-step Muon run, then a copy of its workdir whose checkpoint holds the optimizer state
    as the former Muon wrote it: each (optax MuonState, EmptyState) chain replaced by
    `state_class(momentum)`, with a momentum unlike optax's (random); `recorded=False`: its
    config.json and checkpoint without the workdir format record, as the tfjax of the former
    Muon wrote them. Returns (config, the saved state, the copy's workdir)."""
    flags = ["optim.optimizer=muon", "model.scan_layers=False", "train.num_train_steps=2"]
    config = config_utils.load_config("configs/lm.py:tiny", flags)
    trainer.train_and_evaluate(config, tmp_path / "new")
    _, restored = restoration.restore(config, tmp_path / "new")
    keys = iter(jax.random.split(jax.random.key(7), 1000))

    def former(node):
        if not _is_optax_muon(node):
            return node
        momentum = jax.tree.map(
            lambda m: jax.random.normal(next(keys), m.shape, m.dtype), node[0].mu
        )
        return state_class(momentum)

    opt_state = jax.tree.map(former, restored.state.opt_state, is_leaf=_is_optax_muon)
    old = restored.state.replace(opt_state=opt_state)
    workdir = tmp_path / "old"
    workdir.mkdir()
    for name in ("config.json", "tokenizer.json"):  # a workdir's tokenizer is never rebuilt
        shutil.copy(tmp_path / "new" / name, workdir / name)
    saved = restored.config
    if not recorded:
        saved = {k: v for k, v in saved.items() if k != workdir_format.FORMAT_RECORD}
        tree = json.loads((workdir / "config.json").read_text())
        test_workdir_format.write_older(workdir / "config.json", tree)
    with checkpointing.Checkpointer(workdir / "checkpoints") as checkpointer:
        checkpointer.save(
            restored.step, old, rng=restored.rng, data_state=restored.data_state, config=saved
        )
    return config, old, workdir


def test_a_workdir_of_the_former_muon_is_refused_in_one_line(tmp_path):
    config, _, workdir = _write_former_muon_workdir(tmp_path, recorded=False)
    before = sorted(p.name for p in (workdir / "checkpoints").iterdir())
    test_workdir_format.assert_refused(workdir / "config.json")
    with pytest.raises(errors.WorkdirError, match=r"written by tfjax 0\.2\.0 or earlier"):
        restoration.restore(config, workdir)  # its checkpoints are of the older format too
    resumed = config_utils.load_config(
        "configs/lm.py:tiny",
        ["optim.optimizer=muon", "model.scan_layers=False", "train.num_train_steps=3"],
    )
    with pytest.raises(errors.WorkdirError, match=r"written by tfjax 0\.2\.0 or earlier"):
        trainer.train_and_evaluate(resumed, workdir)
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == before


def test_an_unknown_optimizer_layout_still_stops_with_the_one_line_error(tmp_path):
    class Unknown(NamedTuple):
        velocity: optax.Updates

    config, _, workdir = _write_former_muon_workdir(tmp_path, state_class=Unknown)
    with pytest.raises(checkpointing.CheckpointRestoreError) as raised:
        restoration.restore(config, workdir)
    message = str(raised.value)
    assert "\n" not in message
    assert isinstance(raised.value, checkpointing.CheckpointMismatchError)  # not damage
    # No config key or tokenizer explains an optimizer state of another structure, so the
    # restore's own error stands (runs.provenance names a culprit only when one explains it).
    assert "does not fit the state this run restores (state.opt_state" in message
    assert "not in the checkpoint" in message and "not damaged" in message
    assert (workdir / "checkpoints" / "2").is_dir()  # left as it was
