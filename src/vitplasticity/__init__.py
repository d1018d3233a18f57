"""vitplasticity: which components of a vision transformer to finetune, and why.

Reproduces "Vision Transformer Finetuning Benefits from Non-Smooth Components"
(Odonnat, Chapel, Tavenard, Redko; arXiv 2602.06883): plasticity of every component of every
block, single-component finetuning, and the statistics that rank them.
"""

__version__ = "0.1.0"

COMPONENTS: tuple[str, ...] = ("ln1", "mha", "ln2", "fc1", "fc2")
"""The five per-block components, in forward order."""
