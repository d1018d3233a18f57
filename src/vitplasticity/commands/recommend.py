"""``recommend``: which components of a ViT to finetune on a dataset, in minutes.

Parses the flags into the declared settings
(:class:`vitplasticity.recommend.settings.RecommendImageSettings`) and the inputs
(:class:`vitplasticity.recommend.pipeline.RecommendInputs`), prepares an --image-folder into a
temporary folder, and calls the stage (:mod:`vitplasticity.recommend.pipeline`),
which writes ``<prefix>.md`` (ranked table + recommendation), ``<prefix>.json`` (the decision:
its parameter names and PEFT configs), ``<prefix>.parquet`` (one row per configuration and
criterion) and ``<prefix>.png``/``.pdf``.

With ``--text``, the same for a causal language model on the user's text files against a
reference text (:mod:`vitplasticity.recommend.text`, settings
:class:`~vitplasticity.recommend.settings.RecommendTextSettings`); it writes the .md, .json
and .parquet.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitplasticity.commands import (
    add_text_settings,
    check_out_prefix,
    own_defaults,
    refuse_given,
    track_summary,
)
from vitplasticity.recommend.settings import (
    RANKING_DTYPES,
    REFERENCE_FALLBACKS,
    RecommendImageSettings,
    RecommendTextSettings,
)
from vitplasticity.settings.declaration import (
    add_settings_arguments,
    json_argument,
    settings_from_args,
)
from vitplasticity.settings.tracking import add_tracking_arguments, tracking_from_args

if TYPE_CHECKING:
    from vitplasticity.models.spec import ModelSpec
    from vitplasticity.recommend.pipeline import RecommendInputs, Result
    from vitplasticity.recommend.text_inputs import TextResult
    from vitplasticity.utils.tracking import TrackingOptions

log = logging.getLogger(__name__)

OUTPUTS: tuple[str, ...] = (".md", ".json", ".parquet", ".png", ".pdf")
"""What ``recommend`` writes after its --out-prefix, for an image or a text model."""
_SHOWN = 5
"""How many of the files that are not images an error names."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``recommend`` subcommand: images (--dataset-dir, --image-folder) or text
    (--text)."""
    parser = subparsers.add_parser(
        "recommend",
        help="which components to finetune: plasticity and alternative criteria, ranked",
        description="Rank ln1, mha, ln2, fc1, fc2 (and '+' combinations) of a vision "
        "transformer (of a family vitplasticity knows) for finetuning on a dataset: measured "
        "plasticity (mean, 95%% CI), relative gradient norm and gradient SNR after a head "
        "warm-up, a data-free weight statistic, PLoP's normalised feature norm (NFN, lowest "
        "first), Spectrum's SNR and KappaTune's condition number (lowest first); recommend the "
        "best configuration by --criterion under a trainable-parameter budget. A heuristic (the "
        "report names the criterion's source; the default, plasticity, rests on the paper's "
        "finding: higher plasticity, better finetuning), not a finetuning result. With "
        "--text, a causal language model (GPT2, Llama, Mistral, Qwen2/3, Gemma 1/2/3, Phi3, "
        "GPT-NeoX, Falcon, OLMo2; a bare model wrapped in its causal-LM class, head tied to the "
        "embedding) on your text files against a --reference text: plasticity between "
        "reference sequence i and user sequence i, the gradients of the next-token loss on the "
        "user's sequences (no head warm-up: the LM head is pretrained), NFN and the weight "
        "statistic where defined.",
    )
    add_model_arguments(parser)
    data = parser.add_argument_group(
        "dataset (one of --dataset-dir, --image-folder, --text, --labelled-text)"
    )
    data.add_argument("--dataset-dir", help="a prepared dataset folder (vitplasticity prepare)")
    data.add_argument(
        "--image-folder",
        help="an ImageFolder tree root/<class>/<image> (or root/{train,test}/<class>/...); "
        "prepared into a temporary folder",
    )
    data.add_argument("--text", nargs="+", metavar="FILE", help="a text model's: your text file(s)")
    data.add_argument(
        "--labelled-text",
        metavar="PATH",
        help="a text model's: your labelled text (a .csv or .jsonl with text and label "
        "columns, or class folders of .txt files); ranked as a sequence classifier with a new "
        "head, warmed up as an image model's (--warmup-steps, --warmup-lr)",
    )
    data.add_argument(
        "--dataset",
        help="dataset name in the outputs (default: the folder name, or the first file's stem)",
    )
    reference = parser.add_argument_group("reference set (one of)")
    reference.add_argument(
        "--reference",
        help="reference set Parquet (vitplasticity reference; paper: ImageNet); with --text, "
        "the reference text file",
    )
    reference.add_argument(
        "--reference-fallback",
        choices=tuple(REFERENCE_FALLBACKS),
        help="without ImageNet: pool (the dataset's own pool images) | synthetic (generated); "
        "outputs say so",
    )
    # The measuring and ranking flags, their types, choices and defaults from
    # RecommendImageSettings, and how text is cut from RecommendTextSettings (the config key
    # each mirrors in its help).
    add_settings_arguments(parser, RecommendImageSettings)
    text = add_text_settings(parser, RecommendImageSettings, RecommendTextSettings)
    text.add_argument(
        "--protocol",
        choices=["embedding", "in_situ"],
        default="embedding",
        help="plasticity protocol (embedding: the paper's; an image model's is embedding)",
    )
    add_dtype_argument(parser)
    parser.add_argument(
        "--out-prefix",
        required=True,
        help="writes PREFIX.md, .json, .parquet, .png and .pdf",
    )
    add_tracking_arguments(parser)
    parser.set_defaults(handler=run_recommend)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The image recommend's model: a models entry (``--model-spec``), or a timm id with its
    options, and the name the outputs give it."""
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


