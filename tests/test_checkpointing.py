"""tfjax.training.checkpointing: exact round trips, retention, damage fallback, device counts."""

import asyncio
import gc
import logging
import pathlib
import shutil

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

from tfjax.training import checkpointing
from tfjax.training.checkpointing import checksums

# When orbax fails to read one array of a damaged step it abandons the reads of the others. Python
# then reports those coroutines when they are garbage collected, and tensorstore's late callbacks
# into orbax's closed event loop ("RuntimeError: Event loop is closed"). Both are expected noise
# here: collect the coroutines inside each test and ignore the two reports.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:(?s)Exception ignored in.*(_read_array_index|Event loop is closed)"
    ":pytest.PytestUnraisableExceptionWarning"
)

CONFIG = {"seed": 0, "model": {"num_layers": 2, "embed_dim": 8, "dtype": "float32"}}


@pytest.fixture(autouse=True)
def _collect_abandoned_reads():
    yield
    gc.collect()


@flax.struct.dataclass
class TrainState:
    """Stand-in for tfjax.training.steps.TrainState: the same three array fields."""

    step: jax.Array
    params: dict
    opt_state: optax.OptState


def make_state(seed: int) -> TrainState:
    """A small state whose every value depends on `seed`; the kernel is big enough for a chunk."""
    k1, k2 = jax.random.split(jax.random.key(seed))
    params = {
        "dense": {"kernel": jax.random.normal(k1, (64, 64)), "bias": jnp.arange(8.0) + seed},
        "embed": jax.random.normal(k2, (8, 4)).astype(jnp.bfloat16),
    }
    optimizer = optax.adam(1e-3)
    opt_state = optimizer.init(params)
    grads = jax.tree.map(lambda x: jnp.full_like(x, 0.5 + seed), params)
    _, opt_state = optimizer.update(grads, opt_state, params)  # non-zero mu, nu and count
    return TrainState(step=jnp.int32(seed), params=params, opt_state=opt_state)


def save(checkpointer, step: int, state=None, **kwargs) -> None:
    kwargs = {
        "rng": jax.random.key(step),
        "data_state": {"next_index": step},
        "config": CONFIG,
        **kwargs,
    }
    checkpointer.save(step, make_state(step) if state is None else state, **kwargs)


def assert_trees_equal(actual, expected) -> None:
    """Same structure, dtypes and bits."""
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        assert a.dtype == e.dtype and a.shape == e.shape
        np.testing.assert_array_equal(np.asarray(a), np.asarray(e))


def files(directory: pathlib.Path) -> dict[str, int]:
    return {
        str(p.relative_to(directory)): p.stat().st_size for p in directory.rglob("*") if p.is_file()
    }


def biggest_file(step_dir: pathlib.Path) -> pathlib.Path:
    """The array data chunk: the kernel makes it by far the largest file of the state."""
    return step_dir / "state" / max(files(step_dir / "state").items(), key=lambda kv: kv[1])[0]


def flip_bit(step_dir: pathlib.Path) -> None:
    path = biggest_file(step_dir)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def truncate_data(step_dir: pathlib.Path) -> None:
    path = biggest_file(step_dir)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def truncate_config(step_dir: pathlib.Path) -> None:
    path = step_dir / "config" / "metadata"
    path.write_bytes(path.read_bytes()[:5])


def delete_metadata(step_dir: pathlib.Path) -> None:
    (step_dir / "state" / "_METADATA").unlink()


def delete_commit_marker(step_dir: pathlib.Path) -> None:
    (step_dir / "commit_success.txt").unlink()


DAMAGE = [flip_bit, truncate_data, truncate_config, delete_metadata, delete_commit_marker]


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg"])
def test_round_trip_is_bit_exact(tmp_path, impl):
    state, rng = make_state(3), jax.random.key(11, impl=impl)
    data_state, config = {"next_index": 5, "worker": [0, 1]}, {**CONFIG, "note": "é"}
    with checkpointing.Checkpointer(tmp_path) as checkpointer:
        save(checkpointer, 3, state, rng=rng, data_state=data_state, config=config)
    with checkpointing.Checkpointer(tmp_path) as checkpointer:
        restored = checkpointer.restore(jax.eval_shape(lambda: state))
    assert restored.step == 3
    assert isinstance(restored.state, TrainState)
    assert_trees_equal(restored.state, state)
    assert str(jax.random.key_impl(restored.rng)) == impl
    assert_trees_equal(jax.random.key_data(restored.rng), jax.random.key_data(rng))
    assert restored.data_state == data_state and restored.config == config


