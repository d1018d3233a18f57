"""Cross-checks of a workflow config that only its values together (or the files it names) can
tell, run by :func:`vitplasticity.workflow.config.check_config` when the Snakefile is parsed, before
any job: each returns one message per problem, starting with the config key at fault and
saying what to write instead.

Plain Python: nothing here imports torch, except :func:`model_kwargs_problems`, which only the
main Snakemake process calls (the SLURM plugin re-parses the Snakefile for every job).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from vitplasticity.data.imagenet_layouts import IMAGENET_ENV, IMAGENET_LAYOUTS
from vitplasticity.data.sources import registry
from vitplasticity.models.spec import known_family
from vitplasticity.models.text import stated_positions, untied_bare_model
from vitplasticity.settings.sequences import sequence_settings
from vitplasticity.workflow.dataset_kinds import IMAGES, dataset_kind
from vitplasticity.workflow.recommend_jobs import recommend_cells

# The ImageNet-1k validation set: 50 images of each of 1000 classes (docs/protocol.md).
IMAGENET_VAL_IMAGES = 50_000
# A seed is stored in the results as a 64-bit signed integer (and numpy takes no negative one).
MAX_SEED = 2**63 - 1
SEED_KEYS = ("seed", "seeds", "init_seed")
# The learning rates a grid may hold (the paper's grids span 1e-5 to 0.06; the schema's
# learning_rates description and docs/configuration.md state the range).
LR_RANGE = (1e-8, 10.0)
DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:\d+)?")
DEVICE_KEYS = ("plasticity", "text_plasticity", "recommend", "finetune")
# The splits of a prepared dataset of each source (vitplasticity.data.sources); image_folder's
# depend on its folder (image_folder_splits).
SPLITS_BY_SOURCE: dict[str, tuple[str, ...]] = {
    source: tuple(s for s in ("pool", "val", "test") if s in counts)
    for source, counts in registry.KNOWN_COUNTS.items()
}
SPLITS_BY_SOURCE["domainnet"] = ("pool", "test")
SPLITS_BY_SOURCE["synthetic"] = ("pool", "test")


def _names(items: Iterable[str]) -> str:
    return ", ".join(sorted(items))


def path_problems(config: Mapping[str, Any]) -> list[str]:
    """``paths.results`` and ``paths.resources`` must be folders (or not exist yet)."""
    problems = []
    for key in ("resources", "results"):
        value = config["paths"].get(key)
        if value and Path(value).exists() and not Path(value).is_dir():
            problems.append(
                f"paths.{key}: {value!r} is a file, not a folder: name a folder (it is "
                "created if missing)"
            )
    return problems


def input_file_problems(config: Mapping[str, Any]) -> list[str]:
    """The files a stage will read, by a stat: ImageNet val (``paths.imagenet``, or the
    environment variable that overrides it) while the reference set it makes is still to be
    made (once made, a run elsewhere needs no ImageNet); text datasets' files:
    :func:`vitplasticity.workflow.dataset_kinds.text_dataset_problems`."""
    problems = []
    # the reference job's output (vitplasticity.workflow.datasets.DatasetJobs.reference_file)
    reference_file = Path(
        config["paths"].get("resources", "resources"),
        "reference",
        f"{config['reference']['name']}.parquet",
    )
    imagenet = os.environ.get(IMAGENET_ENV) or config["paths"].get("imagenet")
    needed = config["reference"].get("source", "imagenet") == "imagenet"
    if imagenet and needed and not reference_file.exists():
        path = Path(os.path.expanduser(str(imagenet)))
        if not path.exists():
            key = (
                f"{IMAGENET_ENV} (overrides paths.imagenet)"
                if IMAGENET_ENV in os.environ
                else "paths.imagenet"
            )
            problems.append(
                f"{key}: {str(imagenet)!r} does not exist: give ImageNet-1k val "
                f"({'; '.join(IMAGENET_LAYOUTS)})"
            )
    return problems


def archive_problems(name: str, spec: Mapping[str, Any]) -> list[str]:
    """The files ``datasets.<name>.archive`` points at must exist, and a single path of a
    source of several files must be a folder holding them all (one file would leave the
    others to be downloaded, unseen). A mapping may name some files only: the others are
    downloaded, as its user chose."""
    archive, source = spec.get("archive"), spec.get("source", "")
    if not archive or not registry.has_files(source):
        return []
    try:
        files = registry.source_files(source, spec)
    except ValueError:
        return []  # named by registry.entry_problems
    key = f"datasets.{name}.archive"
    if isinstance(archive, Mapping):
        return [
            f"{key}.{filename}: {str(path)!r} is not a file: give the path of your copy of "
            f"{filename}, or leave it out of archive: to download it"
            for filename, path in archive.items()
            if filename in files and not Path(os.path.expanduser(str(path))).is_file()
        ]
    path = Path(os.path.expanduser(str(archive)))
    every = ", ".join(files)
    mapping = ", ".join(f"{f}: <path>" for f in files)
    if path.is_dir():
        missing = [f for f in files if not (path / f).is_file()]
        if not missing:
            return []
        return [
            f"{key}: the folder {str(archive)!r} lacks {', '.join(missing)} (this {source} "
            f"entry needs {every}, under these names): put them there, or map each file you "
            f"have to its path (archive: {{{mapping}}}; files left out are downloaded)"
        ]
    if not path.exists():
        return [
            f"{key}: {str(archive)!r} does not exist: give the path of your {files[0]}"
            + (f" (or a folder holding {every})" if len(files) > 1 else "")
            + ", or remove archive: to download it"
        ]
    if len(files) > 1:
        return [
            f"{key}: {str(archive)!r} is one file, but this {source} entry needs "
            f"{len(files)}: {every}; missing: {', '.join(files[1:])}. Point archive at a "
            f"folder holding all of them under these names, or map each file to its path "
            f"(archive: {{{mapping}}}; files left out of the mapping are downloaded)"
        ]
    return []


def image_folder_splits(spec: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The splits an image_folder entry prepares (train/, val/ and test/ subfolders give
    pool, val and test; otherwise a pool/test split); None when its root is not a folder."""
    root = spec.get("root")
    if not root or not Path(root).is_dir():
        return None
    if (Path(root) / "train").is_dir() and (Path(root) / "test").is_dir():
        return ("pool", "val", "test") if (Path(root) / "val").is_dir() else ("pool", "test")
    return ("pool", "test")