def add_dtype_argument(parser: argparse.ArgumentParser) -> None:
    """``--dtype``, which both recommends take and the workflow leaves at its default."""
    parser.add_argument("--dtype", choices=RANKING_DTYPES, default="float32", help="compute dtype")


def recommend_arguments(
    args: argparse.Namespace,
) -> tuple[RecommendInputs, RecommendImageSettings, str]:
    """The stage's inputs, its settings (checked: the budget a number) and the dataset folder
    (or image folder) the flags name.

    Raises:
        ValueError: naming the flag of a missing, contradictory or bad value.
        FileNotFoundError: for a dataset folder that does not exist.
    """
    from vitplasticity.models.spec import TimmSpec
    from vitplasticity.recommend.pipeline import RecommendInputs, checked_settings

    text_only = own_defaults(RecommendTextSettings, RecommendImageSettings)
    refuse_given(args, {**text_only, "protocol": "embedding"}, "--text")
    for flag, sources in (
        ("--model-spec / --timm-id", (args.model_spec, args.timm_id)),
        (
            "--dataset-dir / --image-folder (or, for a text model, --text)",
            (args.dataset_dir, args.image_folder),
        ),
        ("--reference / --reference-fallback", (args.reference, args.reference_fallback)),
    ):
        given = sum(source is not None for source in sources)
        if given != 1:
            raise ValueError(f"{flag}: give exactly one ({given} given)")
    if args.model_spec is not None:
        spec = _model_spec(args.model_spec)
    else:
        spec = TimmSpec(
            timm_id=args.timm_id,
            weights=args.weights,
            normalize=args.normalize,
            kwargs=dict(args.model_kwargs),
        )
    source = dataset_source(args)
    check_out_prefix(args.out_prefix, OUTPUTS)
    inputs = RecommendInputs(
        model=args.model or spec.model_id,
        dataset=args.dataset or Path(source).resolve().name,
        model_spec=spec,
        reference=args.reference,
        reference_fallback=args.reference_fallback,
        dtype=args.dtype,
    )
    # Checked before an image folder is prepared (the stage's own check then passes).
    settings = checked_settings(inputs, settings_from_args(RecommendImageSettings, args))
    return inputs, settings, str(source)


def _model_spec(entry: Any) -> ModelSpec:
    """The ``--model-spec`` entry parsed.

    Raises:
        ValueError: naming --model-spec and what its family refuses.
    """
    from vitplasticity.models.spec import ModelSpec

    try:
        return ModelSpec.from_config(entry)
    except (TypeError, ValueError) as error:
        raise ValueError(f"--model-spec: {error}") from None


def dataset_source(args: argparse.Namespace) -> str:
    """The --dataset-dir or --image-folder the flags name, checked to be a folder (an image
    folder: of images only, :func:`check_image_files`).

    Raises:
        FileNotFoundError: for a folder that does not exist.
        ValueError: for an image folder holding files that are not images.
    """
    source = args.dataset_dir if args.dataset_dir is not None else args.image_folder
    if not Path(source).is_dir():
        flag = "--dataset-dir" if args.dataset_dir is not None else "--image-folder"
        raise FileNotFoundError(f"{flag}: folder not found: {source}")
    if args.image_folder is not None:
        check_image_files(Path(source))
    return source