def test_keeps_the_last_k_steps(tmp_path):
    with checkpointing.Checkpointer(tmp_path, max_to_keep=2) as checkpointer:
        for step in (1, 2, 3, 4):
            save(checkpointer, step)
        checkpointer.wait()
        assert checkpointer.all_steps() == [3, 4]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["3", "4"]


def test_latest_step_and_all_steps(tmp_path):
    with checkpointing.Checkpointer(tmp_path) as checkpointer:
        assert checkpointer.latest_step() is None and checkpointer.all_steps() == []
        save(checkpointer, 10)
        save(checkpointer, 20)
        assert checkpointer.latest_step() == 20 and checkpointer.all_steps() == [10, 20]
    assert checkpointing.Checkpointer(tmp_path).all_steps() == [10, 20]  # read back from disk


def test_async_save_is_on_disk_after_wait(tmp_path):
    checkpointer = checkpointing.Checkpointer(tmp_path, async_save=True)
    save(checkpointer, 1)
    save(checkpointer, 2)  # orbax waits for the first save itself
    checkpointer.wait()
    assert (tmp_path / "2" / "commit_success.txt").exists()
    restored = checkpointing.Checkpointer(tmp_path).restore(jax.eval_shape(lambda: make_state(2)))
    assert_trees_equal(restored.state, make_state(2))
    checkpointer.close()


@pytest.mark.parametrize("damage", DAMAGE, ids=lambda f: f.__name__)
def test_damaged_latest_falls_back_to_previous_step(tmp_path, caplog, damage):
    with checkpointing.Checkpointer(tmp_path) as checkpointer:
        for step in (1, 2, 3):
            save(checkpointer, step)
    damage(tmp_path / "3")
    before = files(tmp_path)
    with caplog.at_level(logging.WARNING, logger="tfjax.training.checkpointing"):
        with checkpointing.Checkpointer(tmp_path) as checkpointer:
            restored = checkpointer.restore(jax.eval_shape(lambda: make_state(0)))
            assert checkpointer.latest_step() == 2  # the trainer saves step 3 again
    assert restored.step == 2 and restored.data_state == {"next_index": 2}
    assert_trees_equal(restored.state, make_state(2))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "step 3" in warnings[0], warnings
    assert files(tmp_path) == before  # restoring never deletes or rewrites


def restore_after_damaging_step_2(directory, damage):
    """Saves steps 1 and 2 under `directory`, damages step 2 and restores the newest good one."""
    with checkpointing.Checkpointer(directory) as checkpointer:
        save(checkpointer, 1)
        save(checkpointer, 2)
    damage(directory / "2")
    return checkpointing.Checkpointer(directory).restore(jax.eval_shape(lambda: make_state(0)))


def test_bit_flip_is_caught_by_checksums(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="tfjax.training.checkpointing"):
        restored = restore_after_damaging_step_2(tmp_path, flip_bit)
    assert restored.step == 1
    assert "checksum mismatch in state.params['dense']['kernel']" in caplog.text


def test_uncommitted_step_directory_is_skipped(tmp_path, caplog):
    with checkpointing.Checkpointer(tmp_path) as checkpointer:
        save(checkpointer, 1)
    shutil.copytree(tmp_path / "1", tmp_path / "5")  # readable, but the save never finished
    delete_commit_marker(tmp_path / "5")
    with caplog.at_level(logging.WARNING, logger="tfjax.training.checkpointing"):
        restored = checkpointing.Checkpointer(tmp_path).restore(
            jax.eval_shape(lambda: make_state(0))
        )
    assert restored.step == 1
    assert "step 5" in caplog.text and "commit_success.txt" in caplog.text


