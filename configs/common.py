"""Config groups shared by every experiment file; defaults come from the library's dataclasses.

Each group is 1:1 with the dataclass that consumes it (`ModelConfig(**config.model)`,
`OptimConfig(**config.optim)`, `DataConfig(**config.data)`), so no field is copied by hand and
every key exists in the file (docs/design.md, "Configs").
"""

import dataclasses

import ml_collections

from experiments import config_utils
from tfjax import errors, models
from tfjax.data import datasets
from tfjax.parallel import layout
from tfjax.training import optim

# The paper's big model (Vaswani et al. 2017, Table 3), for every experiment file: the
# library's `tfjax.models.PRESETS["big"]` as dotted `model.` keys.
BIG = {f"model.{field}": value for field, value in models.PRESETS["big"].items()}

# Seconds on a CPU: what the tests run. Each file adds its layer counts and data sizes.
TINY = {
    "model.embed_dim": 32,
    "model.num_layers": 1,
    "model.num_heads": 2,
    "model.mlp_dim": 64,
    "optim.warmup_steps": 10,
    "train.num_train_steps": 6,
    "train.global_batch_size": 8,
    "train.eval_batch_size": 16,
    "train.log_every_steps": 2,
    "train.eval_every_steps": 4,
    "train.checkpoint_every_steps": 4,
    # A few batches, not the whole split: decoding and scoring SCAN's 4,182 test commands was
    # most of a tiny run (docs/tests.md).
    "train.final_eval_examples": 64,
}


def base_config(
    *, model: dict, data: dict, optim_overrides: dict | None = None, train: dict | None = None
) -> ml_collections.ConfigDict:
    """A full run config: seed, model, data, optim, train, sweep, parallel."""
    config = ml_collections.ConfigDict()
    config.seed = 0
    model_fields = dataclasses.asdict(models.ModelConfig())
    model_fields["vocab_size"] = 0  # 0 = the size of the tokenizer built from the data
    config.model = {**model_fields, **model}
    config.data = {**dataclasses.asdict(datasets.DataConfig()), **data}
    config.optim = {**dataclasses.asdict(optim.OptimConfig()), **(optim_overrides or {})}
    config.train = {
        "num_train_steps": 100_000,
        "global_batch_size": 64,
        "eval_batch_size": 256,
        "label_smoothing": 0.1,
        # model.encoder_head="mlm": the fraction of each row's real tokens the masked-LM
        # objective selects; 80% become the mask token, 10% a random token, 10% stay (BERT).
        "mlm_rate": 0.15,
        # False: EOS target positions get no loss, so the model never learns where outputs
        # end (Newman et al. 2020's "-EOS" models); decode it with oracle lengths
        # (experiments.evaluate --oracle_length). Seq2seq and decoder-only models.
        "predict_eos": True,
        "log_every_steps": 100,
        "eval_every_steps": 1000,
        "max_eval_examples": 0,  # examples per periodic eval (0 = all)
        "final_eval_examples": 0,  # examples of the eval at the end of training (0 = all)
        "checkpoint_every_steps": 1000,
        "keep_checkpoints": 3,
        # A tfjax workdir (e.g. made by experiments.convert) or a Hugging Face checkpoint
        # directory whose parameters a new run starts from ("" = random initialisation).
        "init_from": "",
        # (FIRST, LAST): a jax.profiler trace of these steps in WORKDIR/profile, for
        # TensorBoard's profile plugin or XProf (docs/training.md, "Profiling"); () = none.
        "profile_steps": (),
        **(train or {}),
    }
    config.sweep = {
        # experiments.sweep: train the trials that share a model shape as one vectorised
        # program (tfjax.runs.vsweep) instead of one after another.
        "vectorize": False,
        # Vectorised sweeps: at each of these steps stop the worse half of the trials still
        # training, by eval loss (successive halving); () = never.
        "halving_steps": (),
        # Vectorised sweeps: population-based training on the trial axis (tfjax.runs.pbt;
        # docs/sweeps.md). Every `interval` steps (0 = off) the live trials are ranked on
        # their evaluation's `metric` ("min" or "max" by `mode`); the worst `fraction` of
        # them (at most half) copy the parameters, optimizer state and hyperparameters of
        # the best ones (the k-th worst the k-th best) and explore each of `hyperparameters`
        # (vectorised config keys): multiplied by one of `perturb_factors`, or with probability
        # `resample_probability` drawn from the values the sweep's trials started with.
        "pbt": {
            "interval": 0,
            "metric": "loss",
            "mode": "min",
            "fraction": 0.25,
            "hyperparameters": ("optim.learning_rate",),
            "perturb_factors": (0.8, 1.25),
            "resample_probability": 0.0,
            "seed": 0,  # of the explore RNG (saved with the group: a rerun resumes it)
        },
    }
    config.parallel = {
        # "sharded": jax.jit with NamedShardings (data parallel while fsdp = tensor = 1);
        # "pmap": jax.pmap over the local devices (docs/training.md, "Which parallel mode").
        "mode": "sharded",
        "fsdp": 1,
        "tensor": 1,  # mode "sharded": devices that split heads and the MLP (Megatron-style)
        "rules": layout.DEFAULT_RULES,  # logical axis name -> mesh axes (tfjax.parallel.layout)
        # Join a multi-process job (tfjax.parallel.distributed); the TFJAX_* variables of
        # experiments.launch_local also turn this on.
        "distributed": False,
        # For every process to join (then one error line names the missing ones); JAX's
        # default is 300.
        "initialization_timeout_seconds": 120,
        "heartbeat_timeout_seconds": 100,  # JAX's default: after it a silent process is dead
    }
    return config


def apply_preset(
    config: ml_collections.ConfigDict, presets: dict[str, dict], arg: str | None
) -> ml_collections.ConfigDict:
    """Applies the dotted-key overrides of preset `arg` (default "base")."""
    name = arg or "base"
    if name not in presets:
        raise errors.ConfigError(f"unknown preset {name!r}; choose one of {sorted(presets)}")
    for key in presets[name]:  # update_from_flattened_dict would add a misspelt key silently
        config_utils.check_key(config, key, f"preset {name!r}")
    config.update_from_flattened_dict(presets[name])
    return config


def get_search(searches: dict[str, dict], arg: str | None) -> dict:
    """The search `arg` (experiments.search; tfjax.runs.search_space says what it holds)."""
    if arg not in searches:
        raise errors.ConfigError(f"unknown search {arg!r}; choose one of {sorted(searches)}")
    return searches[arg]


def get_sweep(sweeps: dict[str, list[dict]], arg: str | None) -> list[dict]:
    """The list of dotted-key override dicts of sweep `arg`."""
    if arg not in sweeps:
        raise errors.ConfigError(f"unknown sweep {arg!r}; choose one of {sorted(sweeps)}")
    return sweeps[arg]
