"""Mutation checks: small deliberate bugs that the test suite must catch.

Each entry of `MUTATIONS` names one change to the source (the exact `old` text, which must occur
exactly once in its file, and the `new` text that replaces it) and the pytest selection that
should fail because of it. For every mutation the script copies the working tree to a temporary
directory (without .git, __pycache__ and *.egg-info), applies the change there, and runs

    python -m pytest -m "" -x -q -p no:cacheprovider -n 0 <selection>

in the copy, with PYTHONPATH=<copy> (so the copy's `tfjax`, `experiments` and `configs` are
imported, not the editable install; checked before each run) and a relative TFJAX_DATA_DIR
resolved against the original checkout, so that the copy reads the same corpora (unset, the copy
reads the per-user default as any run does). `-m ""` selects slow tests too.

A mutation is "caught" when pytest fails (a nonzero exit). It SURVIVED when the selection passes,
and it is an ERROR of the list when its `old` text is not found exactly once, when the selection
collects no test (exit 5) or names no test pytest can find (exit 4), or when the run times out.
Every mutation here must be caught by the default or the slow suite: a survivor is a gap in the
tests (or in this list). Selections are kept narrow (a few tests, one file) so that each check
takes seconds. The copies share the suite's JAX compilation cache (tests/conftest.py), so
programs the mutation leaves unchanged are not compiled again.

Usage:
    python tests/mutations.py                  # all mutations, one line each
    python tests/mutations.py --list           # names, files and selections; checks `old` texts
    python tests/mutations.py --only NAME ...  # some of them
    python tests/mutations.py --jobs 2         # several at once (default 1)
    python tests/mutations.py --baseline       # the selections on the unmutated tree (must pass)

Prints `name  caught|SURVIVED|ERROR  seconds  detail` per mutation; exits 1 if any survived or
is an ERROR.
"""

import argparse
import concurrent.futures
import dataclasses
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("tfjax", "experiments", "configs")
IGNORED = shutil.ignore_patterns(
    ".git", "__pycache__", "*.egg-info", ".pytest_cache", ".ruff_cache", ".ipynb_checkpoints"
)
PYTEST = ["-m", "pytest", "-m", "", "-x", "-q", "-p", "no:cacheprovider", "-n", "0"]


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # relative to the repository root
    old: str  # must occur exactly once in the file
    new: str
    tests: tuple[str, ...]  # pytest arguments: node ids, files, "-k", "expression"


def M(name: str, path: str, old: str, new: str, *tests: str) -> Mutation:
    return Mutation(name, path, old, new, tests)


