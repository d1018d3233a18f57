"""The plasticity stage on text: every component's plasticity of a transformers text model
(GPT2, Llama, Mistral, Qwen2/3, Gemma 1/2/3, Phi3, GPT-NeoX, Falcon, OLMo2, Mixtral, Qwen2-MoE)
between pairs of token sequences cut from text files.

The text counterpart of :func:`vitplasticity.plasticity.images.measure_dataset`: pair i is reference
sequence i with downstream sequence i (cycled), both cut from text files
(:mod:`vitplasticity.data.text`); the tables have the image plasticity's schema. The model is
a ``models:`` entry (``family: transformers``) built by :mod:`vitplasticity.models.build`; in the
workflow its weights (and tokenizer) are the weights stage's folder, loaded offline. Torch and
transformers are imported when a measurement starts, so that the CLI's ``--help`` stays fast.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from vitplasticity.models.spec import HFModelSpec
    from vitplasticity.plasticity.settings import TextPlasticitySettings
    from vitplasticity.plasticity.summary import Measurement

from vitplasticity.models.text import check_sequence_length, tokenizer_name

log = logging.getLogger(__name__)


def check_text_model(model_name: str, model: Any) -> None:
    """Raise unless ``model``'s architecture takes token ids (a vision tower takes images).

    Raises:
        UnsupportedModel: no architecture knows the model (naming its class).
        ValueError: naming the model and its class when it takes images.
    """
    from vitplasticity.models.architectures import architecture_for

    architecture = architecture_for(model)
    if architecture.inputs != "tokens":
        raise ValueError(
            f"model {model_name!r} ({type(model).__name__}, {architecture.name}) takes "
            f"{architecture.inputs}, not token ids: measure it with plasticity.models, not "
            "text_plasticity.run_models"
        )


def checked_text_spec(
    model_name: str, model_spec: dict[str, Any], files: dict[str, str | Path]
) -> HFModelSpec:
    """The model's spec, after checking it and that each of ``files`` (flag -> path) is a
    file: before any model is built.

    Raises:
        ValueError: for a spec :func:`~vitplasticity.models.text.text_model_spec` refuses.
        FileNotFoundError: naming the flag of a missing text file.
    """
    from vitplasticity.models.text import text_model_spec

    spec = text_model_spec(model_name, model_spec)
    for flag, path in files.items():
        if not Path(path).is_file():
            raise FileNotFoundError(f"{flag}: text file not found: {path}")
    return spec


def text_model(model_name: str, spec: HFModelSpec, sequence_length: int) -> Any:
    """The model of ``spec`` (on the CPU, in float32), checked to take token ids and
    sequences of ``sequence_length`` tokens (:func:`check_text_measurable`).

    Raises:
        ValueError: for a model that takes images or has fewer positions than
            ``sequence_length``.
    """
    from vitplasticity.models.build import build_model

    # A random init depends on init_seed alone: every job of the model measures the same weights.
    model = build_model(spec)
    check_text_measurable(model_name, model, sequence_length)
    return model


def check_text_measurable(model_name: str, model: Any, sequence_length: int) -> None:
    """Raise unless ``model`` (built, or a streamed skeleton) takes token ids and sequences
    of ``sequence_length`` tokens.

    Raises:
        ValueError: for a model that takes images or has fewer positions than
            ``sequence_length``.
    """
    check_text_model(model_name, model)
    check_sequence_length(model.config, sequence_length, model_name)


def _read_pair_sequences(
    reference: str | Path,
    text: str | Path,
    tokenizer: str,
    config: Any,
    settings: TextPlasticitySettings,
) -> tuple[np.ndarray, np.ndarray]:
    """Up to ``n_pairs`` sequences of ``sequence_length`` tokens from each file, cut by
    ``tokenizer`` for a model of ``config`` (its vocabulary): (reference, downstream).

    Raises:
        ValueError: when the reference file gives fewer than ``n_pairs`` sequences.
    """
    from vitplasticity.data.text import load_tokenizer, read_sequences

    tokenize = load_tokenizer(tokenizer, config.vocab_size)
    n, length = settings.n_pairs, settings.sequence_length
    references = read_sequences(reference, tokenize, length, max_sequences=n)
    if len(references) < n:
        raise ValueError(
            f"{reference}: {len(references)} reference sequences of {length} tokens, "
            f"fewer than --n-pairs {n}"
        )
    return references, read_sequences(text, tokenize, length, max_sequences=n)


def measure_text(
    model_name: str,
    model_spec: dict[str, Any],
    reference: str | Path,
    text: str | Path,
    settings: TextPlasticitySettings,
    *,
    dataset: str | None = None,
) -> Measurement:
    """The plasticity of text model ``model_name`` (its ``models:`` entry ``model_spec``,
    ``family: transformers``) between a reference and a downstream text file: the
    text plasticity stage. ``dataset`` names the downstream data (default: the file's stem).

    Raises:
        ValueError: for a bad setting (naming its CLI flag and config key), a spec that is
            not a transformers entry (:func:`~vitplasticity.models.text.text_model_spec`), a model that takes images, a
            sequence longer than the model's positions, fewer reference sequences than
            ``n_pairs``, or weights that are not a complete checkpoint of the model
            (:func:`~vitplasticity.models.build.build_model`).
        FileNotFoundError: for a missing text file, or a weights folder without config.json.
    """
    import torch

    from vitplasticity.models.build import build_model, pick_device
    from vitplasticity.plasticity.measured_model import measured_model
    from vitplasticity.plasticity.summary import measurement
    from vitplasticity.settings.declaration import check_settings, recorded_settings

    # Every setting and file is checked before the model runs; a message names the dataset
    # entry whose cut it is.
    settings = check_settings(settings, {"datasets": dataset or Path(text).stem})
    spec = checked_text_spec(
        model_name, model_spec, files={"--reference": reference, "--text": text}
    )
    target = pick_device(settings.device)
    measured = measured_model(
        spec,
        settings.stream,
        target,
        getattr(torch, settings.dtype),
        # A random init depends on init_seed alone: every job measures the same weights.
        lambda: build_model(spec),
    )
    check_text_measurable(model_name, measured.model, settings.sequence_length)
    tokenizer = tokenizer_name(settings.tokenizer, spec)
    sequences = _read_pair_sequences(reference, text, tokenizer, measured.model.config, settings)
    dataset = dataset or Path(text).stem
    label = (model_name, dataset, tokenizer)
    pairs = _measure_pairs(measured, sequences, settings, label, target)
    recorded = {
        "model_spec": model_spec,
        "reference": str(reference),
        "text": str(text),
        **recorded_settings(settings),
        "streamed": measured.streamed is not None,
        "tokenizer": tokenizer,
        "downstream_sequences": len(sequences[1]),
    }
    named = {"model": model_name, "dataset": dataset}
    return measurement(pairs, **named, settings=recorded, device=target, demo=settings.demo)


def _measure_pairs(
    measured: Any,
    sequences: tuple[np.ndarray, np.ndarray],
    settings: TextPlasticitySettings,
    label: tuple[str, str, str],
    device: Any,
) -> Any:
    """The per-pair plasticity of the ``measured`` model (a
    :class:`~vitplasticity.plasticity.streamed.MeasuredModel`, on ``device``) over reference
    sequence i and
    downstream sequence i (cycled; ``sequences``: reference, downstream); ``label`` (model,
    dataset, tokenizer) names them in the log and the progress line."""
    import torch

    from vitplasticity.data.text import cycled
    from vitplasticity.utils.progress import ProgressReporter

    references, downstream = sequences
    model_name, dataset, tokenizer = label
    n = settings.n_pairs
    log.info(
        "%s on %s (%d sequences of %d tokens, cycled to %d; tokenizer %s): protocols %s, %s on %s",
        model_name,
        dataset,
        len(downstream),
        settings.sequence_length,
        n,
        tokenizer,
        ", ".join(settings.protocols),
        settings.dtype,
        device,
    )
    with ProgressReporter(n, f"text plasticity {model_name}/{dataset}") as progress:
        return measured.measure(
            torch.from_numpy(references),
            torch.from_numpy(cycled(downstream, n)),
            protocols=settings.protocols,
            batch_size=settings.batch_size,
            n_pairs=n,
            progress=progress,
        )
