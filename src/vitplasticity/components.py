"""The names every layer shares: a block's five components and the fc1 modes of a gated MLP
(plain Python, no imports)."""

COMPONENTS: tuple[str, ...] = ("ln1", "mha", "ln2", "fc1", "fc2")
"""The five per-block components, in forward order."""

NORMS: frozenset[str] = frozenset({"ln1", "ln2"})
"""The components that hold no linear map (nor weight matrix): the norms."""

FC1_MODES: tuple[str, ...] = ("stage", "up")
"""What FC1 of a gated MLP is in a plasticity measurement: ``stage``, the MLP's first linear
stage (gate and up projections together, their outputs concatenated; the default); ``up``, the
up projection alone (the reference code's DINOv3 ablation). A plain MLP has one fc1 either way
(docs/protocol.md, "Architectures")."""
