"""``recommend``: which components of a ViT to finetune on a dataset, in minutes.

Measures, per component, the plasticity (the paper's criterion) and three alternatives
(relative gradient norm, gradient SNR, a data-free weight statistic), ranks the
configurations and writes ``<prefix>.md`` (ranked table + recommendation), ``<prefix>.parquet``
(one row per configuration and criterion) and ``<prefix>.png``/``.pdf``.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitplasticity.commands import json_argument

if TYPE_CHECKING:
    from collections.abc import Iterator

    import torch

    from vitplasticity.data.store import Split
    from vitplasticity.models import Preprocessing

log = logging.getLogger(__name__)

DEFAULT_CONFIGURATIONS: tuple[str, ...] = (
    "ln1",
    "mha",
    "ln2",
    "fc1",
    "fc2",
    "mha+fc1",
    "ln1+ln2",
    "fc1+fc2",
)
"""The five components and the combined experiment's three pairs (config.yaml)."""

REFERENCE_FALLBACKS: dict[str, str] = {
    "pool": "the dataset's own pool (train) images, in file order",
    "synthetic": "generated 'palette' images at the model's resolution (data/synthetic.py)",
}
"""Named reference sets for when ImageNet is not at hand (--reference-fallback)."""

_FALLBACK_CAVEAT = (
    "not the paper's ImageNet reference: plasticity then measures how the components respond "
    "to the difference between {what} and the downstream images, not the shift from "
    "pretraining data"
)
_SYNTHETIC_CLASSES = 8


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``recommend`` subcommand."""
    parser = subparsers.add_parser(
        "recommend",
        help="which components to finetune: plasticity and alternative criteria, ranked",
        description="Rank ln1, mha, ln2, fc1, fc2 (and '+' combinations) of a timm ViT for "
        "finetuning on a dataset: measured plasticity (mean, 95%% CI), relative gradient norm "
        "and gradient SNR after a head warm-up, and a data-free weight statistic; recommend "
        "the best configuration under a trainable-parameter budget. A heuristic from the "
        "paper's finding (higher plasticity, better finetuning), not a finetuning result.",
    )
    model = parser.add_argument_group("model (--model-spec, or --timm-id with its options)")
    model.add_argument("--model-spec", type=json_argument, help="a config.yaml models entry (JSON)")
    model.add_argument("--timm-id", help="timm model id, e.g. vit_base_patch16_224.orig_in21k")
    model.add_argument(
        "--weights", default="hub", help="with --timm-id: hub | random | local weights file"
    )
    model.add_argument(
        "--normalize", default="pretrained", help="with --timm-id: pretrained | imagenet"
    )
    model.add_argument(
        "--model-kwargs", type=json_argument, default={}, help="with --timm-id: timm kwargs (JSON)"
    )
    model.add_argument("--model", help="model name in the outputs (default: the timm id)")
    data = parser.add_argument_group("dataset (one of --dataset-dir, --image-folder)")
    data.add_argument("--dataset-dir", help="a prepared dataset folder (vitplasticity prepare)")
    data.add_argument(
        "--image-folder",
        help="an ImageFolder tree root/<class>/<image> (or root/{train,test}/<class>/...); "
        "prepared into a temporary folder",
    )
    data.add_argument("--dataset", help="dataset name in the outputs (default: the folder name)")
    reference = parser.add_argument_group("reference set (one of)")
    reference.add_argument(
        "--reference", help="reference set Parquet (vitplasticity reference; paper: ImageNet)"
    )
    reference.add_argument(
        "--reference-fallback",
        choices=sorted(REFERENCE_FALLBACKS),
        help="without ImageNet: pool (the dataset's own pool images) | synthetic (generated); "
        "outputs say so",
    )
    parser.add_argument("--n-pairs", type=int, default=1024, help="plasticity image pairs")
    parser.add_argument(
        "--batch-size", type=int, default=32, help="images per gradient batch and pairs per pass"
    )
    parser.add_argument("--batches", type=int, default=8, help="gradient batches (>= 2)")
    parser.add_argument(
        "--warmup-steps", type=int, default=50, help="head-only SGD steps before the gradients"
    )
    parser.add_argument("--warmup-lr", type=float, default=0.01, help="head warm-up SGD LR")
    parser.add_argument(
        "--budget", default=None, help="trainable-parameter budget: 28000, 28K, 1.5M (none)"
    )
    parser.add_argument(
        "--criterion",
        default="plasticity",
        choices=["plasticity", "relative_gradient_norm", "gradient_snr", "weight_spectral"],
        help="what the recommendation ranks by (default: plasticity, the paper's)",
    )
    parser.add_argument(
        "--combine",
        action="store_true",
        help="recommend the greedy union of components that fits --budget",
    )
    parser.add_argument(
        "--configurations",
        nargs="+",
        default=list(DEFAULT_CONFIGURATIONS),
        metavar="C",
        help="components and '+' combinations to rank",
    )
    parser.add_argument("--seed", type=int, default=0, help="head init and batch order")
    parser.add_argument("--device", default="auto", help="auto (GPU when present), cpu, cuda")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--demo", action="store_true", help="label the outputs as a demo")
    parser.add_argument(
        "--out-prefix", required=True, help="writes PREFIX.md, .parquet, .png and .pdf"
    )
    parser.set_defaults(handler=run_recommend)


@dataclass(frozen=True)
class _Inputs:
    """The checked arguments, before any compute."""

    spec: Any
    model: str
    dataset_source: str
    dataset: str
    budget: int | None
    configurations: list[str]


def check_arguments(args: argparse.Namespace) -> _Inputs:
    """Check every argument; name the flag of the first bad one.

    Raises:
        ValueError: for a bad flag value or a missing/contradictory choice.
    """
    from vitplasticity.models import ModelSpec
    from vitplasticity.recommend.criteria import configuration_components
    from vitplasticity.recommend.ranking import parse_budget

    for flag, sources in (
        ("--model-spec / --timm-id", (args.model_spec, args.timm_id)),
        ("--dataset-dir / --image-folder", (args.dataset_dir, args.image_folder)),
        ("--reference / --reference-fallback", (args.reference, args.reference_fallback)),
    ):
        given = sum(source is not None for source in sources)
        if given != 1:
            raise ValueError(f"{flag}: give exactly one ({given} given)")
    for part in args.configurations:
        try:
            configuration_components(part)
        except ValueError as error:
            raise ValueError(f"--configurations: {error}") from None
    if len(set(args.configurations)) != len(args.configurations):
        raise ValueError(f"--configurations: a configuration is named twice: {args.configurations}")
    try:
        budget = parse_budget(args.budget)
    except ValueError as error:
        raise ValueError(f"--budget: {error}") from None
    if args.combine and budget is None:
        raise ValueError("--combine needs --budget (without one the union is every component)")
    for flag, value, least in (
        ("--n-pairs", args.n_pairs, 1),
        ("--batch-size", args.batch_size, 1),
        ("--batches", args.batches, 2),
        ("--warmup-steps", args.warmup_steps, 0),
    ):
        if value < least:
            raise ValueError(f"{flag} must be >= {least}, got {value}")
    if not args.warmup_lr > 0:
        raise ValueError(f"--warmup-lr must be > 0, got {args.warmup_lr}")
    if args.model_spec is not None:
        try:
            spec = ModelSpec.from_config(args.model_spec)
        except (TypeError, ValueError) as error:
            raise ValueError(f"--model-spec: {error}") from None
    else:
        spec = ModelSpec(
            timm_id=args.timm_id,
            weights=args.weights,
            normalize=args.normalize,
            kwargs=dict(args.model_kwargs),
        )
    if args.reference is not None and not Path(args.reference).is_file():
        raise FileNotFoundError(f"--reference: reference set not found: {args.reference}")
    source = args.dataset_dir if args.dataset_dir is not None else args.image_folder
    if not Path(source).is_dir():
        flag = "--dataset-dir" if args.dataset_dir is not None else "--image-folder"
        raise FileNotFoundError(f"{flag}: folder not found: {source}")
    return _Inputs(
        spec=spec,
        model=args.model or spec.timm_id,
        dataset_source=str(source),
        dataset=args.dataset or Path(source).resolve().name,
        budget=budget,
        configurations=list(args.configurations),
    )


def run_recommend(args: argparse.Namespace) -> int:
    inputs = check_arguments(args)
    if args.image_folder is not None:
        from vitplasticity.data.imagefolder import prepare_image_folder

        with tempfile.TemporaryDirectory(prefix="vitplasticity-recommend-") as tmp:
            prepared = Path(tmp) / inputs.dataset
            counts = prepare_image_folder(inputs.dataset_source, prepared, inputs.dataset)
            log.info("image folder %s read: %s", inputs.dataset_source, counts)
            return _recommend(args, inputs, prepared)
    return _recommend(args, inputs, Path(inputs.dataset_source))


def _read_dataset(dataset_dir: Path, flag: str) -> tuple[Split, Split, int]:
    """(pool, test, num_classes) of a prepared dataset, checked non-empty."""
    from vitplasticity.data.store import read_meta, read_split

    meta = read_meta(dataset_dir)
    pool, test = read_split(dataset_dir, "pool"), read_split(dataset_dir, "test")
    for name, split in (("pool", pool), ("test", test)):
        if not len(split):
            raise ValueError(f"{flag}: {dataset_dir}: split {name!r} holds no images")
    num_classes = int(meta["num_classes"])
    if num_classes < 2:
        raise ValueError(f"{flag}: {dataset_dir}: {num_classes} class; gradients need >= 2")
    return pool, test, num_classes


def labelled_batches(
    split: Split,
    pre: Preprocessing,
    batch_size: int,
    steps: range,
    seed: int,
    device: torch.device,
    dtype: torch.dtype,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Eval-preprocessed (images, labels) batches of ``split`` for ``steps``: the batch of
    step s is :func:`vitplasticity.data.loader.batch_indices` (seeded epochs, no
    augmentation, so the criteria are deterministic)."""
    import torch

    from vitplasticity.data.loader import batch_indices
    from vitplasticity.data.transforms import eval_image, normalize

    for step in steps:
        indices = batch_indices(step, batch_size, len(split), seed)
        images = normalize(torch.stack([eval_image(split.images[i], pre) for i in indices]), pre)
        labels = torch.as_tensor(split.labels[indices], dtype=torch.int64)
        yield images.to(device=device, dtype=dtype), labels.to(device)