def test_all_damaged_raises_naming_each_step(tmp_path):
    with checkpointing.Checkpointer(tmp_path) as checkpointer:
        save(checkpointer, 1)
        save(checkpointer, 2)
    truncate_data(tmp_path / "1")
    delete_metadata(tmp_path / "2")
    checkpointer = checkpointing.Checkpointer(tmp_path)
    with pytest.raises(checkpointing.CheckpointRestoreError, match=r"(?s)step 2: .*step 1: "):
        checkpointer.restore(jax.eval_shape(lambda: make_state(0)))
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["1", "2"]


def _unretrieved_future_failing_with(message):
    loop = asyncio.new_event_loop()
    future = loop.create_future()
    future.set_exception(ValueError(message))
    loop.close()
    del future
    gc.collect()  # asyncio logs the never-retrieved exception when the future is collected


def test_unretrieved_reads_of_a_damaged_step_are_not_logged(tmp_path, caplog):
    # Orbax reads arrays concurrently; after the first failed read the other reads' failures
    # are never awaited, and asyncio logged each with a traceback after the run's one-line error.
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        assert restore_after_damaging_step_2(tmp_path, truncate_data).step == 1
        caplog.clear()
        _unretrieved_future_failing_with(f"DATA_LOSS reading {tmp_path / '2'}/state/d/abc")
        assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text
        _unretrieved_future_failing_with(f"DATA_LOSS reading {tmp_path / '1'}/state/d/abc")
        _unretrieved_future_failing_with(f"DATA_LOSS reading {tmp_path / '20'}/state/d/abc")
    logged = [r for r in caplog.records if r.name == "asyncio"]
    assert len(logged) == 2 and all("never retrieved" in r.getMessage() for r in logged)


def test_empty_directory_restores_none(tmp_path):
    checkpointer = checkpointing.Checkpointer(tmp_path / "checkpoints")
    assert checkpointer.restore(jax.eval_shape(lambda: make_state(0))) is None
    assert (tmp_path / "checkpoints").is_dir()


def test_save_after_fallback_moves_the_damaged_step_aside(tmp_path):
    with checkpointing.Checkpointer(tmp_path) as checkpointer:
        save(checkpointer, 1)
        save(checkpointer, 2)
    delete_metadata(tmp_path / "2")
    with checkpointing.Checkpointer(tmp_path) as checkpointer:
        assert checkpointer.restore(jax.eval_shape(lambda: make_state(0))).step == 1
        save(checkpointer, 2)
        with pytest.raises(ValueError, match="step 2 already exists"):
            save(checkpointer, 2)
    assert (tmp_path / "2.corrupt" / "state").is_dir()
    restored = checkpointing.Checkpointer(tmp_path).restore(jax.eval_shape(lambda: make_state(0)))
    assert restored.step == 2
    assert_trees_equal(restored.state, make_state(2))


def test_a_step_damaged_twice_is_moved_aside_under_a_new_name(tmp_path):
    with checkpointing.Checkpointer(tmp_path) as checkpointer:
        save(checkpointer, 1)
        save(checkpointer, 2)
    for _ in range(2):
        delete_metadata(tmp_path / "2")
        with checkpointing.Checkpointer(tmp_path) as checkpointer:
            assert checkpointer.restore(jax.eval_shape(lambda: make_state(0))).step == 1
            save(checkpointer, 2)
    assert (tmp_path / "2.corrupt").is_dir() and (tmp_path / "2.corrupt1").is_dir()
    assert checkpointing.Checkpointer(tmp_path).all_steps() == [1, 2]


