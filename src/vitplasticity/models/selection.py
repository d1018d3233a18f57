"""``vitplasticity.select``: train one configuration in your own training loop.

The module is ``selection`` and the package exposes its function as ``vitplasticity.select``
(lazily, so that ``import vitplasticity`` stays free of torch): a submodule named ``select``
would replace the function on the package as soon as anything imported it.

An optimizer built afterwards from the parameters that require gradients trains the
configuration; timm's ``train.py`` (``create_optimizer_v2``) and the transformers
``Trainer`` build theirs that way, and torch's optimizers skip a parameter without a
gradient in any case. In timm's ``train.py``, add the call after ``create_model``::

    model = create_model(args.model, pretrained=args.pretrained, num_classes=...)
    vitplasticity.select(model, "mha+fc1")

with the transformers ``Trainer``, before building it::

    vitplasticity.select(model, "ln1+ln2")
    trainer = Trainer(model=model, args=training_args, train_dataset=train_dataset)

or in a loop of your own::

    trained = vitplasticity.select(model, "mha+fc1")
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=1e-4
    )
"""

from __future__ import annotations

from torch import nn

from vitplasticity.models.architectures import parameter_map


def select(model: nn.Module, configuration: str, *, train_head: bool = True) -> list[str]:
    """Set ``requires_grad`` so that exactly ``configuration``'s parameters train.

    Every configuration trains the head and final norm too (the classifier, its pooling and
    the norm before it: docs/protocol.md), unless ``train_head`` is False. Every other
    parameter is frozen, whatever it was before. Which parameter is whose comes from the
    model's architecture, by identity (:class:`vitplasticity.models.architectures.ParameterMap`):
    the names are those ``vitplasticity recommend`` writes to its ``.json`` file.

    An optimizer built afterwards from the parameters that require gradients trains the
    configuration (the module docstring shows timm's ``train.py``, the transformers
    ``Trainer`` and a loop of your own).

    Args:
        model: a model of a family vitplasticity knows (modified in place).
        configuration: a component (``ln1``, ``mha``, ``ln2``, ``fc1``, ``fc2``), ``emb``,
            ``head``, ``full``, ``lora`` (after injecting adapters) or a ``+`` combination
            such as ``mha+fc1``.
        train_head: train the head and final norm as every configuration does (default);
            False freezes them too.

    Returns:
        The names of the parameters that train, in ``named_parameters`` order.

    Raises:
        UnsupportedModel: for a model no architecture knows (naming its class and the known
            families), or one with a parameter its architecture cannot account for.
        TypeError: for a ``configuration`` that is not a string (``None``, a number, a list of
            components: join them with ``+``).
        ValueError: for an unknown configuration, ``lora`` on a model without adapters, or a
            configuration that trains nothing once the head is excluded (``head``).
    """
    if not isinstance(configuration, str):
        raise TypeError(
            f"select: configuration must be a string such as 'mha' or 'mha+fc1', got "
            f"{configuration!r} ({type(configuration).__name__}); join several components "
            "with '+'"
        )
    parameters = parameter_map(model)
    trained = parameters.trained_names(configuration)
    if not train_head:
        trained -= {n for n, owner in parameters.owners.items() if owner.trained_by == "head"}
        if not trained:
            raise ValueError(
                f"configuration {configuration!r} with train_head=False trains nothing"
            )
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name in trained)
    return [name for name, _ in model.named_parameters() if name in trained]
