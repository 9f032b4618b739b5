"""The corpus recipes (configs/multi30k.py, shakespeare_char.py, listops.py, wmt14.py) build and
run end to end on small local corpora; checkpoint averaging and window-sampled LM loss."""

import importlib
import pathlib

import jax
import numpy as np
import pytest
import tiny_runs

from experiments import config_utils
from tfjax import errors, models
from tfjax.data import datasets, sources
from tfjax.runs import evaluator, restoration, trained, trainer, validation, workdir_format
from tfjax.training import checkpointing, optim

SENTENCES = [
    ("A man rides a horse on the beach .", "Ein Mann reitet ein Pferd am Strand ."),
    ("Two dogs play in the snow .", "Zwei Hunde spielen im Schnee ."),
    ("A girl in a red dress sings .", "Ein Mädchen in einem roten Kleid singt ."),
    ("The men are fishing from a boat .", "Die Männer angeln von einem Boot aus ."),
]
RECIPES = [
    "configs/multi30k.py:base",
    "configs/multi30k.py:cpu",
    "configs/shakespeare_char.py:cpu",
    "configs/shakespeare_char.py:hour",
    "configs/shakespeare_char.py:gpu",
    "configs/listops.py:base",
    "configs/listops.py:cpu",
    "configs/wmt14.py:base",
    "configs/wmt14.py:big",
]


def _every_preset() -> list[str]:
    """Every shipped config file with each of its presets (and none)."""
    specs = []
    for path in sorted(pathlib.Path(__file__).resolve().parents[1].glob("configs/*.py")):
        module = importlib.import_module(f"configs.{path.stem}")
        if hasattr(module, "get_config"):
            presets = [None, *getattr(module, "PRESETS", {})]
            specs += [f"configs/{path.name}" + (f":{p}" if p else "") for p in presets]
    return specs


@pytest.mark.parametrize("spec", RECIPES)
def test_recipe_configs_build(spec):
    config = config_utils.load_config(spec, [])
    models.ModelConfig(**{**config.model.to_dict(), "vocab_size": 100})
    datasets.DataConfig(**config.data)
    optim.OptimConfig(**{**config.optim.to_dict(), "decay_steps": 10**6})


@pytest.mark.parametrize("spec", _every_preset())
def test_every_shipped_config_passes_the_run_check(spec):
    validation.check_config(config_utils.load_config(spec, []))  # model.vocab_size 0: from the data


def _param_counts(spec: str) -> dict[str, int]:
    """Parameters of the preset's model (vocabulary 100) by top-level kind: mlp, pos, other."""
    config = config_utils.load_config(spec, [])
    cfg = models.ModelConfig(**{**config.model.to_dict(), "vocab_size": 100})
    tokens = jax.ShapeDtypeStruct((1, 8), np.int32)
    args = (tokens,) if cfg.kind == "decoder_only" else (tokens, tokens)
    params = jax.eval_shape(models.create_model(cfg).init, jax.random.key(0), *args)["params"]
    counts = {"mlp": 0, "pos": 0, "other": 0}
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        names = "/".join(str(getattr(k, "key", k)) for k in path)
        kind = "mlp" if "/mlp/" in names else "pos" if "pos_embedding" in names else "other"
        counts[kind] += leaf.size
    return counts


@pytest.mark.parametrize(
    "base, rope",
    [
        ("configs/shakespeare_char.py:hour_muon", "configs/shakespeare_char.py:hour_rope_swiglu"),
        ("configs/multi30k.py:hour_long", "configs/multi30k.py:hour_rope_swiglu"),
    ],
)
def test_rope_swiglu_presets_keep_the_feed_forward_budget_and_drop_position_tables(base, rope):
    before, after = _param_counts(base), _param_counts(rope)
    assert after["mlp"] == pytest.approx(before["mlp"], rel=0.01)  # SwiGLU at GELU/ReLU's size
    assert after["pos"] == 0  # rotary: no learned table
    assert after["other"] == before["other"]  # attention, norms, embeddings unchanged