def _reference_images(args: argparse.Namespace, pool: Split) -> tuple[list[bytes] | None, str]:
    """The reference images (None for the synthetic fallback, which is drawn at the model's
    resolution once the model is built) and how the outputs name them.

    Raises:
        ValueError: when the reference set holds fewer images than --n-pairs.
    """
    from vitplasticity.commands.plasticity import read_reference_images

    if args.reference_fallback == "synthetic":
        label = f"fallback `synthetic` ({_FALLBACK_CAVEAT.format(what='generated images')})"
        return None, label
    if args.reference is not None:
        images = read_reference_images(args.reference)
        source = f"--reference {args.reference}"
        label = f"`{Path(args.reference).name}` ({len(images):,} images)"
    else:
        images, source = pool.images, "--reference-fallback pool"
        label = f"fallback `pool` ({_FALLBACK_CAVEAT.format(what='images of the same dataset')})"
    if len(images) < args.n_pairs:
        raise ValueError(
            f"{source}: {len(images)} reference images, fewer than --n-pairs {args.n_pairs}"
        )
    return images[: args.n_pairs], label


def _synthetic_reference(n: int, pre: Preprocessing, seed: int) -> list[bytes]:
    """``n`` generated palette images at the model's input size, PNG-encoded."""
    from vitplasticity.data.store import encode_png
    from vitplasticity.data.synthetic import synthetic_images

    pixels, _ = synthetic_images("palette", _SYNTHETIC_CLASSES, n, pre.input_size, seed)
    return [encode_png(image) for image in pixels]


