"""vitplasticity: which components of a vision transformer to finetune, and why.

Reproduces "Vision Transformer Finetuning Benefits from Non-Smooth Components"
(Odonnat, Chapel, Tavenard, Redko; arXiv 2602.06883): plasticity of every component of every
block, single-component finetuning, and the statistics that rank them.
"""

__version__ = "0.1.0"

COMPONENTS: tuple[str, ...] = ("ln1", "mha", "ln2", "fc1", "fc2")
"""The five per-block components, in forward order."""

FC1_MODES: tuple[str, ...] = ("stage", "up")
"""What FC1 of a gated MLP is in a plasticity measurement: ``stage``, the MLP's first linear
stage (gate and up projections together, their outputs concatenated; the default); ``up``, the
up projection alone (the reference code's DINOv3 ablation). A plain MLP has one fc1 either way
(docs/protocol.md, "Architectures")."""


def __getattr__(name: str) -> object:
    """``vitplasticity.select`` (:func:`vitplasticity.selection.select`), imported on first
    use: ``import vitplasticity`` loads no torch."""
    if name == "select":
        from vitplasticity.selection import select

        return select
    raise AttributeError(f"module 'vitplasticity' has no attribute {name!r}")
