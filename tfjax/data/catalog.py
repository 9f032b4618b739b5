"""The built-in data sources: one registered reader per `data.name` (see `tfjax.data.registry`).

Each reader turns a `registry.Request` (the `data` config, a split, the run's seed, the wanted
example format) into the raw examples of that split; `tfjax.data.datasets` tokenizes, filters
and packs them. Adding a corpus means adding one such function here, or registering it the same
way from your own module.
  * Generated from the seed, no files: "scan" (`tfjax.data.scan`, split `data.scan_split`), the
    algorithmic tasks "copy", "reverse", "sort", "parity", "majority" (`tfjax.data.tasks`) and
    "listops" (`tfjax.data.listops`). Their splits are "test" and "train".
  * Named corpora in the data directory, verified against the sums tfjax ships
    (`tfjax.data.sources`, `tfjax.data.corpora`): "multi30k" (translation; splits train, val,
    test2016), "tinyshakespeare" (a text stream; splits train, val).
  * "files": your own files. `train_path`/`eval_path` name line-aligned prefixes
    (`corpus/train` reads `corpus/train.{source_lang}` and `.{target_lang}`) or TSV files
    (source\\ttarget for translation, text\\tlabel for classification) or, for decoder_only
    models, plain text (no `eval_path`: the last 10% of the training text). Splits "test"
    (`eval_path`) and "train".
  * "hub": Hugging Face datasets (`hub_name`, `hub_config`; the `hub` extra), any split name.
"""

import pathlib

from tfjax import errors
from tfjax.data import listops, registry, scan, sources, tasks

GENERATED_SPLITS = ("test", "train")
TEXT_EVAL_FRACTION = 0.1  # plain-text LM files without eval_path: the last 10% is eval


# --- generated from the seed ----------------------------------------------------------------


def _check_scan(config) -> None:
    if config.scan_split not in scan.SPLITS:
        raise errors.ConfigError(
            f"DataConfig.scan_split={config.scan_split!r} is not one of {scan.SPLITS}"
        )


@registry.register(
    "scan", formats=registry.PAIRS, splits=GENERATED_SPLITS, seeded=True, check=_check_scan
)
def _scan(request: registry.Request) -> list[tuple[str, str]]:
    """SCAN split `data.scan_split`; the seed draws the random "simple" split."""
    return scan.split(request.config.scan_split, seed=request.seed)[request.split]


def _size_and_seed(request: registry.Request) -> tuple[int, int]:
    """Examples and seed of a generated split; the test seed differs from the train seed."""
    if request.split == "train":
        return request.config.num_train_examples, 2 * request.seed
    return request.config.num_eval_examples, 2 * request.seed + 1


def _sequence_task(generate, request: registry.Request) -> list[tuple[str, str]]:
    size, seed = _size_and_seed(request)
    config = request.config
    return generate(
        size,
        min_len=config.task_min_len,
        max_len=config.task_max_len,
        num_symbols=config.num_symbols,
        seed=seed,
    )


def _classification_task(name: str, request: registry.Request) -> list[tuple[str, int]]:
    size, seed = _size_and_seed(request)
    config = request.config
    return tasks.classification_task(
        name, size, min_len=config.task_min_len, max_len=config.task_max_len, seed=seed
    )


@registry.register("copy", formats=registry.PAIRS, splits=GENERATED_SPLITS, seeded=True)
def _copy(request: registry.Request) -> list[tuple[str, str]]:
    return _sequence_task(tasks.copy_task, request)


@registry.register("reverse", formats=registry.PAIRS, splits=GENERATED_SPLITS, seeded=True)
def _reverse(request: registry.Request) -> list[tuple[str, str]]:
    return _sequence_task(tasks.reverse_task, request)


@registry.register("sort", formats=registry.PAIRS, splits=GENERATED_SPLITS, seeded=True)
def _sort(request: registry.Request) -> list[tuple[str, str]]:
    return _sequence_task(tasks.sort_task, request)