def test_shakespeare_ctx256_changes_only_the_context_at_the_same_characters_per_step():
    base = config_utils.load_config("configs/shakespeare_char.py:hour_rope_swiglu", [])
    long = config_utils.load_config("configs/shakespeare_char.py:hour_ctx256", [])
    predicted = [  # a window of max_target_len characters scores max_target_len - 1 of them
        c.train.global_batch_size * (c.data.max_target_len - 1) for c in (base, long)
    ]
    assert predicted == [4096, 4096] and long.data.max_target_len - 1 == 256  # nanoGPT's
    assert long.model == base.model and long.optim == base.optim
    changed = {"data.max_target_len", "train.global_batch_size", "train.num_train_steps"}
    for section in ("data", "train"):
        for key, value in base[section].items():
            if f"{section}.{key}" not in changed:
                assert long[section][key] == value, (section, key)


def test_the_run_check_refuses_a_vocabulary_of_one():
    config = config_utils.load_config("configs/base.py:tiny", ["model.vocab_size=1"])
    with pytest.raises(errors.ConfigError, match="vocab_size must be >= 2"):
        validation.check_config(config)


@pytest.fixture(scope="module")
def multi30k_workdir(tmp_path_factory):
    """A run trained on a stand-in Multi30k, whose sums count as the shipped ones while the
    module's tests use it (evaluating reads the data again)."""
    root = tmp_path_factory.mktemp("data")
    files = {}
    for split in sources.MULTI30K_SPLITS:
        files[f"multi30k/{split}.en"] = "".join(f"{s}\n" for s, _ in SENTENCES * 4)
        files[f"multi30k/{split}.de"] = "".join(f"{t}\n" for _, t in SENTENCES * 4)
    with pytest.MonkeyPatch.context() as monkeypatch:
        tiny_runs.write_corpus(monkeypatch, root, files)
        overrides = [f"data.dir={root}", "train.num_train_steps=8"]
        config = config_utils.load_config("configs/multi30k.py:tiny", overrides)
        path = tmp_path_factory.mktemp("multi30k")
        result = trainer.train_and_evaluate(config, path)
        assert 0 <= result["greedy_bleu"] <= 100
        yield path


@pytest.mark.slow
def test_multi30k_recipe_trains_and_evaluates_test2016_with_averaging(multi30k_workdir):
    record = evaluator.evaluate_workdir(
        multi30k_workdir, split="test2016", beam_size=2, average_last=2
    )
    assert record["split"] == "test2016" and record["averaged_checkpoints"] == 2
    assert record["num_examples"] == 16 and 0 <= record["bleu"] <= 100
    hypotheses = (multi30k_workdir / record["hypotheses"]).read_text().splitlines()
    assert len(hypotheses) == 16
    with pytest.raises(trained.WorkdirError, match="keep_checkpoints >= 9"):
        evaluator.evaluate_workdir(multi30k_workdir, split="val", average_last=9)
    with pytest.raises(trained.WorkdirError, match="unknown split 'test2017'"):
        evaluator.evaluate_workdir(multi30k_workdir, split="test2017")


@pytest.mark.slow
def test_checkpoint_average_is_the_mean_of_the_saved_parameters(multi30k_workdir):
    config = workdir_format.load_config_json(multi30k_workdir / "config.json")
    run, _ = restoration.restore(config, multi30k_workdir)
    with checkpointing.Checkpointer(multi30k_workdir / "checkpoints") as checkpointer:
        steps = checkpointer.all_steps()[-2:]
        first, second = (checkpointer.restore(run.abstract_state, step=s) for s in steps)
        averaged = checkpointer.restore_average(run.abstract_state, last=2)
    assert averaged.step == steps[-1]
    expected = jax.tree.map(lambda a, b: (a + b) / 2, first.state.params, second.state.params)
    for want, got in zip(
        jax.tree.leaves(expected), jax.tree.leaves(averaged.state.params), strict=True
    ):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    different = [
        not np.array_equal(a, b)
        for a, b in zip(
            jax.tree.leaves(first.state.params), jax.tree.leaves(second.state.params), strict=True
        )
    ]
    assert any(different)  # the two checkpoints really differ, so the test can fail


