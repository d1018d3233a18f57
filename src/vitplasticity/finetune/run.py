"""Which run a finetuning run is (:class:`Run`: experiment, model, dataset, configuration,
learning rate, seed) and the folder that names it, with its learning rate as a path label
(:func:`lr_label`).

Plain Python (no torch): the workflow expands each experiment's grid into these runs when
the Snakefile is parsed, on every node; the finetuning stage trains them.
"""

from __future__ import annotations

from dataclasses import dataclass


def lr_label(lr: float) -> str:
    """The learning rate as it appears in paths: ``f"{lr:g}"`` (0.001, 3e-05)."""
    return f"{float(lr):g}"


@dataclass(frozen=True)
class Run:
    """One single-component finetuning run of an experiment."""

    experiment: str
    model: str
    dataset: str
    configuration: str
    lr: float
    seed: int

    @property
    def directory(self) -> str:
        """The run's directory below ``<results>/finetune/``."""
        return (
            f"{self.experiment}/{self.model}/{self.dataset}/{self.configuration}/"
            f"lr{lr_label(self.lr)}_seed{self.seed}"
        )