def check_image_files(root: Path) -> None:
    """Raise unless every file under the --image-folder ``root`` is an image (by its suffix,
    as the preparer reads them): a file skipped without a word would leave the
    recommendation to the images that remain. Hidden files (``.DS_Store``) are the system's,
    not the user's, and are passed over.

    Raises:
        ValueError: naming the folder, how many files are not images, and the first few.
    """
    from vitplasticity.data.imagefolder import IMAGE_SUFFIXES

    others = sorted(
        str(path.relative_to(root))
        for path in root.rglob("*")
        if path.is_file()
        and path.suffix.lower() not in IMAGE_SUFFIXES
        and not any(part.startswith(".") for part in path.relative_to(root).parts)
    )
    if others:
        shown = ", ".join(others[:_SHOWN]) + (", ..." if len(others) > _SHOWN else "")
        raise ValueError(
            f"--image-folder {root}: {len(others)} file(s) are not images "
            f"({' '.join(sorted(IMAGE_SUFFIXES))}): {shown}; remove them, or give a folder of "
            "images only"
        )


def run_recommend(args: argparse.Namespace) -> int:
    """Rank (:func:`vitplasticity.recommend.pipeline.recommend`) and write the outputs, on a
    prepared dataset or an image folder prepared into a temporary folder."""
    from vitplasticity.recommend.pipeline import recommend, write_outputs

    if args.text is not None or args.labelled_text is not None:
        return _run_recommend_text(args)
    inputs, settings, source = recommend_arguments(args)
    tracking_options = tracking_from_args(args)
    if args.image_folder is None:
        result = recommend(inputs, settings, source)
    else:
        from vitplasticity.data.imagefolder import prepare_image_folder

        with tempfile.TemporaryDirectory(prefix="vitplasticity-recommend-") as tmp:
            prepared = Path(tmp) / inputs.dataset
            counts = prepare_image_folder(source, prepared, inputs.dataset)
            log.info("image folder %s read: %s", source, counts)
            result = recommend(inputs, settings, prepared)
    write_outputs(result, args.out_prefix)
    track_recommendation(tracking_options, "recommend", result)
    return 0


def track_recommendation(
    tracking_options: TrackingOptions, job_type: str, result: Result | TextResult
) -> None:
    """Send a recommendation to its tracker run: the decision (``recommendation.*``) and
    each criterion's numbers per configuration (``<configuration>/<criterion>/<column>``)."""
    summary = {f"recommendation.{k}": v for k, v in result.record["recommendation"].items()}
    for row in result.table.iter_rows(named=True):
        for column, value in row.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                summary[f"{row['configuration']}/{row['criterion']}/{column}"] = value
    model, dataset = result.inputs.model, result.inputs.dataset
    config = {"model": model, "dataset": dataset, **result.record["provenance"]}
    track_summary(tracking_options, job_type, f"{model}/{dataset}", config, summary)


# -- recommend --text --------------------------------------------------------------------------


def _run_recommend_text(args: argparse.Namespace) -> int:
    """Rank a text model (:func:`vitplasticity.recommend.text.recommend_text`) and write the
    outputs.

    Raises:
        ValueError: for an image flag given with --text, or a missing --model-spec or
            --reference.
    """
    from vitplasticity.recommend.pipeline import write_outputs
    from vitplasticity.recommend.text import TextRecommendInputs, recommend_text

    image_only = own_defaults(RecommendImageSettings, RecommendTextSettings)
    labelled = args.labelled_text is not None
    # A new classification head is warmed up as an image model's: its two flags go with
    # labelled text too.
    warmup = {
        "warmup_steps": image_only.pop("warmup_steps"),
        "warmup_lr": image_only.pop("warmup_lr"),
    }
    image_only |= dict.fromkeys(("dataset_dir", "image_folder", "reference_fallback", "timm_id"))
    refuse_given(args, image_only, "an image dataset (--dataset-dir, --image-folder)")
    if not labelled:
        refuse_given(args, warmup, "an image dataset or --labelled-text (a new head's warm-up)")
    if labelled and args.text is not None:
        raise ValueError("recommend: give --text or --labelled-text, not both")
    for flag, value in (("--model-spec", args.model_spec), ("--reference", args.reference)):
        if value is None:
            raise ValueError(f"recommend --text: {flag} required (a text model's)")
    check_out_prefix(args.out_prefix, OUTPUTS)
    data = args.labelled_text if labelled else args.text[0]
    inputs = TextRecommendInputs(
        model=args.model or _model_spec(args.model_spec).model_id,
        dataset=args.dataset or Path(data).stem,
        model_spec=args.model_spec,
        reference=args.reference,
        texts=() if labelled else tuple(args.text),
        protocol=args.protocol,
        dtype=args.dtype,
        labelled_text=args.labelled_text,
        warmup_steps=args.warmup_steps,
        warmup_lr=args.warmup_lr,
    )
    settings = settings_from_args(RecommendTextSettings, args)
    tracking_options = tracking_from_args(args)
    result = recommend_text(inputs, settings)
    write_outputs(result, args.out_prefix)
    track_recommendation(tracking_options, "recommend_text", result)
    return 0
