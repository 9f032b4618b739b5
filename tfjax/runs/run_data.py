"""A run's data on the host: its examples, the tokenizer saved once per job (`load_examples`),
and a batch of the training rows' shapes that reads no data (`sample_batch`).

`tfjax.runs.build` loads the examples of the run it builds (a vectorised sweep those of each
seed, `tfjax.runs.vsweep_state`); `sample_batch` gives the shapes of the abstract train state
(`build.abstract_train_state`) without reading data (`tfjax.runs.restoration`).
"""

import functools
import pathlib

import jax
import ml_collections
import numpy as np

from tfjax.data import datasets, workdir_tokenizer
from tfjax.models import kinds
from tfjax.parallel import distributed
from tfjax.runs import provenance, workdir_format


def load_examples(
    config: ml_collections.ConfigDict, workdir: pathlib.Path, trained: bool | None = None
) -> datasets.Examples:
    """The run's examples; the tokenizer is built and saved by process 0 alone, the others
    then read it (a shared workdir) or build the same one (a workdir on each host's disk).

    Once checkpoints were trained with it (`trained`; default: whether `workdir` holds any),
    the tokenizer must be there, is never built again and must have the SHA-256 config.json
    records (`provenance`): every process checks that before process 0 writes anything.
    """
    trained = bool(workdir_format.saved_steps(workdir)) if trained is None else trained
    expected = provenance.recorded_sha256(workdir, config.data.tokenizer) if trained else None
    load = functools.partial(
        datasets.load,
        datasets.DataConfig(**config.data),
        kinds.get(config.model.kind),
        seed=config.seed,
        workdir=workdir,
        encoder_head=config.model.encoder_head,
        trained=trained,
        tokenizer_sha256=expected,
    )
    if jax.process_count() > 1:  # read only: process 0 writes a new tokenizer after the barrier
        workdir_tokenizer.load(
            config.data.tokenizer, workdir, trained=trained, expected_sha256=expected
        )
        distributed.barrier("tfjax_tokenizer_checked")
    chief = jax.process_index() == 0
    examples = load() if chief else None
    distributed.barrier("tfjax_tokenizer_saved")
    return examples if chief else load(save_tokenizer=False)


def sample_batch(config: ml_collections.ConfigDict) -> dict[str, np.ndarray]:
    """A batch of one training row, int32 zeros [1, ...] on the host, of the shapes
    `datasets.train_row_shapes` gives: what the abstract train state needs, no data read."""
    rows = datasets.train_row_shapes(
        datasets.DataConfig(**config.data),
        kinds.get(config.model.kind),
        config.model.encoder_head,
    )
    return {key: np.zeros((1, *shape), np.int32) for key, shape in rows.items()}