MUTATIONS = [
    # --- The list --------------------------------------------------------------------
    M(
        "value-down-times-zero",
        "tfjax/nn/attention/projections.py",
        'v = self._dense(self.value_rank, "value_down", use_bias=False)(x_kv)  # [B, S, r]',
        'v = self._dense(self.value_rank, "value_down", use_bias=False)(x_kv) * 0  # [B, S, r]',
        "tests/test_attention.py::test_low_rank_values_are_the_two_matmuls_written_out",
    ),
    M(
        "temperature-ignored",
        "tfjax/inference/decoding.py",
        "scaled = logits.astype(jnp.float32) / temperature",
        "scaled = logits.astype(jnp.float32)",
        "tests/test_decoding.py",
        "-k",
        "sampled_frequencies",
    ),
    M(
        "top-p-less-or-equal",
        "tfjax/inference/decoding.py",
        "keep = jnp.take_along_axis(mass_above < p, ranks, axis=-1)",
        "keep = jnp.take_along_axis(mass_above <= p, ranks, axis=-1)",
        "tests/test_decoding.py",
        "-k",
        "filter_top_p",
    ),
    M(
        "encoder-window-dropped",
        "tfjax/models/transformer.py",
        "window = self._window(segment_ids, positions, causal=False)",
        "window = None if cfg.window_radius else "
        "self._window(segment_ids, positions, causal=False)",
        "tests/test_local_window.py",
        "-k",
        "encoder_receptive_field",
    ),
    M(
        "fsdp-min-size-huge",
        "tfjax/parallel/strategies.py",
        "FSDP_MIN_SIZE = 2**14",
        "FSDP_MIN_SIZE = 2**40",
        "tests/test_parallel.py",
        "-k",
        "fsdp_shards_large_parameters or fsdp_step_really_shards",
    ),
    M(
        "beam-alpha-zero",
        "tfjax/inference/beam_search.py",
        "    rules = Rules(alpha, penalty, stopping, tuple(forbidden_ids), force_eos)",
        "    alpha = 0.0\n"
        "    rules = Rules(alpha, penalty, stopping, tuple(forbidden_ids), force_eos)",
        "tests/test_beam_search.py",
        "-k",
        "exhaustive_beam or stopping_bound",
    ),
    M(
        "heads-mlp-rules-none",
        "tfjax/parallel/layout.py",
        '    ("heads", "tensor"),\n    ("kv_heads", "tensor"),\n    ("qkv_heads", "tensor"),\n'
        '    ("kv", None),\n    ("mlp", "tensor"),',
        '    ("heads", None),\n    ("kv_heads", "tensor"),\n    ("qkv_heads", "tensor"),\n'
        '    ("kv", None),\n    ("mlp", None),',
        "tests/test_partitioning.py::test_default_rules_split_heads_and_mlp_then_fsdp_takes_the_rest",
        "tests/test_tensor_parallel.py::test_tensor_and_fsdp_step_really_splits_heads_mlp_and_adam_moments",
    ),
    M(
        "vsweep-trial0-learning-rate",
        "tfjax/runs/vsweep_build.py",
        "        hyper = [optim.traced_hyper(c, self.structure) for c in optim_configs]\n",
        "        hyper = [optim.traced_hyper(c, self.structure) for c in optim_configs]\n"
        "        for values in hyper:\n"
        '            values["learning_rate"] = hyper[0]["learning_rate"]\n',
        "tests/test_vsweep.py",
        "-k",
        "learning_rate or each_trial_ends_with_the_parameters",
    ),
    M(
        "vectorized-step-trial0-learning-rate",
        "tfjax/training/vectorized.py",
        "        train, metrics, live = vectorized(state.train, batch, rngs, hyper, state.live)\n",
        '        rate = hyper["learning_rate"]\n'
        '        hyper = {**hyper, "learning_rate": jnp.broadcast_to(rate[:1], rate.shape)}\n'
        "        train, metrics, live = vectorized(state.train, batch, rngs, hyper, state.live)\n",
        "tests/test_vsweep.py::test_two_trials_differing_in_learning_rate_each_take_their_own_step",
    ),
    M(
        "host-dataset-ignores-rows",
        "tfjax/data/pipeline.py",
        "return stream[batch * global_batch_size + rows.start + row]",
        "return stream[batch * global_batch_size + row]",
        "tests/test_data_pipeline.py::test_host_slices_tile_the_one_host_batches_across_epochs",
    ),
    M(
        "label-smoothing-term-dropped",
        "tfjax/nn/losses.py",
        "smoothed = smoothed + low * (z.shape[-1] * lse - jnp.sum(z, axis=-1))",
        "smoothed = smoothed",
        "tests/test_losses.py",
        "-k",
        "matches_numpy_reference or smoothed_loss",
    ),
    M(
        "mlm-mask-fraction-0.7",
        "tfjax/training/mlm.py",
        "MASK_FRACTION = 0.8",
        "MASK_FRACTION = 0.7",
        "tests/test_mlm.py::test_masking_follows_berts_rates_and_never_selects_padding_or_specials",
    ),
    M(
        "checksums-not-verified",
        "tfjax/training/checkpointing/restoring.py",
        "    checksums.verify(items.state, items.checksums)",
        "    pass  # checksums not verified",
        "tests/test_checkpointing.py::test_bit_flip_is_caught_by_checksums",
    ),
    M(
        "sinusoid-base-fixed",
        "tfjax/nn/positional.py",
        "inv_freq = base ** (-two_i / dim)  # [D/2]",
        "inv_freq = 10000.0 ** (-two_i / dim)  # [D/2]",
        "tests/test_positional.py",
        "-k",
        "sinusoidal_table_matches_formula or sinusoidal_embedding_equals",
    ),
    M(
        "rope-base-fixed",
        "tfjax/nn/positional.py",
        "inv_freq = base ** (-jnp.arange(half, dtype=jnp.float32) * 2 / head_dim)",
        "inv_freq = 10000.0 ** (-jnp.arange(half, dtype=jnp.float32) * 2 / head_dim)",
        "tests/test_positional.py::test_rope_matches_complex_reference",
    ),
    M(
        "additive-score-without-tanh",
        "tfjax/nn/attention/primitives.py",
        "hidden = jnp.tanh(q_a[:, :, :, None, :] + k_a[:, :, None, :, :])",
        "hidden = q_a[:, :, :, None, :] + k_a[:, :, None, :, :]",
        "tests/test_attention.py::test_score_functions_against_formulas",
    ),
    M(
        "gpt2-c-proj-transposed",
        "tfjax/pretrained/gpt2.py",
        '*checkpoint.dense(attention + "out", hf + "attn.c_proj", d, d, "kernel"),',
        '*checkpoint.dense(attention + "out", hf + "attn.c_proj", d, d, "linear"),',
        "tests/test_pretrained.py::test_gpt2_logits_match_hf_on_a_padded_batch",
    ),
    M(
        "gpt2-c-attn-bias-skipped",
        "tfjax/pretrained/gpt2.py",
        '*checkpoint.dense(attention + "qkv", hf + "attn.c_attn", d, 3 * d, "kernel"),',
        '*checkpoint.dense(attention + "qkv", hf + "attn.c_attn", d, 3 * d, "kernel", bias=False),',
        "tests/test_pretrained.py::test_gpt2_logits_match_hf_on_a_padded_batch",
    ),
    M(
        "sliding-one-key-for-every-step",
        "tfjax/inference/decoding.py",
        "token = sample(logits, None if rng is None else jax.random.fold_in(rng, t))",
        "token = sample(logits, rng)",
        "tests/test_decoding.py::test_sampled_sliding_continuation_draws_step_t_with_fold_in_rng_t",
    ),
    M(
        "chunked-padding-queries-attend",
        "tfjax/nn/attention/chunked.py",
        "masks.append(((q_seg == k_seg) & (q_seg != 0))[:, None])",
        "masks.append((q_seg == k_seg)[:, None])",
        "tests/test_chunked_attention.py",
        "-k",
        "fully_masked_rows or structural_masks",
    ),
    M(
        "mlm-no-minimum-of-one",
        "tfjax/training/mlm.py",
        "wanted = jnp.where(count > 0, jnp.maximum(jnp.round(masking.rate * count), 1), 0)",
        "wanted = jnp.where(count > 0, jnp.round(masking.rate * count), 0)",
        "tests/test_mlm.py::test_a_row_with_few_candidates_gets_one_selected_and_one_without_none",
    ),
    # --- From earlier sessions' closing notes ------------------------------------------------
    # Dropout's Threefry (tfjax/nn/prng.py)
    M(
        "prng-rotation-constant",
        "tfjax/nn/prng.py",
        "_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))",
        "_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 25))",
        "tests/test_prng.py",
        "-k",
        "known_answers",
    ),
    M(
        "prng-hi-lo-swapped",
        "tfjax/nn/prng.py",
        "hi, lo = threefry2x32(data[0], data[1], jnp.zeros_like(index), index)",
        "hi, lo = threefry2x32(data[0], data[1], index, jnp.zeros_like(index))",
        "tests/test_prng.py",
        "-k",
        "random_bits_are_jax_random_bits",
    ),
    M(
        "prng-row-major-stride-dropped",
        "tfjax/nn/prng.py",
        "index = index + lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride)",
        "index = index + lax.broadcasted_iota(jnp.uint32, shape, axis)",
        "tests/test_prng.py",
        "-k",
        "random_bits_are_jax_random_bits",
    ),
    M(
        "prng-conditional-removed",
        "tfjax/nn/prng.py",
        "    return lax.cond(\n        always,\n        lambda: _uniform_below(data, p, shape),\n"
        "        lambda: jnp.zeros(shape, bool),\n    )",
        "    return _uniform_below(data, p, shape)",
        "tests/test_prng.py::test_each_mask_is_computed_once_on_the_cpu",
    ),
    M(
        "prng-comparison-flipped",
        "tfjax/nn/prng.py",
        "return floats - 1.0 < p",
        "return floats - 1.0 > p",
        "tests/test_prng.py",
        "-k",
        "bernoulli_is_jax_random_bernoulli",
    ),
    M(
        "prng-fast-path-never-taken",
        "tfjax/nn/prng.py",
        "    if data is None or p.dtype != jnp.float32 or p.ndim != 0:",
        "    if True:",
        "tests/test_prng.py::test_each_mask_is_computed_once_on_the_cpu",
    ),
    # Dense layers and the tied projection (tfjax/nn/linear.py)
    M(
        "tied-projection-3d-einsum",
        "tfjax/nn/linear.py",
        "    product = jax.lax.dot_general("
        "x.reshape(-1, x.shape[-1]), table, (((1,), (1,)), ((), ())))\n"
        "    return product.reshape(*x.shape[:-1], table.shape[0])",
        '    return jax.numpy.einsum("...e,ve->...v", x, table)',
        "tests/test_linear.py::test_tied_projection_equals_the_einsum_and_multiplies_2d_operands",
    ),
    M(
        "tied-projection-reversed-table",
        "tfjax/nn/linear.py",
        "x.reshape(-1, x.shape[-1]), table, (((1,), (1,)), ((), ())))",
        "x.reshape(-1, x.shape[-1]), table[::-1], (((1,), (1,)), ((), ())))",
        "tests/test_linear.py::test_tied_projection_equals_the_einsum_and_multiplies_2d_operands",
    ),
    M(
        "dense-not-flattened",
        "tfjax/nn/linear.py",
        "    if not _is_dense(lhs, rhs, dimension_numbers):",
        "    if True:",
        "tests/test_linear.py",
        "-k",
        "flattened_2d_operands",
    ),
    # Bench and configs
    M(
        "peak-rss-reads-ru-maxrss",
        "experiments/bench/environment.py",
        'if line.startswith("VmHWM:"):',
        "if False:",
        "tests/test_bench.py",
        "-k",
        "peak_rss",
    ),
    M(
        "hour-ctx256-batch-32",
        "configs/shakespeare_char.py",
        '    "data.max_target_len": 257,\n    "train.global_batch_size": 16,',
        '    "data.max_target_len": 257,\n    "train.global_batch_size": 32,',
        "tests/test_recipes.py::test_shakespeare_ctx256_changes_only_the_context_at_the_same_characters_per_step",
    ),
    M(
        "multi30k-two-seeds",
        "configs/multi30k.py",
        "SEEDS = (0, 1, 2)",
        "SEEDS = (0, 1)",
        "tests/test_recipes.py::test_multi30k_ablation_sweeps_have_three_seeds_per_cell",
    ),
    M(
        "multi30k-constant-lr-warmup-1",
        "configs/multi30k.py",
        '"optim.learning_rate": 1e-3,\n                    "optim.warmup_steps": 0,',
        '"optim.learning_rate": 1e-3,\n                    "optim.warmup_steps": 1,',
        "tests/test_recipes.py::test_multi30k_ablation_sweeps_have_three_seeds_per_cell",
    ),
    M(
        "scan-long-preset-misspelt-model-key",
        "configs/scan_ablation.py",
        '    "model.positional": "relative",\n    "train.num_train_steps": 3000,',
        '    "model.positonal": "relative",\n    "train.num_train_steps": 3000,',
        "tests/test_recipes.py",
        "-k",
        "every_shipped_config_passes_the_run_check and scan_ablation",
    ),
    M(
        "scan-long-preset-misspelt-train-key",
        "configs/scan_ablation.py",
        '    "train.num_train_steps": 3000,',
        '    "train.num_train_step": 3000,',
        "tests/test_recipes.py",
        "-k",
        "every_shipped",
    ),
    M(
        "compilation-cache-flag-ignored",
        "experiments/cli.py",
        "        if options.compilation_cache:\n",
        "        if True:\n",
        "tests/test_cli.py::test_a_second_run_compiles_nothing_and_a_changed_config_compiles_again",
    ),
    M(
        "preset-keys-not-checked",
        "configs/common.py",
        '        config_utils.check_key(config, key, f"preset {name!r}")',
        "        pass",
        "tests/test_config_utils.py::"
        "test_a_preset_that_sets_a_misspelt_key_is_refused_with_the_close_match",
    ),
    M(
        "scan-seeds-sweep-misspelt-key",
        "configs/scan_ablation.py",
        '"seeds": [{"seed": seed} for seed in SEEDS],',
        '"seeds": [{"sead": seed} for seed in SEEDS],',
        "tests/test_recipes.py",
        "-k",
        "every_shipped_sweep and scan_ablation",
    ),
    # Data
    M(
        "text-windows-not-copied",
        "tfjax/data/datasets.py",
        "stream = np.array(ids, dtype=np.int32)  # a private copy",
        "stream = np.asarray(ids, dtype=np.int32)  # a private copy",
        "tests/test_data_sources.py::test_train_windows_are_read_only_views_of_a_private_copy",
    ),
    # The named corpora: the data directory, the shipped sums, fetching (issue 60)
    M(
        "data-dir-ignores-xdg-cache-home",
        "tfjax/data/sources.py",
        'base = pathlib.Path(cache) if os.path.isabs(cache) else pathlib.Path.home() / ".cache"',
        'base = pathlib.Path.home() / ".cache"',
        "tests/test_data_sources.py::test_data_dir_resolution",
    ),
    M(
        "missing-corpus-command-without-its-data-dir",
        "tfjax/data/sources.py",
        "command = corpora.fetch_command(name, None if default else root)",
        "command = corpora.fetch_command(name)",
        "tests/test_data_sources.py::test_a_missing_corpus_names_the_command_that_fetches_it",
    ),
    M(
        "corpus-checksum-not-compared",
        "tfjax/data/corpora.py",
        "        if actual != expected:",
        "        if False:",
        "tests/test_data_sources.py::"
        "test_checksums_verified_against_the_shipped_sums_and_mismatch_named",
    ),
    M(
        "fetch-installs-unverified-files",
        "tfjax/data/fetch.py",
        "        if actual != expected:",
        "        if False:",
        "tests/test_data_fetch.py::test_a_download_with_the_wrong_sum_installs_nothing",
    ),
    M(
        "fetch-keeps-the-gzip-bytes",
        "tfjax/data/fetch.py",
        "    if not gzipped:\n        return data",
        "    if True:\n        return data",
        "tests/test_data_fetch.py::test_download_gunzips_verifies_and_keeps_what_is_in_place",
    ),
    M(
        "fetch-downloads-verified-files-again",
        "tfjax/data/fetch.py",
        "if keep_verified and target.is_file()",
        "if False and target.is_file()",
        "tests/test_data_fetch.py::test_download_gunzips_verifies_and_keeps_what_is_in_place",
    ),
    M(
        "mlm-specials-selectable",
        "tfjax/training/mlm.py",
        "candidates = (segment_ids > 0) & ~special  # [B, S]",
        "candidates = segment_ids > 0  # [B, S]",
        "tests/test_mlm.py::test_masking_follows_berts_rates_and_never_selects_padding_or_specials",
    ),
    M(
        "mlm-device-offset-ignored",
        "tfjax/training/mlm.py",
        "rows = first_row + jnp.arange(tokens.shape[0])  # [B]",
        "rows = jnp.arange(tokens.shape[0])  # [B]",
        "tests/test_mlm.py::test_masking_does_not_depend_on_how_the_batch_is_split_over_devices",
    ),
    M(
        "mlm-loss-over-all-positions",
        "tfjax/training/mlm.py",
        "        logits, targets, weights, label_smoothing=label_smoothing\n    )",
        "        logits, targets, jnp.ones_like(weights), label_smoothing=label_smoothing\n    )",
        "tests/test_mlm.py::test_the_mlm_loss_counts_only_the_selected_positions",
    ),
    # Checkpoints
    M(
        "restore-filter-path-without-slash",
        "tfjax/training/checkpointing/restoring.py",
        'os.path.join(str(directory), str(candidate), "")',
        "os.path.join(str(directory), str(candidate))",
        "tests/test_checkpointing.py::test_unretrieved_reads_of_a_damaged_step_are_not_logged",
    ),
    M(
        "average-divides-by-n-plus-1",
        "tfjax/training/checkpointing/restoring.py",
        "(x / len(steps)).astype(x.dtype)",
        "(x / (len(steps) + 1)).astype(x.dtype)",
        "tests/test_checkpointing.py::test_restore_average_is_the_mean_of_the_last_steps",
    ),
    M(
        "corrupt-suffix-not-searched",
        "tfjax/training/checkpointing/restoring.py",
        "    while aside.exists():",
        "    while False:",
        "tests/test_checkpointing.py::test_a_step_damaged_twice_is_moved_aside_under_a_new_name",
    ),
    # Training steps, losses, layers
    M(
        "unscore-keeps-only-the-id",
        "tfjax/training/steps.py",
        'keep = (batch["targets"] != token_id).astype(jnp.int32)',
        'keep = (batch["targets"] == token_id).astype(jnp.int32)',
        "tests/test_predict_eos.py",
        "-k",
        "unscoring or without_eos_scores",
    ),
    M(
        "exact-match-ignores-weights",
        "tfjax/nn/losses.py",
        "        wrong = wrong & (weights > 0)",
        "        wrong = wrong",
        "tests/test_predict_eos.py::test_sequence_exact_match_skips_positions_of_weight_zero",
    ),
    M(
        "unscored-id-always-none",
        "tfjax/runs/build.py",
        "    return None if config.train.predict_eos else eos_id",
        "    return None",
        "tests/test_predict_eos.py::test_the_configs_train_step_scores_eos_as_train_predict_eos_says",
    ),
    M(
        "traced-smoothing-term-dropped",
        "tfjax/nn/losses.py",
        "sums = _weighted_token_losses_traced(logits, targets, weights, confidence, low)",
        "sums = _weighted_token_losses_traced(logits, targets, weights, confidence, 0.0 * low)",
        "tests/test_vsweep.py::test_a_traced_label_smoothing_gives_the_loss_and_gradient_of_the_static_one",
    ),
    M(
        "dropout-bf16-cast-removed",
        "tfjax/nn/layers.py",
        "scaled = (inputs / keep_prob).astype(inputs.dtype)",
        "scaled = inputs / keep_prob",
        "tests/test_vsweep.py::test_dropout_with_a_traced_rate_keeps_a_bf16_input_in_bf16",
    ),
    M(
        "global-norm-branches-swapped",
        "tfjax/training/steps.py",
        "cpu=_norm_raveled, default=_norm_per_array",
        "cpu=_norm_per_array, default=_norm_raveled",
        "tests/test_optim.py::test_global_norm_is_the_norm_of_all_elements_on_every_platform",
    ),
    # Attention
    M(
        "rope-not-on-keys",
        "tfjax/nn/attention/module.py",
        "        return q, positional.apply_rope(k, kv_positions, base=self.rope_base)",
        "        return q, k",
        "tests/test_attention.py::test_rotary_attention_is_invariant_to_a_global_position_shift",
    ),
    M(
        "weights-computed-without-capture",
        "tfjax/nn/attention/module.py",
        "        if self.is_mutable_collection(INTERMEDIATES):  # only then: no cost otherwise\n"
        "            weights = _weights(q, k, restrict, self.score, score_params, decode=decode)\n",
        "        weights = _weights(q, k, restrict, self.score, score_params, decode=decode)\n"
        "        if self.is_mutable_collection(INTERMEDIATES):\n",
        "tests/test_attention_maps.py::test_without_capture_nothing_is_computed_and_the_train_step_is_the_same",
    ),
    M(
        "window-decoder-ignored",
        "tfjax/models/transformer.py",
        "window = None if decode else self._window(segment_ids, positions, causal=True)",
        "window = None if decode or cfg.window_radius else "
        "self._window(segment_ids, positions, causal=True)",
        "tests/test_local_window.py",
        "-k",
        "decoder_only_receptive_field",
    ),
    M(
        "window-no-segment-check",
        "tfjax/nn/attention/local.py",
        "mask = mask & (q_seg[..., None] == k_seg) & (q_seg[..., None] != 0)",
        "mask = mask & (q_seg[..., None] != 0)",
        "tests/test_attention.py",
        "-k",
        "local_attention_with_segments",
    ),
    M(
        "window-no-causality",
        "tfjax/nn/attention/local.py",
        "        mask = mask & (offset >= 0)",
        "        mask = mask",
        "tests/test_attention.py",
        "-k",
        "local_attention_equals_dense_window_mask",
    ),
    M(
        "window-radius-strict",
        "tfjax/nn/attention/local.py",
        "mask = (jnp.abs(offset) <= radius) & k_valid[:, None, :]",
        "mask = (jnp.abs(offset) < radius) & k_valid[:, None, :]",
        "tests/test_attention.py",
        "-k",
        "local_attention_equals_dense_window_mask",
    ),
    M(
        "window-bias-ignores-positions",
        "tfjax/nn/attention/local.py",
        "    if positions is None:\n        relative = jnp.arange(-block, 2 * block)",
        "    if True:\n        relative = jnp.arange(-block, 2 * block)",
        "tests/test_local_window.py",
        "-k",
        "window_bias_reads_the_given_positions",
    ),
    M(
        "attention-stats-count-padding-rows",
        "tfjax/inference/attention_maps.py",
        "counted = rows[:, None, :] & (keys >= 2)",
        "counted = keys >= 2",
        "tests/test_attention_maps.py",
        "-k",
        "row_statistics_of_literal_rows or statistics_average_the_real_rows",
    ),
    # Decoding and beam search
    M(
        "top-k-ignored",
        "tfjax/inference/decoding.py",
        "scaled = filter_top_p(filter_top_k(scaled, top_k), top_p)",
        "scaled = filter_top_p(scaled, top_p)",
        "tests/test_decoding.py",
        "-k",
        "sampling_top_k_1_is_greedy or sampled_frequencies",
    ),
    M(
        "growing-cache-overfilled",
        "tfjax/inference/decoding.py",
        "(t_of(s) < n)",
        "(t_of(s) < n + 1)",
        "tests/test_decoding.py",
        "tests/test_beam_search.py",
        "-k",
        "cached_greedy_equals_uncached or scores_are_the_models",
    ),
    M(
        "cache-grown-at-the-front",
        "tfjax/nn/attention/cache.py",
        "widths[-2] = (0, length - x.shape[-2])",
        "widths[-2] = (length - x.shape[-2], 0)",
        "tests/test_decoding.py",
        "-k",
        "cache_grown_while_decoding or grow_pads",
    ),
    M(
        "blocked-top-k-blocks-unsorted",
        "tfjax/inference/decoding.py",
        "chosen = jnp.sort(chosen, axis=-1)",
        "chosen = chosen",
        "tests/test_decoding.py",
        "-k",
        "blocked_top_k",
    ),
    M(
        "beam-bound-with-lp-of-t",
        "tfjax/inference/beam_search.py",
        "length_penalty(max_length, alpha, penalty)  # [B]",
        "length_penalty(jnp.maximum(state.t, 1), alpha, penalty)  # [B]",
        "tests/test_beam_search.py",
        "-k",
        "stopping_bound or exhaustive_beam",
    ),
    M(
        "evaluate-suffix-without-alpha",
        "tfjax/runs/evaluator.py",
        'return f"_beam{beam_size}" + (f"_alpha{alpha:g}" if beam_size > 1 else "")',
        'return f"_beam{beam_size}"',
        "tests/test_workdir.py::test_evaluate_keeps_one_record_per_length_penalty",
    ),
    # Pretrained conversions
    M(
        "gpt2-gelu-new-as-exact-gelu",
        "tfjax/pretrained/gpt2.py",
        'ACTIVATIONS = {"gelu_new": "gelu_tanh",',
        'ACTIVATIONS = {"gelu_new": "gelu",',
        "tests/test_pretrained.py::test_gpt2_logits_match_hf_on_a_padded_batch",
    ),
    M(
        "bert-attention-output-untransposed",
        "tfjax/pretrained/bert.py",
        '*checkpoint.dense(tf + "self_attention/out", out, d, d, "linear"),',
        '*checkpoint.dense(tf + "self_attention/out", out, d, d, "kernel"),',
        "tests/test_pretrained.py",
        "-k",
        "bert_logits_match_hf",
    ),
    M(
        "t5-wi-0-wi-1-swapped",
        "tfjax/pretrained/t5.py",
        'rows = [*dense("wi_gate", "wi_0", d, f), *dense("wi", "wi_1", d, f)]',
        'rows = [*dense("wi_gate", "wi_1", d, f), *dense("wi", "wi_0", d, f)]',
        "tests/test_pretrained_t5.py::test_t5_gated_silu_logits_match_hf",
    ),
    M(
        "marian-gnmt-penalty",
        "tfjax/pretrained/marian.py",
        '        "penalty": "power",',
        '        "penalty": "gnmt",',
        "tests/test_pretrained_marian.py",
        "-k",
        "beam_search_matches_hf_generate",
    ),
    M(
        "tokenizer-larger-than-the-table-accepted",
        "tfjax/pretrained/__init__.py",
        "    if not size <= rows <= padded:",
        "    if not rows <= padded:",
        "tests/test_pretrained_checks.py",
        "-k",
        "without_its_tokenizer_files or another_size_than_the_tokenizer",
    ),
    M(
        "bert-multi-label-classifier-accepted",
        "tfjax/pretrained/bert.py",
        "    if problem != SINGLE_LABEL:",
        '    if problem == "regression":',
        "tests/test_pretrained_checks.py",
        "-k",
        "classifier_trained_with_another_loss or single_label_bert_classifier",
    ),
    M(
        "learned-positions-source-length-unchecked",
        "tfjax/models/kinds.py",
        "return tuple(_LENGTHS[field] for field in self.fields)",
        "return tuple(_LENGTHS[field] for field in self.fields[-1:])",
        "tests/test_pretrained_checks.py",
        "-k",
        "past_a_learned_position_table",
    ),
    M(
        "converted-translation-keeps-the-presets-lengths",
        "tfjax/runs/pretrained.py",
        'value = limit if kind.facade == "translator" else min(value, limit)',
        "value = min(value, limit)",
        "tests/test_pretrained_marian.py::test_a_converted_marian_reads_sources_as_long_as_the_checkpoint",
        "tests/test_pretrained_checks.py::test_convert_writes_the_t5_checkpoints_limits_unless_given",
    ),
    # Fused residual kernel (CPU: interpreted Pallas)
    M(
        "fused-keep-comparison-flipped",
        "tfjax/nn/fused.py",
        "return bits >= jnp.uint32(_threshold(rate))",
        "return bits < jnp.uint32(_threshold(rate))",
        "tests/test_fused_residual.py::test_keep_mask_is_a_fair_independent_coin",
    ),
    M(
        "fused-ln-backward-mean-term-dropped",
        "tfjax/nn/fused.py",
        "            - jnp.sum(gs, axis=1, keepdims=True) / d\n",
        "",
        "tests/test_fused_residual.py",
        "-k",
        "gradients_match_the_reference",
    ),
    M(
        "fused-impl-not-passed",
        "tfjax/models/transformer.py",
        "        implementation=cfg.residual_impl,",
        '        implementation="xla",',
        "tests/test_fused_residual.py::test_model_dropout_is_applied_and_reproducible",
    ),
    # Workdir lock and command-line errors
    M(
        "lock-flock-check-removed",
        "tfjax/runs/lock.py",
        "        except filelock.Timeout:\n"
        "            raise self._busy(self._holder_soon()) from None",
        "        except filelock.Timeout:\n            os_lock = None",
        "tests/test_lock.py",
        "-k",
        "second_lock_is_refused or flock_held_before",
    ),
    M(
        "lock-same-host-pid-check-removed",
        "tfjax/runs/lock.py",
        "        elif not flocked and _pid_alive(holder.pid, holder.pid_start):",
        "        elif False:",
        "tests/test_lock.py::test_without_flock_the_record_decides",
    ),
    M(
        "lock-heartbeat-not-touching",
        "tfjax/runs/lock.py",
        "                os.utime(self.path)",
        "                pass",
        "tests/test_lock.py::test_the_holder_touches_its_record",
    ),
    M(
        "cli-user-error-status-1",
        "experiments/cli.py",
        "USAGE_STATUS = 2",
        "USAGE_STATUS = 1",
        "tests/test_cli.py",
        "-k",
        "user_error_is_one_line_and_status_2 and not paths",
    ),
    M(
        "cli-absl-prefix-on-the-console",
        "experiments/cli.py",
        "        root.removeHandler(absl_handler)",
        "        pass  # absl's handler stays beside the plain one",
        "tests/test_cli.py",
        "-k",
        "entry_point_logs_plain or prints_no_absl_prefix",
    ),
    M(
        "lock-contest-both-win",
        "tfjax/runs/lock.py",
        "        except filelock.Timeout:\n"
        "            raise self._busy(self._holder_soon()) from None",
        "        except filelock.Timeout:\n            os_lock = None",
        "tests/test_lock.py::test_two_processes_race_for_one_workdir_and_exactly_one_wins",
    ),
    # Ecosystem libraries: optax's Muon, JAX's distributed variables, viz's ax=
    M(
        "muon-layer-axis-as-fan-in",
        "tfjax/training/muon.py",
        "    reduction = tuple(a + extra for a in fan_in)",
        "    reduction = tuple(fan_in)",
        "tests/test_muon.py",
        "-k",
        "dimensions_names or orthogonalised_over",
    ),
    M(
        "distributed-jax-variables-ignored",
        "tfjax/parallel/distributed.py",
        "        names = JAX_ENV_VARS",
        "        names = ENV_VARS",
        "tests/test_distributed.py::test_jax_own_variables_describe_a_job_and_tfjax_ones_win",
    ),
    M(
        "viz-ax-ignored",
        "tfjax/viz/canvas.py",
        "    if ax is not None:\n        _check_axes([ax], 1)",
        "    if False:\n        _check_axes([ax], 1)",
        "tests/test_viz.py::test_pictures_draw_into_the_callers_axes_of_one_figure",
    ),
    # Sweeps
    M(
        "sweep-updates-type-error-not-one-line",
        "experiments/config_utils.py",
        '        raise errors.ConfigError(" ".join(str(err).split())) from None',
        "        raise",
        "tests/test_config_utils.py::test_apply_updates_sets_python_values_and_checks_keys_and_types",
    ),
    M(
        "seed-summary-pstdev",
        "experiments/seed_stats.py",
        "statistics.stdev(values) if len(values) > 1 else 0.0",
        "statistics.pstdev(values) if len(values) > 1 else 0.0",
        "tests/test_sweep.py::test_seed_summary_averages_runs_that_differ_only_in_the_seed",
    ),
    M(
        "sweep-edge-warning-inverted",
        "experiments/sweep_advice.py",
        'side = "lowest" if value == values[0] else "highest" if value == values[-1] else None',
        'side = None if value in (values[0], values[-1]) else "highest"',
        "tests/test_sweep_advice.py",
    ),
    M(
        "sweep-separable-comparison-flipped",
        "experiments/seed_stats.py",
        "        return self.p < ALPHA",
        "        return self.p > ALPHA",
        "tests/test_sweep_advice.py",
    ),
    # Opening a workdir
    M(
        "workdir-load-reads-the-data",
        "tfjax/data/datasets.py",
        "fmt, saved, seed),\n        )\n",  # the deferred examples, read at once
        "fmt, saved, seed),\n        ).read()\n",
        "tests/test_workdir.py::test_decoding_a_workdir_reads_no_data",
    ),
    M(
        "resume-reads-the-eval-split-late",
        "tfjax/runs/trainer.py",
        "    run.examples.read()  # a resumed run's",
        "    run.examples  # a resumed run's",
        "tests/test_workdir.py::test_a_workdir_whose_data_is_gone_still_translates",
    ),
    # A full or read-only disk, a resumed run's metrics, lost peers, the CPU set-up
    M(
        "full-disk-partial-step-kept",
        "tfjax/training/checkpointing/manager.py",
        "            _remove_partial(self.directory, step)",
        "            pass",
        "tests/test_disk_faults.py::"
        "test_a_full_disk_in_a_background_save_is_one_error_naming_the_steps",
    ),
    M(
        "read-only-workdir-not-probed",
        "tfjax/runs/trainer.py",
        '    storage.check_writable(workdir, f"workdir {workdir}")',
        "",
        "tests/test_disk_faults.py::test_read_only_workdir_stops_before_the_restore",
    ),
    M(
        "metrics-replayed-steps-kept",
        "tfjax/training/logger.py",
        "            if record is None or keep(record):",
        "            if True:",
        "tests/test_disk_faults.py::test_drop_after_keeps_the_steps_up_to_the_resumed_one",
    ),
    M(
        "peer-watch-jax-errors-only",
        "tfjax/runs/trainer.py",
        "    except (RuntimeError, ValueError) as err:  # JaxRuntimeError is a RuntimeError",
        "    except jax.errors.JaxRuntimeError as err:",
        "tests/test_distributed.py",
        "-k",
        "every_collective_failure",
    ),
    M(
        "peer-lost-exits-through-jax-shutdown",
        "experiments/cli.py",
        "            os._exit(status)",
        "            pass",
        "tests/test_multihost.py",
        "-k",
        "killed_while_the_other_saves",
    ),
    # A multi-process job that cannot form, and the native abort of a dead process 0's peer
    M(
        "job-shape-not-agreed",
        "tfjax/parallel/rendezvous.py",
        "        elif count != self.shape.count:",
        "        elif False:",
        "tests/test_rendezvous.py::test_processes_told_different_counts_all_stop_naming_both",
    ),
    M(
        "check-in-ignores-missing-processes",
        "tfjax/parallel/rendezvous.py",
        "        while not (lobby.reached and not lobby.missing()):",
        "        while not lobby.reached:",
        "tests/test_rendezvous.py::test_a_process_that_never_comes_is_named_after_the_stated_wait",
    ),
    M(
        "check-in-admits-a-duplicate-id",
        "tfjax/parallel/rendezvous.py",
        "        elif index == 0 or index in self.peers:",
        "        elif index == 0:",
        "tests/test_rendezvous.py::test_two_processes_with_one_id_stop_the_job",
    ),
    M(
        "check-in-refuses-a-process-that-came-again",
        "tfjax/parallel/rendezvous.py",
        "            self.drop_departed()\n        if index == 0 and",
        "            pass\n        if index == 0 and",
        "tests/test_rendezvous.py::"
        "test_a_process_that_comes_again_before_its_departure_was_seen_is_admitted",
    ),
    M(
        "native-abort-forwarded",
        "experiments/launch_local.py",
        "        if NATIVE_ABORT in text:",
        "        if False:",
        "tests/test_distributed.py",
        "-k",
        "native_abort",
    ),
    M(
        "libtpu-woken-without-tpu",
        "tfjax/training/host.py",
        '    environ["JAX_PLATFORMS"] = "cpu"\n    return True',
        "    return True",
        "tests/test_host.py::test_cpu_unless_tpu_needs_libtpu_alone_and_no_tpu_device",
    ),
    M(
        "early-sigterm-swallowed-trains-on",
        "tfjax/runs/loop.py",
        "        if self.requested:\n            raise Terminated\n        self.started = True",
        "        self.started = True",
        "tests/test_bad_input.py::"
        "test_an_early_sigterm_swallowed_where_it_landed_still_stops_before_the_first_step",
    ),
    M(
        "final-eval-examples-ignored",
        "tfjax/runs/trainer.py",
        "                max_examples=config.train.final_eval_examples,",
        "                max_examples=0,",
        "tests/test_trainer.py::test_the_final_eval_scores_final_eval_examples",
    ),
    M(
        "orbax-full-disk-records-shown",
        "tfjax/training/checkpointing/manager.py",
        'from_a_writer = "/orbax/" in source or "/asyncio/" in source',
        "from_a_writer = False",
        "tests/test_disk_faults.py::"
        "test_orbax_and_asyncio_full_disk_records_are_dropped_and_others_kept",
    ),
    M(
        "workdir-format-not-checked",
        "tfjax/runs/workdir_format.py",
        "    check_format(tree, path)\n    return load_config_dict(tree)",
        "    return load_config_dict(tree)",
        "tests/test_workdir_format.py::"
        "test_a_config_json_without_a_format_record_is_refused_in_one_line",
    ),
    M(
        "shared-cache-mask-rows-not-regrouped",
        "tfjax/nn/attention/cache.py",
        "x = x.reshape(-1, rows, n, length, s).swapaxes(1, 2)  # [B, N, W, L, S]",
        "x = x.reshape(-1, n, rows, length, s)",
        "tests/test_attention.py",
        "-k",
        "shared_by_beams",
    ),
    M(
        "beam-cross-cache-tiled-again",
        "tfjax/inference/beam_search.py",
        'return x if axis is None or name.startswith("cached_cross_") else fn(x, axis)',
        "return x if axis is None else fn(x, axis)",
        "tests/test_beam_search.py",
        "-k",
        "shares_the_cross_attention",
    ),
    M(
        "beam-cache-reorder-skipped",
        "tfjax/inference/beam_search.py",
        "    cache = reorder_cache(state.cache, state.parent)\n",
        "    cache = state.cache\n",
        "tests/test_beam_search.py",
    ),
    M(
        "prefill-without-the-encoder",
        "tfjax/inference/decoding.py",
        "        encoded=encoded,\n"
        "        inputs_segment_ids=inputs_segment_ids,\n    )\n    return state",
        "        encoded=jnp.zeros_like(encoded),\n"
        "        inputs_segment_ids=inputs_segment_ids,\n    )\n    return state",
        "tests/test_decoding.py",
        "-k",
        "cached_greedy_equals_uncached",
    ),
    M(
        "beam-cross-cache-read-by-beam-0-only",
        "tfjax/nn/attention/cache.py",
        "q.reshape(k.shape[0], rows * length, *q.shape[2:]),",
        "q[::rows],",
        "tests/test_attention.py",
        "-k",
        "shared_by_beams",
    ),
    M(
        "startup-record-not-written",
        "tfjax/runs/loop.py",
        "                hooks.startup(step, startup_record(t0 - called))\n",
        "",
        "tests/test_trainer.py::test_resume_after_a_crash_between_saves_is_bit_exact",
    ),
    M(
        "vectorised-trials-write-no-startup-record",
        "tfjax/runs/vsweep.py",
        '                writer.write(step, "startup", record)\n',
        "                pass\n",
        "tests/test_vsweep.py::test_each_trial_logs_the_metrics_of_the_trial_trained_alone",
    ),
    M(
        "process-age-from-the-wrong-stat-field",
        "tfjax/training/host.py",
        'start_ticks = int(stat.rsplit(")", 1)[1].split()[19])',
        'start_ticks = int(stat.rsplit(")", 1)[1].split()[18])',
        "tests/test_host.py::test_process_seconds_is_the_age_of_the_process",
    ),
    M(
        "profile-counts-async-end-marks",
        "experiments/bench/profile.py",
        '"ThreadpoolListener::", "end: ", "SlinkyThreadPool::")',
        '"ThreadpoolListener::", "SlinkyThreadPool::")',
        "tests/test_bench_tools.py",
        "-k",
        "falls_back_to_the_xla_ops_line",
    ),
    M(
        "pretrained-not-a-lazy-subpackage",
        "tfjax/__init__.py",
        '    "pretrained",\n',
        "",
        "tests/test_package.py::test_every_subpackage_is_an_attribute_of_tfjax",
    ),
    M(
        "changelog-behind-the-version",
        "tfjax/__init__.py",
        '__version__ = "0.2.0"',
        '__version__ = "0.2.1"',
        "tests/test_package.py::test_changelog_citation_and_package_name_one_version",
    ),
    M(
        "a-floor-ci-never-installs",
        "setup.cfg",
        "    flax>=0.12.8\n",
        "    flax>=0.10.4\n",
        "tests/test_package.py::test_every_floor_is_the_version_ci_installs",
    ),
    M(
        "profile-starts-a-step-late",
        "tfjax/training/profiling.py",
        "elif not self.active and first <= step + 1 <= last:",
        "elif not self.active and first <= step <= last:",
        "tests/test_run_reports.py::test_profile_steps_writes_a_trace_of_those_steps_only",
    ),
    M(
        "profile-stops-at-the-end-of-the-run",
        "tfjax/training/profiling.py",
        "if self.active and step >= last:",
        "if self.active and step >= last + 10**9:",
        "tests/test_run_reports.py::test_profile_steps_writes_a_trace_of_those_steps_only",
    ),
    M(
        "parameter-count-includes-the-optimizer-state",
        "tfjax/runs/trainer.py",
        "jax.tree.leaves(run.abstract_state.params)",
        "jax.tree.leaves(run.abstract_state)",
        "tests/test_run_reports.py::test_a_run_logs_its_parameter_count",
    ),
    M(
        "negated-flag-sets-true",
        "experiments/config_utils.py",
        "node[leaf] = not override.startswith(NEGATION)",
        "node[leaf] = True",
        "tests/test_config_utils.py::test_bare_and_negated_flags_set_booleans",
    ),
    M(
        "flagfile-not-expanded",
        "experiments/config_utils.py",
        "    args, remaining, overrides, i = _expand_flagfiles(argv), [], [], 0",
        "    args, remaining, overrides, i = list(argv), [], [], 0",
        "tests/test_config_utils.py",
        "-k",
        "flagfile",
    ),
    M(
        "bare-flag-on-an-int-takes-the-next-flag",
        "experiments/config_utils.py",
        'if "=" not in override and i < len(args) and not _looks_like_a_flag(args[i]):',
        'if "=" not in override and i < len(args):',
        "tests/test_config_utils.py::test_split_config_overrides",
    ),
    M(
        "tensorboardx-imports-torch",
        "tfjax/training/logger.py",
        '    sys.modules["torch"] = None  # type: ignore[assignment]\n',
        "",
        "tests/test_logger.py::test_tensorboard_writes_do_not_import_torch",
    ),
    M(
        "cached-values-multiplied-with-the-values-on-the-left",
        "tfjax/nn/attention/cache.py",
        'out = jnp.einsum("BKGLS,BKSH->BKGLH", probs, v)\n'
        "    return out.transpose(0, 3, 1, 2, 4).reshape(",
        'out = jnp.einsum("BKGLS,BKSH->BLKGH", probs, v)\n    return out.reshape(',
        "tests/test_attention.py",
        "-k",
        "contracts_the_left_operand",
    ),
    # --- Issue 61: survivors of the mutation audit ---------------------------------------------
    M(
        "greedy-exact-match-counts-padding-rows",
        "tfjax/runs/evaluator.py",
        '"greedy_count": float(rows.sum())',
        '"greedy_count": float(len(rows))',
        "tests/test_evaluation.py::"
        "test_greedy_exact_match_counts_the_real_rows_of_a_padded_last_batch",
    ),
    M(
        "halving-keeps-the-worse-half",
        "tfjax/runs/vsweep.py",
        "stop = ranked[math.ceil(len(live) / 2) :]",
        "stop = ranked[: len(live) // 2]",
        "tests/test_vsweep.py::test_successive_halving_stops_the_trials_with_the_higher_eval_loss",
    ),
    M(
        "plan-peak-counts-donated-buffers",
        "tfjax/parallel/costs.py",
        "return self.arguments + self.outputs - self.aliased + self.temporaries + self.code",
        "return self.arguments + self.outputs + self.temporaries + self.code",
        "tests/test_plan.py::test_the_peak_counts_a_donated_state_once",
    ),
    M(
        "bert-gamma-beta-swapped",
        "tfjax/pretrained/bert.py",
        'return name.removesuffix("gamma") + "weight"\n'
        '    if name.endswith("LayerNorm.beta"):\n'
        '        return name.removesuffix("beta") + "bias"',
        'return name.removesuffix("gamma") + "bias"\n'
        '    if name.endswith("LayerNorm.beta"):\n'
        '        return name.removesuffix("beta") + "weight"',
        "tests/test_pretrained.py::"
        "test_bert_layer_norms_spelled_gamma_and_beta_load_as_scale_and_bias",
    ),
    M(
        "mlp-dropout-ignored",
        "tfjax/models/transformer.py",
        "dropout_rate=cfg.dropout_rate if cfg.mlp_dropout else 0.0,",
        "dropout_rate=0.0,",
        "tests/test_models.py::test_t5_mlp_dropout_drops_the_hidden_activations_of_every_feed_forward",
    ),
    # --- Issue 61: the trainer's save guard, the logged LR under accumulation ------------------
    M(
        "save-skips-finite-check",
        "tfjax/runs/trainer.py",
        "    if not bool(_all_finite(saved)):",
        "    if False:",
        "tests/test_trainer.py",
        "-k",
        "non_finite_loss_stops",
    ),
    M(
        "logged-lr-ignores-accumulation",
        "tfjax/training/steps.py",
        'metrics["learning_rate"] = schedule(state.step // grad_accum_steps)',
        'metrics["learning_rate"] = schedule(state.step)',
        "tests/test_trainer.py::test_the_logged_learning_rate_advances_once_per_accumulated_update",
    ),
    M(
        "lock-reused-pid-taken-for-the-holder",
        "tfjax/runs/lock.py",
        "    return now is None or now == started",
        "    return True",
        "tests/test_lock.py::test_without_flock_a_pid_reused_by_another_process_is_taken_over",
    ),
    M(
        "lock-age-by-this-hosts-clock",
        "tfjax/runs/lock.py",
        "        now = _filesystem_time(self.workdir)",
        "        now = time.time()",
        "tests/test_lock.py::test_another_hosts_live_record_is_not_judged_by_this_hosts_clock",
    ),
    M(
        "rerun-appends-a-second-final-eval",
        "tfjax/runs/trainer.py",
        '    writer.drop(step, "final_eval")',
        "    pass",
        "tests/test_trainer.py::test_the_final_eval_scores_final_eval_examples",
    ),
    M(
        "compile-cache-swapped-entries-kept",
        "experiments/compile_cache.py",
        "stat.st_ctime_ns > stat.st_mtime_ns",
        "stat.st_ctime_ns < stat.st_mtime_ns",
        "tests/test_compile_cache.py",
        "-k",
        "swapped and not compiles_them_again",
    ),
    M(
        "compile-cache-warnings-shown-raw",
        "experiments/compile_cache.py",
        "        warnings.showwarning = _show_warning(warnings.showwarning)",
        "        pass",
        "tests/test_compile_cache.py::test_a_cache_folder_that_cannot_be_made_is_one_warning_line",
    ),
    # --- The workdir's tokenizer, and checkpoints that do not fit ----------------------------
    M(
        "tokenizer-digest-not-checked",
        "tfjax/runs/run_data.py",
        "provenance.recorded_sha256(workdir, config.data.tokenizer) if trained else None",
        "None",
        "tests/test_bad_input.py::test_another_tokenizer_is_refused_naming_both_digests",
    ),
    M(
        "missing-tokenizer-rebuilt",
        "tfjax/data/datasets.py",
        "            trained=trained,\n            expected_sha256=tokenizer_sha256,",
        "            trained=False,\n            expected_sha256=tokenizer_sha256,",
        "tests/test_bad_input.py::test_a_missing_tokenizer_is_refused_never_rebuilt",
    ),
    M(
        "tokenizer-checked-by-process-0-only",
        "tfjax/runs/run_data.py",
        "    if jax.process_count() > 1:  # read only:",
        "    if False:  # read only:",
        "tests/test_bad_input.py::test_every_process_refuses_a_missing_tokenizer_before_waiting",
    ),
    M(
        "checkpoint-mismatch-called-damage",
        "tfjax/training/checkpointing/restoring.py",
        "        except (CheckpointMismatchError, VerificationError):\n            raise",
        "        except ZeroDivisionError:\n            raise",
        "tests/test_checkpointing.py",
        "-k",
        "other_shapes or broken_checksum",
    ),
    M(
        "optax-by-name-keeps-optax-weight-decay",
        "tfjax/training/optax_by_name.py",
        '    if "weight_decay" in params:\n        arguments["weight_decay"] = weight_decay\n',
        "",
        "tests/test_optax_by_name.py",
        "-k",
        "equal_optax_called_directly or follows_the_paper",
    ),
    M(
        "optax-by-name-drops-the-decay-mask",
        "tfjax/training/optax_by_name.py",
        '    if mask is not None and "mask" in params:',
        '    if mask is not None and "mask" in params and False:',
        "tests/test_optax_by_name.py",
        "-k",
        "equal_optax_called_directly",
    ),
    M(
        "traced-kwargs-take-one-value-for-all-trials",
        "tfjax/training/optim.py",
        '        hyper[f"kwargs.{key}"] = jnp.float32(config.kwargs[key])',
        '        hyper[f"kwargs.{key}"] = jnp.float32(0.9)',
        "tests/test_optax_by_name.py",
        "-k",
        "traced_lion or differing_in_b1",
    ),
    M(
        "kwargs-group-closed-to-overrides",
        "experiments/config_utils.py",
        "    if leaf not in node and not is_open(prefix):",
        "    if leaf not in node:",
        "tests/test_optax_by_name.py",
        "-k",
        "kwargs_are_set_by_overrides",
    ),
    M(
        "kwargs-accept-any-argument",
        "tfjax/training/optax_by_name.py",
        "        if key not in params and not takes_any:",
        "        if key not in params and takes_any:",
        "tests/test_optax_by_name.py",
        "-k",
        "one_line_naming_what_is_accepted",
    ),
    M(
        "hparams-keep-kwargs-as-one-mapping",
        "tfjax/training/logger.py",
        "        if isinstance(value, Mapping):",
        "        if False:",
        "tests/test_optax_by_name.py::test_a_trial_kwarg_shows_as_its_own_hparam",
    ),
    M(
        "checkpoint-format-not-checked",
        "tfjax/runs/workdir_format.py",
        "    check_format(newest[1], newest[0])\n",
        "",
        "tests/test_workdir_format.py::test_a_checkpoint_copy_of_another_format_is_refused",
    ),
    M(
        "resumable-checks-the-model-only",
        "tfjax/runs/workdir_format.py",
        '    sections: Collection[str] = ("model", "data"),',
        '    sections: Collection[str] = ("model",),',
        "tests/test_workdir_format.py::test_check_resumable_names_the_key_and_ignores_the_layout",
    ),
    # --- Issue 62: one training loop for a run and a vectorised sweep --------------------------
    M(
        "loop-saves-before-adjusting",
        "tfjax/runs/loop.py",
        "            state = hooks.adjust(state, step)\n"
        "            if step % tcfg.checkpoint_every_steps == 0 or preemption.requested:\n"
        "                hooks.save(state, step, pending)\n",
        "            if step % tcfg.checkpoint_every_steps == 0 or preemption.requested:\n"
        "                hooks.save(state, step, pending)\n"
        "            state = hooks.adjust(state, step)\n",
        "tests/test_loop.py::test_each_step_logs_evaluates_adjusts_and_saves_in_order",
    ),
    M(
        "loop-adjusted-state-dropped",
        "tfjax/runs/loop.py",
        "            state = hooks.adjust(state, step)",
        "            hooks.adjust(state, step)",
        "tests/test_loop.py::test_each_step_logs_evaluates_adjusts_and_saves_in_order",
    ),
    M(
        "loop-last-step-not-saved",
        "tfjax/runs/loop.py",
        "        elif self.checkpointer.latest_step() != step:",
        "        elif False:",
        "tests/test_loop.py::test_each_step_logs_evaluates_adjusts_and_saves_in_order",
    ),
    # --- Optuna searches (issue 63) ----------------------------------------------------------
    M(
        "search-results-told-to-wrong-trials",
        "tfjax/runs/search.py",
        "            for trial, outcome in zip(optuna_trials, outcomes, strict=True):",
        "            for trial, outcome in zip(optuna_trials, outcomes[::-1], strict=True):",
        "tests/test_search.py::test_each_trial_is_trained_once_and_told_its_own_result",
    ),
    M(
        "search-pruned-trial-not-stopped",
        "tfjax/runs/vsweep.py",
        "            self.judged = self.group.judge(step, results)",
        "            self.group.judge(step, results)",
        "tests/test_vsweep.py::test_a_judge_sees_each_live_trials_evaluation_and_stops_those_it_names",
    ),
    M(
        "search-rdb-race-not-retried",
        "tfjax/runs/search.py",
        "        storage = _rdb_storage(optuna, search.storage)",
        "        storage = optuna.storages.RDBStorage(search.storage)",
        "tests/test_search.py::test_a_host_that_loses_the_race_to_create_the_rdb_tables_retries",
    ),
    M(
        "search-stale-trial-not-queued-again",
        "tfjax/runs/search.py",
        '        study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})\n'
        '        log.warning("trial %d: no heartbeat',
        '        log.warning("trial %d: no heartbeat',
        "tests/test_search.py::test_a_trial_without_heartbeat_fails_and_its_suggestion_is_queued",
    ),
    M(
        "pbt-exploit-copies-the-wrong-trial",
        "tfjax/training/population.py",
        "jnp.take(leaf, source, axis=0)",
        "jnp.take(leaf, jnp.roll(source, 1), axis=0)",
        "tests/test_pbt.py::test_exploit_and_explore_on_a_fixed_ranking_equal_a_numpy_reference",
    ),
    M(
        "pbt-explore-skipped",
        "tfjax/training/population.py",
        "copied[name] = jnp.where(replaced, explored, copied[name])",
        "copied[name] = copied[name]",
        "tests/test_pbt.py::test_exploit_and_explore_on_a_fixed_ranking_equal_a_numpy_reference",
    ),
    # Model kinds: one registration is all a new kind needs (tfjax/models/kinds.py)
    M(
        "kinds-lists-only-the-builtins",
        "tfjax/models/kinds.py",
        "ordered = sorted(_KINDS.values(), key=rank)",
        "ordered = [k for k in sorted(_KINDS.values(), key=rank) if rank(k) < len(BUILTINS)]",
        "tests/test_model_kinds.py::test_a_kind_registered_here_trains_evaluates_and_generates",
    ),
    M(
        "facade-chosen-by-kind-name",
        "tfjax/runs/trained.py",
        "cls = FACADES[kinds_lib.get(config.model.kind).facade]",
        'cls = {"decoder_only": Generator}.get(config.model.kind, Trained)',
        "tests/test_model_kinds.py::test_a_kind_registered_here_trains_evaluates_and_generates",
    ),
    # --- μP (tfjax/models/mup.py, tfjax/training/mup.py): the coordinate check ---------------
    M(
        "mup-lr-multiplier-dropped",
        "tfjax/training/mup.py",
        "return jax.tree.map(lambda hidden: ratio if hidden else 1.0, hidden_matrices(params))",
        "return jax.tree.map(lambda hidden: 1.0, hidden_matrices(params))",
        "tests/test_coord_check.py::test_coordinate_check_two_widths",
    ),
    M(
        "mup-readout-multiplier-dropped",
        "tfjax/models/common.py",
        "    return x if multiplier == 1.0 else x * jnp.asarray(multiplier, x.dtype)",
        "    return x",
        "tests/test_coord_check.py::test_coordinate_check_two_widths",
    ),
    M(
        "mup-vectorised-multipliers-dropped",
        "tfjax/training/vectorized.py",
        "optim.traced_optimizer(hyper, structure, d_model, multipliers)",
        "optim.traced_optimizer(hyper, structure, d_model)",
        "tests/test_mup.py::test_vectorised_trials_apply_the_multipliers",
    ),
    M(
        "mup-attention-one-over-d-dropped",
        "tfjax/models/mup.py",
        '    return math.sqrt(ratio) if cfg.score == "scaled_dot" else ratio',
        "    return 1.0",
        "tests/test_coord_check.py::test_attention_logits_scale_as_one_over_head_dim",
    ),
]