def test_restore_average_is_the_mean_of_the_last_steps(tmp_path):
    with checkpointing.Checkpointer(tmp_path) as checkpointer:
        for step in (1, 2, 3):
            save(checkpointer, step)
        averaged = checkpointer.restore_average(jax.eval_shape(lambda: make_state(0)), last=2)
        with pytest.raises(ValueError, match="keep_checkpoints >= 4"):
            checkpointer.restore_average(jax.eval_shape(lambda: make_state(0)), last=4)
    assert averaged.step == 3 and averaged.data_state == {"next_index": 3}
    assert_trees_equal(averaged.state.opt_state, make_state(3).opt_state)  # the newest step's

    def check_mean(got, newest, previous):
        assert got.dtype == newest.dtype
        tolerance = 1e-2 if got.dtype == jnp.bfloat16 else 1e-6  # bf16 keeps 8 mantissa bits
        want = (np.asarray(newest, np.float32) + np.asarray(previous, np.float32)) / 2
        np.testing.assert_allclose(
            np.asarray(got, np.float32), want, rtol=tolerance, atol=tolerance
        )

    jax.tree.map(check_mean, averaged.state.params, make_state(3).params, make_state(2).params)


def test_save_rejects_raw_keys_and_non_json_items(tmp_path):
    checkpointer = checkpointing.Checkpointer(tmp_path)
    with pytest.raises(TypeError, match="typed key"):
        save(checkpointer, 1, rng=jax.random.PRNGKey(0))
    with pytest.raises(TypeError, match="JSON round trip"):
        save(checkpointer, 1, data_state={"shape": (2, 3)})
    assert checkpointer.all_steps() == []


@pytest.mark.parametrize("below", [False, True], ids=["is_a_file", "under_a_file"])
def test_a_file_in_place_of_the_directory_is_named(tmp_path, below):
    (tmp_path / "checkpoints").write_text("not a directory")
    directory = tmp_path / "checkpoints" / "sub" if below else tmp_path / "checkpoints"
    with pytest.raises(NotADirectoryError) as info:
        checkpointing.Checkpointer(directory)
    message = str(info.value)
    assert "\n" not in message and "checkpoints is a file" in message and "--workdir" in message


def shardings(state, mesh: Mesh | None):
    """Where each leaf goes: all on device 0, or replicated on `mesh` with the kernel sharded."""

    def place(path, leaf):
        if mesh is None:
            return SingleDeviceSharding(jax.devices()[0])
        sharded = jax.tree_util.keystr(path).endswith("['kernel']")
        return NamedSharding(mesh, P("data") if sharded else P())

    return jax.tree_util.tree_map_with_path(place, state)


@pytest.mark.parametrize("save_on, restore_on", [(8, 1), (1, 8)])
def test_restore_onto_another_device_count(tmp_path, save_on, restore_on):
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices: run under tests/conftest.py (XLA_FLAGS)")
    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    state = make_state(4)
    placed = jax.device_put(state, shardings(state, mesh if save_on == 8 else None))
    with checkpointing.Checkpointer(tmp_path) as checkpointer:
        save(checkpointer, 4, placed)
    targets = shardings(state, mesh if restore_on == 8 else None)
    abstract = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        jax.eval_shape(lambda: state),
        targets,
    )
    restored = checkpointing.Checkpointer(tmp_path).restore(abstract)
    assert_trees_equal(restored.state, state)
    for leaf, sharding in zip(
        jax.tree.leaves(restored.state), jax.tree.leaves(targets), strict=True
    ):
        assert leaf.sharding == sharding


def test_check_compatible_names_the_differing_fields():
    now = {**CONFIG, "model": {**CONFIG["model"], "num_layers": 4, "mlp_dim": 16}}
    with pytest.raises(ValueError, match="--workdir") as info:
        checkpointing.check_compatible(CONFIG, now)
    message = str(info.value)
    assert "model.num_layers: saved 2, now 4" in message
    assert "model.mlp_dim: saved <absent>, now 16" in message
    assert "--config.model.num_layers=2" in message and "embed_dim" not in message
    checkpointing.check_compatible(CONFIG, dict(CONFIG))
    checkpointing.check_compatible(CONFIG, {**CONFIG, "seed": 1})  # other sections are free
    with pytest.raises(ValueError, match=r"data\.vocab: saved 8, now <absent>"):
        checkpointing.check_compatible({"data": {"vocab": 8}}, {"data": {}}, section="data")


def test_check_compatible_ignores_the_given_keys_present_or_absent():
    now = {**CONFIG, "model": {**CONFIG["model"], "scan_layers": True, "remat": "full"}}
    ignore = ("model.scan_layers", "model.remat")
    checkpointing.check_compatible(CONFIG, now, ignore=ignore)
    with pytest.raises(ValueError, match=r"model\.scan_layers: saved <absent>, now true"):
        checkpointing.check_compatible(CONFIG, now, ignore=("model.remat",))


