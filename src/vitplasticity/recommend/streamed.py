"""recommend on a model larger than memory: the criteria a streamed model gives, block by
block from its checkpoint (docs/protocol.md, "Streamed measurement").

The plasticity (:func:`vitplasticity.plasticity.measure.measure` of a
:class:`~vitplasticity.models.streamed.StreamedModel`) and the data-free criteria (the weight
statistic, Spectrum SNR, kappa: one block's matrices at a time) are the whole model's numbers.
The criteria that need a forward and backward pass through the whole model at once, the
gradient criteria and NFN, are n/a for every configuration, with the reason in the report:
the streamed measurement never holds more than one block, and a block-wise backward pass would
read the checkpoint once per gradient batch. A ranking by one of them is refused before any
compute.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from vitplasticity.criteria import REGISTRY
from vitplasticity.models.streamed import StreamedModel
from vitplasticity.plasticity.measure import measure
from vitplasticity.plasticity.pairs import Images
from vitplasticity.recommend.criteria import Measurements, weight_statistics
from vitplasticity.recommend.gradients import TENSOR_SCHEMA
from vitplasticity.recommend.matrix_criteria import matrix_statistics
from vitplasticity.recommend.nfn import NFN_SCHEMA
from vitplasticity.recommend.settings import CRITERIA

WHOLE_MODEL_FIELDS = ("tensors", "features")
"""The :class:`~vitplasticity.recommend.criteria.Measurements` fields measured on the whole
model at once (the gradient criteria's tensors, NFN's linear maps)."""


def whole_model_criteria() -> tuple[str, ...]:
    """The criteria a streamed model leaves n/a, in :data:`CRITERIA` order."""
    return tuple(c for c in CRITERIA if REGISTRY[c].items.measured in WHOLE_MODEL_FIELDS)


def check_streamed_criterion(criterion: str, why: str) -> None:
    """Raise before any compute when the ranking's ``criterion`` is one a streamed model
    leaves n/a (``why``: why the model streams,
    :func:`~vitplasticity.models.stream_decision.stream_decision`'s reason).

    Raises:
        ValueError: naming the criterion, why the model streams and what to do instead.
    """
    left = whole_model_criteria()
    if criterion in left:
        others = ", ".join(c for c in CRITERIA if c not in left)
        raise ValueError(
            f"--criterion {criterion}: the model is streamed block by block from its "
            f"checkpoint ({why}), and {criterion} needs a forward and "
            f"backward pass through the whole model at once; rank by one of {others}, or "
            "measure the whole model (recommend.stream: never) on a machine that holds it"
        )


def streamed_note(why: str) -> str:
    """The report's sentence on the criteria a streamed model leaves n/a, and why (``why``:
    why the model streamed)."""
    labels = [REGISTRY[c].label for c in whole_model_criteria()]
    return (
        f"{', '.join(labels[:-1])} and {labels[-1]} are n/a for every configuration: they need "
        "a forward and backward pass through the whole model at once, and the model was "
        f"streamed block by block from its checkpoint ({why}); recommend.stream: never "
        "measures them where the model fits."
    )


def measure_streamed_criteria(
    streamed: StreamedModel,
    reference: Images,
    downstream: Images,
    *,
    n_pairs: int,
    batch_size: int,
    protocol: str = "embedding",
    progress: Callable[[int], None] | None = None,
) -> Measurements:
    """The criteria of ``streamed``'s five components that one block at a time gives: the
    weight statistic, the plasticity of the pairs (as :func:`.criteria.measure_criteria`
    takes them) and the matrix statistics, each the whole model's numbers; no gradient or
    NFN rows (n/a: :func:`whole_model_criteria`).

    Raises:
        UnsupportedModel: for a model no architecture knows or cannot account for exactly.
        UndefinedStage: for a family that refuses the recommend stage.
    """
    weights = weight_statistics(streamed)
    counts = {"batch_size": batch_size, "n_pairs": n_pairs}
    pairs = measure(streamed, reference, downstream, protocol=protocol, progress=progress, **counts)
    return Measurements.of_components(
        streamed.model,
        pairs=pairs,
        weights=weights,
        features=pl.DataFrame(schema=NFN_SCHEMA),
        gradients=lambda _names: pl.DataFrame(schema=TENSOR_SCHEMA),
        matrices=matrix_statistics(streamed),
    )