def image_folder_problems(name: str, spec: Mapping[str, Any]) -> list[str]:
    """An image_folder entry needs ``root``, an existing folder."""
    if spec.get("source") != "image_folder":
        return []
    root = spec.get("root")
    key = f"datasets.{name}.root"
    if not root:
        return [
            f"{key}: missing: an image_folder entry reads its images from root: <folder> "
            "(a <class>/<image> tree, or train/ and test/ folders of such trees)"
        ]
    if not Path(root).is_dir():
        return [f"{key}: {root!r} is not a folder: give the folder of your <class>/<image> tree"]
    return []


def dataset_splits(spec: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The splits of a dataset entry's prepared store; None when not known before preparing."""
    if spec.get("source") == "image_folder":
        return image_folder_splits(spec)
    return SPLITS_BY_SOURCE.get(spec.get("source", ""))


def split_problems(config: Mapping[str, Any]) -> list[str]:
    """Every split a stage reads must be one its dataset has (only flowers102 and an
    image_folder with a val/ folder have a val split)."""
    datasets = config["datasets"]
    users = []
    reference = config["reference"]
    if reference.get("source") == "dataset" and reference.get("dataset") in datasets:
        users.append(("reference.split", reference.get("split", "test"), reference["dataset"]))
    downstream = config["plasticity"].get("downstream_split", "test")
    users += [
        ("plasticity.downstream_split", downstream, name)
        for name in config["plasticity"]["datasets"]
        if name in datasets
    ]
    problems = []
    for key, split, name in users:
        splits = dataset_splits(datasets[name])
        if splits is not None and split not in splits:
            problems.append(
                f"{key}: {split!r}, but dataset {name!r} ({datasets[name]['source']}) has no "
                f"{split} split (its splits: {', '.join(splits)}): pick one of these"
            )
    return problems


def reference_size(config: Mapping[str, Any]) -> int | None:
    """How many images the reference set can hold at most; None when not known before
    preparing (an image_folder)."""
    reference = config["reference"]
    if reference.get("source", "imagenet") == "imagenet":
        return IMAGENET_VAL_IMAGES
    spec = config["datasets"].get(reference.get("dataset"))
    if spec is None:
        return None
    split = reference.get("split", "test")
    if spec.get("source") == "synthetic":
        return {"pool": spec.get("n_pool"), "test": spec.get("n_test")}.get(split)
    return registry.KNOWN_COUNTS.get(spec.get("source", ""), {}).get(split)


def pair_problems(config: Mapping[str, Any]) -> list[str]:
    """``reference.n_images`` within the set it is drawn from; every image stage's plasticity
    pairs within the reference set (pair i starts from reference image i; only the downstream
    images are cycled): recommend's where it ranks an image dataset (on labelled text its
    pairs are reference sequences)."""
    problems = []
    reference = config["reference"]
    n_images, available = reference["n_images"], reference_size(config)
    if available is not None and n_images > available:
        where = (
            "ImageNet-1k val"
            if reference.get("source", "imagenet") == "imagenet"
            else f"the {reference.get('split', 'test')} split of {reference.get('dataset')!r}"
        )
        problems.append(
            f"reference.n_images: {n_images} is more than the {available:,} images of "
            f"{where}: at most {available}"
        )
    recommend = config.get("recommend") or {}
    stages = [("plasticity.n_pairs", config["plasticity"]["n_pairs"])]
    ranks_images = any(
        dataset_kind(config["datasets"].get(dataset)) == IMAGES
        for _, dataset in recommend_cells(config)
    )
    if recommend.get("enabled") and recommend.get("n_pairs") is not None and ranks_images:
        stages.append(("recommend.n_pairs", recommend["n_pairs"]))
    for key, n_pairs in stages:
        if n_pairs > n_images:
            problems.append(
                f"{key}: {n_pairs} pairs, but the reference set holds reference.n_images = "
                f"{n_images} images (pair i starts from reference image i): at most {n_images}, "
                "or raise reference.n_images"
            )
    return problems


def finetune_problems(config: Mapping[str, Any]) -> list[str]:
    """The micro-batch must divide the batch (gradients accumulate over whole micro-batches)."""
    finetune = config["finetune"]
    batch, micro = finetune["batch_size"], finetune["micro_batch_size"]
    if batch % micro:
        return [
            f"finetune.micro_batch_size: {micro} does not divide finetune.batch_size {batch}: "
            f"pick a divisor of {batch} (e.g. {_divisor_below(batch, micro)})"
        ]
    return []


def _divisor_below(number: int, limit: int) -> int:
    """The largest divisor of ``number`` not above ``limit``."""
    return max(d for d in range(1, min(number, limit) + 1) if number % d == 0)


def device_problems(config: Mapping[str, Any]) -> list[str]:
    """Every ``device`` setting is auto, cpu, cuda, cuda:<index> or mps."""
    problems = []
    for block in DEVICE_KEYS:
        device = (config.get(block) or {}).get("device")
        if device is not None and not DEVICE_PATTERN.fullmatch(str(device)):
            problems.append(
                f"{block}.device: {device!r} is not a device: auto (GPU when present), cpu, "
                "cuda, cuda:<index> or mps"
            )
    return problems


def _duplicates(values: Iterable[Any]) -> list[Any]:
    seen: list[Any] = []
    twice: list[Any] = []
    for value in values:
        if value in seen and value not in twice:
            twice.append(value)
        seen.append(value)
    return twice


def lr_problems(key: str, lrs: list[Any]) -> list[str]:
    """The learning rates of the grid at ``key``: each finite and within :data:`LR_RANGE` (one
    outside it is a typo: 1e300, or 5 for 5e-5), none twice (two runs would write one folder)."""
    low, high = LR_RANGE
    problems = []
    for index, lr in enumerate(lrs):
        if not isinstance(lr, int | float) or not math.isfinite(lr) or lr <= 0:
            problems.append(f"{key}: {lr!r} is not a learning rate (a finite number > 0)")
        elif not low <= lr <= high:
            problems.append(
                f"{key}[{index}]: {lr!r} is outside the learning rates a run can use "
                f"({low:g} to {high:g}): check its exponent"
            )
    return problems + listed_twice(key, [float(lr) for lr in lrs if isinstance(lr, int | float)])


def listed_twice(key: str, values: Iterable[Any]) -> list[str]:
    """One message per value the list at ``key`` holds twice (two runs would write one folder)."""
    return [f"{key}: {value!r} is listed twice: list it once" for value in _duplicates(values)]


def grid_problems(config: Mapping[str, Any], experiments: Iterable[str]) -> list[str]:
    """The grids of the ``experiments``: :func:`lr_problems` of each list of learning rates,
    :func:`listed_twice` of the models and datasets."""
    problems = []
    for name in experiments:
        exp = config["experiments"][name]
        grids = {"lrs": exp.get("lrs") or []}
        grids |= {f"lrs_by_dataset.{d}": v for d, v in (exp.get("lrs_by_dataset") or {}).items()}
        for field, lrs in grids.items():
            problems += lr_problems(f"experiments.{name}.{field}", lrs)
        for field in ("models", "datasets"):  # seeds: the schema's uniqueItems
            problems += listed_twice(f"experiments.{name}.{field}", exp.get(field) or [])
    return problems


def _seeds(value: Any, path: str) -> Iterable[tuple[str, Any]]:
    """(key path, seed) of every seed below ``value`` (keys SEED_KEYS)."""
    if not isinstance(value, Mapping):
        return
    for key, item in value.items():
        where = f"{path}.{key}" if path else str(key)
        if key in SEED_KEYS and isinstance(item, list):
            yield from ((f"{where}[{i}]", seed) for i, seed in enumerate(item))
        elif key in SEED_KEYS:
            yield where, item
        else:
            yield from _seeds(item, where)


def seed_problems(config: Mapping[str, Any]) -> list[str]:
    """Every seed (``seed``, ``seeds``, ``init_seed`` at any level) within 0 .. 2**63 - 1."""
    return [
        f"{key}: {seed} is out of the range of a seed (0 to 2**63 - 1 = {MAX_SEED}): pick a "
        "smaller one"
        for key, seed in _seeds(config, "")
        if isinstance(seed, int) and not 0 <= seed <= MAX_SEED
    ]


def report_problems(config: Mapping[str, Any], experiments: list[str]) -> list[str]:
    """The report's names resolve: the Wilcoxon reference component is trained by an enabled
    experiment (else no Wilcoxon table is made), and ``optimizer_comparison`` names two
    defined experiments (or none)."""
    report = config["report"]
    problems = []
    compared = report.get("optimizer_comparison", [])
    unknown = [name for name in compared if name not in config["experiments"]]
    if unknown:
        problems.append(
            f"report.optimizer_comparison: unknown experiment(s) {', '.join(map(repr, unknown))} "
            f"(defined: {_names(config['experiments'])}): name two of these, or [] for no figure"
        )
    elif len(compared) == 1:
        problems.append(
            f"report.optimizer_comparison: {compared} names one experiment: name two (the "
            "figure plots one's accuracies against the other's), or [] for no figure"
        )
    elif len(compared) == 2 and compared[0] == compared[1]:
        problems.append(
            f"report.optimizer_comparison: {compared} compares experiment {compared[0]!r} "
            "with itself: name two different experiments, or [] for no figure"
        )
    component = report.get("reference_component", "mha")
    tested = {
        name: config["experiments"][name].get("configurations") or []
        for name in experiments
        if len(config["experiments"][name].get("configurations") or []) > 1
    }
    if tested and not any(component in configs for configs in tested.values()):
        trained = {c for configs in tested.values() for c in configs}
        problems.append(
            f"report.reference_component: {component!r} is trained by no enabled experiment "
            f"({', '.join(tested)}), so no Wilcoxon table would be made: pick one of "
            f"{_names(trained)}"
        )
    return problems


def _read_checked(cache: Path | None) -> set[str]:
    """The model keys a cache file lists as built before (none for a missing or odd file)."""
    try:
        return set(json.loads(cache.read_text())) if cache else set()
    except (OSError, ValueError, TypeError):
        return set()


def _write_checked(cache: Path, keys: set[str]) -> None:
    """Record ``keys`` as built (atomically; a cache that cannot be written is skipped)."""
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_name(f"{cache.name}.{os.getpid()}.partial")
        partial.write_text(json.dumps(sorted(keys)))
        partial.replace(cache)
    except OSError:
        pass


def model_kwargs_problems(
    models: Mapping[str, Mapping[str, Any]], cache: str | os.PathLike[str] | None = None
) -> list[str]:
    """Build every model entry its family checks at parse time (a timm entry with ``kwargs``)
    once on the meta device (no memory, no weights), so that a wrong keyword or id is named
    before any job (:meth:`vitplasticity.models.spec.ModelSpec.meta_build_problem`).

    Imports torch (seconds), only when an entry's build key (its family's
    ``meta_build_key``: for timm, timm's version, the id and the kwargs) is not in ``cache``
    as built before; the entries that build are added to it.

    Args:
        models: the config's ``models`` block.
        cache: a JSON file of the entries built before (None: build every one, record none).
    """
    cache = Path(cache) if cache is not None else None
    built = _read_checked(cache)
    entries = {}
    for name, entry in models.items():
        spec = known_family(entry)
        key = spec.meta_build_key(entry) if spec is not None else None
        if key is not None and key not in built:
            entries[name] = (spec, key)
    problems = []
    before = len(built)
    for name, (spec, key) in entries.items():
        problem = spec.meta_build_problem(name, models[name])
        if problem is None:
            built.add(key)
        else:
            problems.append(problem)
    if cache is not None and len(built) > before:
        _write_checked(cache, built)
    return problems


def recommend_input_problems(config: Mapping[str, Any]) -> list[str]:
    """What the recommend and text stages would refuse when their jobs start, known from the
    config alone: ``recommend.combine`` without ``recommend.budget``; a text plasticity
    reference dataset's ``sequence_length`` beyond the positions a random text model's config
    states; and, for recommend --text, a bare text model whose config unties its LM head."""
    problems = []
    recommend = config.get("recommend") or {}
    if recommend.get("enabled") and recommend.get("combine") and recommend.get("budget") is None:
        problems.append(
            "recommend.combine: true needs recommend.budget (without one the union is every "
            "component): set a budget such as 28K, or combine: false"
        )
    text = config.get("text_plasticity") or {}
    if not text.get("enabled"):
        return problems
    reference = (config.get("datasets") or {}).get(text.get("reference"))
    length = sequence_settings(reference)["sequence_length"] if reference else None
    for name in text.get("run_models") or []:
        entry = config["models"].get(name)
        if not isinstance(entry, Mapping):
            continue  # named by model_problems
        limit = stated_positions(entry)
        if isinstance(length, int) and limit is not None and length > limit:
            problems.append(
                f"datasets.{text['reference']}.sequence_length: {length} exceeds the {limit} "
                f"positions that models.{name}.config states (text_plasticity measures it on "
                f"sequences of that length): at most {limit}, or give the model more positions"
            )
        bare = untied_bare_model(entry)
        if recommend.get("enabled") and bare is not None:
            problems.append(
                f"models.{name}.config.tie_word_embeddings: false, but {bare} has no LM head, "
                "and recommend --text's next-token loss needs one (a bare model holds no head "
                "weights when they are untied): name the causal-LM class in "
                f"models.{name}.model_class (e.g. LlamaForCausalLM), or tie them"
            )
    return problems
