"""A run in its workdir: train one (`trainer`), or restore one and decode or evaluate it.

`validation` refuses a config a run cannot use; `build` turns a config into a run (model,
data, steps), with the data of `run_data` (the examples, a sample batch of their shapes);
`workdir_format` writes and reads config.json, refuses a workdir of another format and checks
that checkpoints fit the run that resumes them; `restoration` restores a workdir's checkpoint
into its run; `trainer` trains a run through `loop`, the training loop that a vectorised
sweep's trials (`vsweep`, the group built by `vsweep_build`, `vsweep_state`, population-based
training on their trial axis: `pbt`) train through too, and an Optuna search's generations
(`search`, the space in `search_space`); `trained` is a trained model restored from its
workdir, the road to text (`Trained`, `Translator`, `Generator`); `evaluator` holds the
teacher-forced evaluation and `evaluate_workdir`; `lock` locks a workdir, `provenance` records
and checks what its checkpoints were trained with (the tokenizer's digest), `plan` compiles a
train step ahead of time for a topology, `pretrained` converts Hugging Face checkpoints into
workdirs and back. The top layer of the library: it imports everything below it, and only
`experiments/` imports it.
"""

from tfjax import _lazy

__all__ = [
    "build",
    "evaluator",
    "lock",
    "loop",
    "pbt",
    "plan",
    "pretrained",
    "provenance",
    "restoration",
    "run_data",
    "search",
    "search_space",
    "trained",
    "trainer",
    "validation",
    "vsweep",
    "vsweep_build",
    "vsweep_state",
    "workdir_format",
]
__getattr__, __dir__ = _lazy.submodules(__name__, __all__)
