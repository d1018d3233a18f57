"""The names every layer shares: a block's five components, the finetuning configurations made
of them and the fc1 modes of a gated MLP (plain Python, no imports: the report reads
configurations without torch)."""

COMPONENTS: tuple[str, ...] = ("ln1", "mha", "ln2", "fc1", "fc2")
"""The five per-block components, in forward order."""

NORMS: frozenset[str] = frozenset({"ln1", "ln2"})
"""The components that hold no linear map (nor weight matrix): the norms."""

FC1_MODES: tuple[str, ...] = ("stage", "up")
"""What FC1 of a gated MLP is in a plasticity measurement: ``stage``, the MLP's first linear
stage (gate and up projections together, their outputs concatenated; the default); ``up``, the
up projection alone (the reference code's DINOv3 ablation). A plain MLP has one fc1 either way
(docs/protocol.md, "Architectures")."""


CONFIGURATIONS: tuple[str, ...] = ("full", "emb", *COMPONENTS, "head", "lora")
"""Single-component finetuning configurations; "head" is linear probing (head + final norm);
"lora" the LoRA baseline (adapters on the attention linears, see vitplasticity.models.lora)."""


def parse_configuration(configuration: str) -> tuple[str, ...]:
    """Split a configuration ("mha" or a combination "mha+fc1") into its known parts.

    Raises:
        ValueError: if a part is not a known configuration, listing the valid ones.
    """
    parts = tuple(part.strip() for part in configuration.split("+"))
    unknown = [part for part in parts if part not in CONFIGURATIONS]
    if not configuration or unknown:
        raise ValueError(
            f"unknown finetuning configuration {configuration!r}: valid configurations are "
            f"{', '.join(CONFIGURATIONS)} (combine with '+', e.g. 'mha+fc1')"
        )
    return parts
