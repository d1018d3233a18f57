"""vitplasticity: which components of a vision transformer to finetune, and why.

Reproduces "Vision Transformer Finetuning Benefits from Non-Smooth Components"
(Odonnat, Chapel, Tavenard, Redko; arXiv 2602.06883): plasticity of every component of every
block, single-component finetuning, and the statistics that rank them.
"""

from vitplasticity.version import __version__ as __version__


def __getattr__(name: str) -> object:
    """``vitplasticity.select`` (:func:`vitplasticity.models.selection.select`), imported on first
    use: ``import vitplasticity`` loads no torch."""
    if name == "select":
        from vitplasticity.models.selection import select

        return select
    raise AttributeError(f"module 'vitplasticity' has no attribute {name!r}")