def test_check_compatible_refuses_a_key_the_checkpoint_lacks():
    # A key the checkpoint's config lacks is refused, whatever its value: tfjax fills in no
    # defaults (a workdir of an older format is refused whole, `tfjax.runs.workdir_format`).
    now = {**CONFIG, "model": {**CONFIG["model"], "final_dropout": False}}
    with pytest.raises(ValueError, match=r"model\.final_dropout: saved <absent>, now false"):
        checkpointing.check_compatible(CONFIG, now)
    on = {**CONFIG, "model": {**CONFIG["model"], "final_dropout": True}}
    with pytest.raises(ValueError, match=r"model\.final_dropout: saved <absent>, now true"):
        checkpointing.check_compatible(CONFIG, on)
    other = {**CONFIG, "model": {**CONFIG["model"], "num_layers": 6}}
    with pytest.raises(ValueError, match=r"model\.num_layers: saved 2, now 6"):
        checkpointing.check_compatible(CONFIG, other)


def _transposed(state: TrainState) -> TrainState:
    """Another layout of the same numbers: every 2-D parameter and moment transposed."""
    return jax.tree.map(lambda x: x.T if x.ndim == 2 else x, state)


def _convert_when(num_layers: int):
    """A convert hook: steps saved with `num_layers` layers hold the transposed layout. It is
    also given the key paths of the step's arrays (its checksums' keys)."""
    conversion = checkpointing.Conversion(to_saved=_transposed, from_saved=_transposed)

    def convert(saved, saved_keys):
        assert ".params['dense']['kernel']" in saved_keys
        return conversion if saved["model"]["num_layers"] == num_layers else None

    return convert


def test_restore_converts_each_step_from_the_layout_it_was_saved_in(tmp_path):
    other = {**CONFIG, "model": {**CONFIG["model"], "num_layers": 3}}
    with checkpointing.Checkpointer(tmp_path) as checkpointer:
        save(checkpointer, 1)
        save(checkpointer, 2, _transposed(make_state(2)), config=other)
        abstract = jax.eval_shape(lambda: make_state(0))
        convert = _convert_when(3)
        assert_trees_equal(checkpointer.restore(abstract, convert=convert).state, make_state(2))
        restored = checkpointer.restore(abstract, step=1, convert=convert)
        assert_trees_equal(restored.state, make_state(1))
        averaged = checkpointer.restore_average(abstract, last=2, convert=convert)
        want = make_state(1).params["dense"]["kernel"] + make_state(2).params["dense"]["kernel"]
        np.testing.assert_allclose(averaged.state.params["dense"]["kernel"], want / 2, atol=1e-6)
        # Without the hook the transposed kernel does not fit: the step is refused, not garbled.
        with pytest.raises(checkpointing.CheckpointRestoreError, match="step 2"):
            checkpointer.restore(abstract, step=2)


# ---------------------------------------------------------------------------------------------
# Not damage: arrays that do not fit the run, a checksum program that fails


def _with_params(abstract, **params):
    return abstract.replace(params={**abstract.params, **params})