@registry.register("parity", formats=registry.CLASSIFICATION, splits=GENERATED_SPLITS, seeded=True)
def _parity(request: registry.Request) -> list[tuple[str, int]]:
    return _classification_task("parity", request)


@registry.register(
    "majority", formats=registry.CLASSIFICATION, splits=GENERATED_SPLITS, seeded=True
)
def _majority(request: registry.Request) -> list[tuple[str, int]]:
    return _classification_task("majority", request)


@registry.register("listops", formats=registry.CLASSIFICATION, splits=GENERATED_SPLITS, seeded=True)
def _listops(request: registry.Request) -> list[tuple[str, int]]:
    size, seed = _size_and_seed(request)
    config = request.config
    return listops.generate(
        size,
        seed=seed,
        min_length=config.listops_min_len,
        max_length=config.listops_max_len,
        max_depth=config.listops_max_depth,
        max_args=config.listops_max_args,
    )


# --- the named corpora, checksummed ---------------------------------------------------------


@registry.register("multi30k", formats=registry.PAIRS, splits=sources.MULTI30K_SPLITS)
def _multi30k(request: registry.Request) -> list[tuple[str, str]]:
    config = request.config
    return sources.multi30k(
        sources.data_dir(config.dir),
        request.split,
        source_lang=config.source_lang,
        target_lang=config.target_lang,
    )


@registry.register("tinyshakespeare", formats=registry.TEXT, splits=sources.SHAKESPEARE_SPLITS)
def _tinyshakespeare(request: registry.Request) -> str:
    return sources.tinyshakespeare(sources.data_dir(request.config.dir), request.split)


# --- your own files and the hub -------------------------------------------------------------


def _check_files(config) -> None:
    if not config.train_path:
        raise errors.ConfigError("data.name='files' needs data.train_path (see DataConfig)")


def _is_prefix(config, path: str) -> bool:
    return bool(path) and pathlib.Path(f"{path}.{config.source_lang}").is_file()


def _is_text(config, path: str) -> bool:
    """Whether `path` is a plain-text file (not a TSV, nor the prefix of a parallel pair)."""
    return not path.endswith(".tsv") and not _is_prefix(config, path)


@registry.register(
    "files",
    formats=registry.FORMATS,
    splits=GENERATED_SPLITS,
    check=_check_files,
    streams=lambda config: _is_text(config, config.train_path),
)
def _files(request: registry.Request):
    """Pairs, (text, label) rows or a text string, as the model's format and the files say."""
    config, split = request.config, request.split
    path = config.train_path if split == "train" else config.eval_path
    if request.format == "classify":
        if not path:
            raise errors.ConfigError("classification files need data.eval_path for evaluation")
        return sources.read_classification(path)
    if request.format == "lm" and _is_text(config, path):
        if not config.eval_path:  # one text file: the last 10% evaluates
            text = sources.read_text(config.train_path)
            part = "train" if split == "train" else "val"
            return sources.split_text(text, part, 1 - TEXT_EVAL_FRACTION)
        return sources.read_text(path)
    if not path:
        raise errors.ConfigError("translation files need data.eval_path for evaluation")
    if path.endswith(".tsv"):
        return sources.read_parallel(path)
    return sources.read_parallel(f"{path}.{config.source_lang}", f"{path}.{config.target_lang}")


def _check_hub(config) -> None:
    if not config.hub_name:
        raise errors.ConfigError("data.name='hub' needs data.hub_name, e.g. 'wmt14'")


@registry.register("hub", formats=registry.PAIRS, splits=(), check=_check_hub)
def _hub(request: registry.Request) -> list[tuple[str, str]]:
    """Hub pairs; with a local builder ("json"), `train_path`/`eval_path` are its data files."""
    config = request.config
    files = config.train_path if request.split == "train" else config.eval_path
    return sources.hub_pairs(
        config.hub_name,
        request.split,
        config=config.hub_config,
        source_lang=config.source_lang,
        target_lang=config.target_lang,
        data_files=files or None,
    )