@pytest.mark.slow
def test_shakespeare_recipe_scores_the_whole_val_split(tmp_path, fake_corpus):
    line = "FIRST CITIZEN:\nWe are accounted poor citizens, line {}.\n"
    text = "".join(line.format(i) for i in range(60))
    root = fake_corpus(tmp_path / "data", {"tinyshakespeare/input.txt": text})
    config = config_utils.load_config(
        "configs/shakespeare_char.py:tiny", [f"data.dir={root}", "train.max_eval_examples=0"]
    )
    result = trainer.train_and_evaluate(config, tmp_path / "run")
    assert np.isfinite(result["nll"])
    run, _ = restoration.restore(config, tmp_path / "run")
    val = text[int(0.9 * len(text)) :]
    # Every val character after the first is scored exactly once.
    weights = sum(int(e["targets_weights"].sum()) for e in run.examples.eval)
    assert weights == len(val) - 1
    record = evaluator.evaluate_workdir(tmp_path / "run", sample_windows=64)
    assert record["sampled_windows"] == 64 and np.isfinite(record["sampled_nll"])
    assert record["nll"] == pytest.approx(result["nll"], rel=1e-5)


def test_listops_recipe_runs(tmp_path):
    config = config_utils.load_config("configs/listops.py:tiny", [])
    result = trainer.train_and_evaluate(config, tmp_path)
    assert 0 <= result["accuracy"] <= 1


@pytest.mark.slow
def test_wmt14_pipeline_runs_on_a_local_sample(tmp_path):
    pytest.importorskip("datasets", reason="the hub extra (Hugging Face datasets) is missing")
    import json

    for split in ("train", "validation"):
        records = [{"translation": {"en": s, "de": t}} for s, t in SENTENCES * 4]
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    overrides = [
        "data.hub_name=json",
        f"data.train_path={tmp_path / 'train.jsonl'}",
        f"data.eval_path={tmp_path / 'validation.jsonl'}",
    ]
    config = config_utils.load_config("configs/wmt14.py:tiny", overrides)
    result = trainer.train_and_evaluate(config, tmp_path / "run")
    assert 0 <= result["greedy_bleu"] <= 100


def _every_sweep() -> list[tuple[str, str]]:
    """(config file, sweep name) for every sweep a shipped config file defines."""
    pairs = []
    for spec in _every_preset():
        if ":" not in spec:
            module = importlib.import_module(f"configs.{pathlib.Path(spec).stem}")
            pairs += [(spec, name) for name in getattr(module, "SWEEPS", {})]
    return pairs


@pytest.mark.parametrize(("spec", "sweep_name"), _every_sweep())
def test_every_shipped_sweep_expands_to_runs_that_pass_the_run_check(spec, sweep_name, tmp_path):
    from experiments import sweep_runs

    runs = sweep_runs.expand(spec, sweep_name, [], tmp_path)
    assert runs and len({run.name for run in runs}) == len(runs)
    for run in runs:
        validation.check_config(run.config)
        for key, value in run.overrides.items():
            group, field = key.split(".") if "." in key else (None, key)
            assert (run.config[group][field] if group else run.config[field]) == value


def test_multi30k_ablation_sweeps_have_three_seeds_per_cell(tmp_path):
    from experiments import sweep_runs

    runs = sweep_runs.expand("configs/multi30k.py:small", "norm_warmup", [], tmp_path)
    cells = {}
    for run in runs:
        cell = (run.config.model.norm_position, run.config.optim.schedule)
        cells.setdefault(cell, set()).add(run.config.seed)
    assert cells == {
        (norm, schedule): {0, 1, 2}
        for norm in ("post", "pre")
        for schedule in ("paper", "constant")
    }
    preset = config_utils.load_config("configs/multi30k.py:small", [])
    assert preset.optim.warmup_steps > 0
    for run in runs:  # the paper schedule keeps the preset's warmup; the constant LR has none
        expected = 0 if run.config.optim.schedule == "constant" else preset.optim.warmup_steps
        assert run.config.optim.warmup_steps == expected
        assert run.config.model.embed_dim == preset.model.embed_dim == 64