def test_a_step_of_other_shapes_is_refused_before_any_array_is_read(tmp_path, caplog, monkeypatch):
    with checkpointing.Checkpointer(tmp_path) as checkpointer:
        save(checkpointer, 1)
        save(checkpointer, 2)
    abstract = jax.eval_shape(lambda: make_state(0))
    taller = jax.ShapeDtypeStruct((65, 64), jnp.float32)
    other = _with_params(abstract, dense={**abstract.params["dense"], "kernel": taller})
    reads, restore = [], ocp.CheckpointManager.restore

    def spy(self, step, args=None, **kwargs):
        reads.append(set(args.keys()))
        return restore(self, step, args=args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "restore", spy)
    checkpointer = checkpointing.Checkpointer(tmp_path)
    with caplog.at_level(logging.WARNING, logger="tfjax.training.checkpointing"):
        with pytest.raises(checkpointing.CheckpointMismatchError) as info:
            checkpointer.restore(other)
        message = str(info.value)
        assert "state.params['dense']['kernel']: saved (64, 64), this run (65, 64)" in message
        assert "step 2" in message and "not damaged" in message and "step 1" not in message
        assert reads and all("state" not in items for items in reads)  # no array read
        assert info.value.saved_config == CONFIG and info.value.step == 2
        extra = _with_params(abstract, new=jax.ShapeDtypeStruct((2,), jnp.float32))
        with pytest.raises(checkpointing.CheckpointMismatchError, match=r"\['new'\]: not in the"):
            checkpointer.restore(extra, step=1)
    assert not caplog.records  # no step was called damaged, and none is hidden
    assert checkpointer.all_steps() == [1, 2]
    assert_trees_equal(checkpointer.restore(abstract).state, make_state(2))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "int32", "uint8", "bool"])
def test_the_host_checksum_is_the_compiled_one(dtype):
    values = jax.random.normal(jax.random.key(3), (3, 5, 7)) * 100
    for x in (values.astype(dtype), values[0, 0, 0].astype(dtype), values[:0].astype(dtype)):
        assert checksums.host_checksum(x) == int(checksums.leaf_checksum(x)), x.shape


def _failing(leaves):
    raise AssertionError((1, len(leaves)))  # what an executable of another program raised


def _lying(leaves):
    return [jnp.uint32(7) for _ in leaves]


@pytest.mark.parametrize("program", [_failing, _lying], ids=["fails", "lies"])
def test_a_broken_checksum_program_is_not_damage(tmp_path, caplog, monkeypatch, program):
    with checkpointing.Checkpointer(tmp_path) as checkpointer:
        save(checkpointer, 1)
        save(checkpointer, 2)
    flip_bit(tmp_path / "1")  # really damaged: the host finds it
    monkeypatch.setattr(checksums, "_all_checksums", program)
    checkpointer = checkpointing.Checkpointer(tmp_path)
    abstract = jax.eval_shape(lambda: make_state(0))
    with caplog.at_level(logging.WARNING, logger="tfjax.training.checkpointing"):
        with pytest.raises(checkpointing.VerificationError) as info:
            checkpointer.restore(abstract)
        assert not caplog.records  # step 2 is intact: not damaged, no fallback
        words = ["step 2", "match their saved checksums computed on the host", "compilation cache"]
        assert all(word in str(info.value) for word in words), str(info.value)
        with pytest.raises(checkpointing.CheckpointRestoreError, match="checksum mismatch in"):
            checkpointer.restore(abstract, step=1)
    assert checkpointer.all_steps() == [2]


def test_other_sums_for_arrays_sharded_across_hosts_are_damage(tmp_path, caplog, monkeypatch):
    """With several processes no host holds a sharded array whole: the program's sums are all
    there is, and a flipped bit there is damage (fall back), not a compilation-cache fault."""
    with checkpointing.Checkpointer(tmp_path) as checkpointer:
        save(checkpointer, 1)
        save(checkpointer, 2)
    flip_bit(tmp_path / "2")
    monkeypatch.setattr(checksums, "_on_this_host", lambda x: False)
    checkpointer = checkpointing.Checkpointer(tmp_path)
    with caplog.at_level(logging.WARNING, logger="tfjax.training.checkpointing"):
        restored = checkpointer.restore(jax.eval_shape(lambda: make_state(0)))
    assert restored.step == 1
    assert "checksum mismatch in state.params['dense']['kernel']" in caplog.text
    assert_trees_equal(restored.state, make_state(1))


def test_a_failing_program_over_arrays_sharded_across_hosts_is_not_damage(monkeypatch):
    state = make_state(1)
    saved = checksums.checksums(state)
    monkeypatch.setattr(checksums, "_on_this_host", lambda x: False)
    checksums.verify(state, saved)  # the program's sums agree: nothing to check on the host
    monkeypatch.setattr(checksums, "_all_checksums", _failing)
    with pytest.raises(checksums.ProgramError, match="could not all be checked on this host"):
        checksums.verify(state, saved)