def _recommend(args: argparse.Namespace, inputs: _Inputs, dataset_dir: Path) -> int:
    import torch

    from vitplasticity import COMPONENTS
    from vitplasticity.adapters import TimmViT, adapter_for
    from vitplasticity.commands.plasticity import ProgressReporter, decoded_batches
    from vitplasticity.models import build_model, pick_device, preprocessing
    from vitplasticity.recommend.criteria import measure_criteria
    from vitplasticity.recommend.ranking import build_table, greedy_union, select

    flag = "--image-folder" if args.image_folder is not None else "--dataset-dir"
    pool, test, num_classes = _read_dataset(dataset_dir, flag)
    reference, reference_label = _reference_images(args, pool)
    device = pick_device(args.device)
    dtype = getattr(torch, args.dtype)
    # The run seed draws the new head (as in finetune); a random-init backbone has its own.
    torch.manual_seed(args.seed)
    model = build_model(inputs.spec, num_classes=num_classes).eval()
    if type(adapter_for(model)) is not TimmViT:
        raise ValueError(
            f"{inputs.spec.timm_id}: recommend ranks the finetuning configurations of timm "
            f"VisionTransformer models; {type(model).__name__} is not one"
        )
    TimmViT().blocks(model)  # names a missing component before any compute
    model = model.to(device=device, dtype=dtype)
    pre = preprocessing(model, inputs.spec)
    if reference is None:
        reference = _synthetic_reference(args.n_pairs, pre, args.seed)
    n = args.n_pairs
    cycled = [test.images[i % len(test)] for i in range(n)]
    log.info(
        "%s on %s: %d pairs, %d warm-up steps, %d gradient batches of %d, %s on %s",
        inputs.model,
        inputs.dataset,
        n,
        args.warmup_steps,
        args.batches,
        args.batch_size,
        args.dtype,
        device,
    )

    def batches(steps: range) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return labelled_batches(pool, pre, args.batch_size, steps, args.seed, device, dtype)

    progress = ProgressReporter(n, f"plasticity {inputs.model}/{inputs.dataset}")
    try:
        measurements = measure_criteria(
            model,
            decoded_batches(reference, pre, args.batch_size),
            decoded_batches(cycled, pre, args.batch_size),
            batches(range(args.warmup_steps)),
            batches(range(args.warmup_steps, args.warmup_steps + args.batches)),
            n_pairs=n,
            warmup_lr=args.warmup_lr,
            batch_size=args.batch_size,
            progress=progress,
        )
    finally:
        progress.close()

    configurations = list(inputs.configurations)
    if args.combine:
        values = {c: measurements.estimates(c)[args.criterion].value for c in COMPONENTS}
        recommendation = greedy_union(
            values, measurements.component_parameters, inputs.budget, args.criterion
        )
        if recommendation.configuration and recommendation.configuration not in configurations:
            configurations.append(recommendation.configuration)  # its row must be in the table
    table = build_table(measurements, configurations, model=inputs.model, dataset=inputs.dataset)
    if not args.combine:
        recommendation = select(table, args.criterion, inputs.budget)
    settings = {
        "model_spec": asdict(inputs.spec),
        "dataset_source": inputs.dataset_source,
        "reference": args.reference,
        "reference_fallback": args.reference_fallback,
        "n_pairs": n,
        "protocol": "embedding",
        "batch_size": args.batch_size,
        "batches": args.batches,
        "warmup_steps": args.warmup_steps,
        "warmup_lr": args.warmup_lr,
        "budget": inputs.budget,
        "criterion": args.criterion,
        "combine": args.combine,
        "configurations": configurations,
        "seed": args.seed,
        "device": args.device,
        "dtype": args.dtype,
        "preprocessing": asdict(pre),
    }
    _write_outputs(
        args, inputs, table, recommendation, measurements, reference_label, settings, device
    )
    return 0