# ---------------------------------------------------------------------------------------------
# Running one mutation.


@dataclasses.dataclass
class Result:
    name: str
    status: str  # "caught", "SURVIVED", "ERROR", or for --baseline "passes" / "FAILS"
    seconds: float
    detail: str = ""


def check_old(mutation: Mutation, root: pathlib.Path = ROOT) -> str | None:
    """None when `old` occurs exactly once in the file, else what is wrong."""
    path = root / mutation.path
    if not path.is_file():
        return f"{mutation.path} does not exist"
    count = path.read_text(encoding="utf-8").count(mutation.old)
    return None if count == 1 else f"old text found {count} times in {mutation.path}"


def selection(mutation: Mutation) -> tuple[list[str], str]:
    """The pytest arguments of `mutation`, and a note on them (empty)."""
    return list(mutation.tests), ""


def environment(copy: pathlib.Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(copy), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.setdefault("TFJAX_TEST_COMPILATION_CACHE", str(ROOT / ".pytest_cache" / "jax"))
    data = env.get("TFJAX_DATA_DIR")
    if data:  # a relative setting must still name the original's folder
        env["TFJAX_DATA_DIR"] = str(pathlib.Path(data).resolve())
    return env


def imports_from_copy(copy: pathlib.Path, env: dict[str, str]) -> str | None:
    """None when the copy's packages are the ones Python imports there, else what it imports."""
    code = (
        "import importlib.util as u\n"
        f"for name in {PACKAGES!r}:\n"
        "    print(u.find_spec(name).origin)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=copy, env=env, capture_output=True, text=True
    )
    origins = out.stdout.split()
    if out.returncode or len(origins) != len(PACKAGES):
        return f"import check failed: {out.stderr.strip()[-300:]}"
    for origin in origins:
        if not pathlib.Path(origin).resolve().is_relative_to(copy.resolve()):
            return f"imports {origin} instead of the copy's package"
    return None


def first_failure(output: str) -> str:
    """The first FAILED/ERROR line of pytest's summary, shortened, or the last line."""
    for line in output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return re.sub(r"\s+", " ", line)[:160]
    lines = [line for line in output.splitlines() if line.strip()]
    return lines[-1][:160] if lines else ""


def run(mutation: Mutation, *, timeout: float, baseline: bool = False) -> Result:
    start = time.monotonic()

    def result(status: str, detail: str = "") -> Result:
        return Result(mutation.name, status, time.monotonic() - start, detail)

    problem = check_old(mutation)
    if problem:
        return result("ERROR", problem)
    args, note = selection(mutation)
    if not args:
        return result("ERROR", f"empty selection {note}")
    with tempfile.TemporaryDirectory(prefix="tfjax-mutation-") as tmp:
        copy = pathlib.Path(tmp) / ROOT.name
        shutil.copytree(ROOT, copy, ignore=IGNORED, symlinks=True)
        if not baseline:
            target = copy / mutation.path
            text = target.read_text(encoding="utf-8")
            target.write_text(text.replace(mutation.old, mutation.new, 1), encoding="utf-8")
        env = environment(copy)
        problem = imports_from_copy(copy, env)
        if problem:
            return result("ERROR", problem)
        try:
            out = subprocess.run(
                [sys.executable, *PYTEST, *args],
                cwd=copy,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return result("ERROR", f"timed out after {timeout:.0f} s {note}".strip())
    output = out.stdout + out.stderr
    if out.returncode == 5:
        return result("ERROR", f"no tests collected {note}".strip())
    if out.returncode == 4:  # a usage error: a node id or file pytest cannot find
        return result("ERROR", f"pytest usage error: {first_failure(output)}")
    if baseline:
        status = "passes" if out.returncode == 0 else "FAILS"
        return result(status, "" if out.returncode == 0 else first_failure(output))
    if out.returncode == 0:
        return result("SURVIVED", f"{first_failure(output)} {note}".strip())
    return result("caught", first_failure(output))


# ---------------------------------------------------------------------------------------------
# Command line.


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutations")
    parser.add_argument("--jobs", type=int, default=1, help="mutations run at once (default 1)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per mutation")
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="run each selection on the unmutated tree instead (every one must pass)",
    )
    options = parser.parse_args(argv)

    names = [m.name for m in MUTATIONS]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        print(f"duplicate mutation names: {duplicates}", file=sys.stderr)
        return 1
    chosen = MUTATIONS
    if options.only:
        unknown = [n for n in options.only if n not in names]
        if unknown:
            print(f"unknown mutation names: {unknown} (see --list)", file=sys.stderr)
            return 1
        chosen = [m for m in MUTATIONS if m.name in options.only]

    if options.list:
        bad = 0
        for m in chosen:
            problem = check_old(m)
            bad += problem is not None
            print(f"{m.name:<40} {m.path:<44} {' '.join(m.tests)}")
            if problem:
                print(f"    ERROR: {problem}")
        print(f"{len(chosen)} mutations, {bad} with an old text that is not found exactly once")
        return 1 if bad else 0

    width = max(len(m.name) for m in chosen)
    begin = time.monotonic()
    results = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(options.jobs, 1)) as pool:
        futures = [
            pool.submit(run, m, timeout=options.timeout, baseline=options.baseline) for m in chosen
        ]
        for future in concurrent.futures.as_completed(futures):
            r = future.result()
            results.append(r)
            print(f"{r.name:<{width}}  {r.status:<8} {r.seconds:7.1f} s  {r.detail}", flush=True)
    bad = [r for r in results if r.status not in ("caught", "passes")]
    counts = {s: sum(r.status == s for r in results) for s in sorted({r.status for r in results})}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    print(f"{len(results)} mutations: {summary}; {time.monotonic() - begin:.0f} s")
    if bad:
        print("not caught: " + ", ".join(r.name for r in bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