def _write_outputs(
    args: argparse.Namespace,
    inputs: _Inputs,
    table: Any,
    recommendation: Any,
    measurements: Any,
    reference_label: str,
    settings: dict[str, Any],
    device: Any,
) -> None:
    """Write PREFIX.png/.pdf, PREFIX.md and PREFIX.parquet, each atomically."""
    from vitplasticity.io import atomic_path, write_parquet
    from vitplasticity.provenance import provenance
    from vitplasticity.recommend.figure import save_figure
    from vitplasticity.recommend.ranking import markdown
    from vitplasticity.report.style import DEMO_NOTE

    prefix = args.out_prefix
    # matplotlib's PDF backend has fontTools log every subset font at INFO.
    logging.getLogger("fontTools").setLevel(logging.WARNING)
    save_figure(
        table,
        recommendation,
        [f"{prefix}.png", f"{prefix}.pdf"],
        title=f"Which components to finetune? {inputs.model} on {inputs.dataset}",
        demo=args.demo,
    )
    text = markdown(
        table,
        recommendation,
        model=inputs.model,
        dataset=inputs.dataset,
        reference=reference_label,
        always_trained=measurements.always_trained,
        demo=args.demo,
        demo_note=DEMO_NOTE,
    )
    with atomic_path(f"{prefix}.md") as tmp:
        tmp.write_text(text)
    metadata = {
        "provenance": provenance(settings, device),
        "model": inputs.model,
        "dataset": inputs.dataset,
        "demo": bool(args.demo),
        "reference": reference_label,
        "recommendation": asdict(recommendation),
        "always_trained_parameters": measurements.always_trained,
        "component_parameters": measurements.component_parameters,
    }
    write_parquet(f"{prefix}.parquet", table, metadata)
    log.info("wrote %s.{md,parquet,png,pdf}: %s", prefix, recommendation)
