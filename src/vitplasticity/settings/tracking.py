"""The ``tracking:`` block: where the finetune, plasticity and recommend jobs also send their
curves and summaries (W&B, MLflow; off by default: :mod:`vitplasticity.utils.tracking`).

Declared like every stage's settings (a field per key: its flag, its check), but never a
rule's ``params:``: tracking changes no result, so editing it must rerun no job. The
Snakefile puts the block into the environment variable :data:`TRACKING_VARIABLE` (every job
inherits it, and a cluster node re-parses the Snakefile, setting it again), and each command
reads it there; a flag given on the command line wins over it. Neither enters a run's
fingerprint nor its summary. Torch-free: the Snakefile imports it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vitplasticity.settings.declaration import (
    add_settings_arguments,
    check_settings,
    setting,
    setting_fields,
)

__all__ = [
    "TRACKING_VARIABLE",
    "TrackingSettings",
    "add_tracking_arguments",
    "tracking_environment",
    "tracking_from_args",
]

TRACKING_VARIABLE = "VITPLASTICITY_TRACKING"
"""The environment variable holding the ``tracking:`` block as JSON (the Snakefile sets it)."""


@dataclass(frozen=True, kw_only=True)
class TrackingSettings:
    """Where a job's tracker runs go; the default sends nothing anywhere."""

    tracking_backend: tuple[str, ...] = setting(
        ("none",),
        help="none | wandb | mlflow, or both (wandb mlflow): where curves and summaries also go",
        key="tracking.backend",
        choices=("none", "wandb", "mlflow"),
    )
    tracking_project: str = setting(
        "vitplasticity",
        help="the W&B project and the MLflow experiment",
        key="tracking.project",
    )
    tracking_wandb_mode: str = setting(
        "online",
        help="online | offline (a node without internet; `wandb sync` uploads later)",
        key="tracking.wandb_mode",
        choices=("online", "offline"),
    )
    tracking_mlflow_tracking_uri: str | None = setting(
        None,
        help="an MLflow server URL or URI, or a folder (a file store); none: MLFLOW_TRACKING_URI, "
        "else ./mlruns",
        key="tracking.mlflow_tracking_uri",
    )

    @classmethod
    def from_config(cls, block: Mapping[str, Any]) -> TrackingSettings:
        """The settings of a ``tracking:`` block (config keys; a missing key: its default;
        ``backend`` a name or a list of names).

        Raises:
            ValueError: naming the key of a bad value.
        """
        values = {}
        for field, declared, _ in setting_fields(cls):
            key = declared.key.removeprefix("tracking.")
            if key in block:
                values[field.name] = block[key]
        backend = values.get("tracking_backend", ("none",))
        values["tracking_backend"] = (backend,) if isinstance(backend, str) else tuple(backend)
        unknown = set(block) - {d.key.removeprefix("tracking.") for _, d, _ in setting_fields(cls)}
        if unknown:
            raise ValueError(f"tracking: unknown keys {sorted(unknown)}")
        return check_settings(cls(**values))

    # The names utils.tracking reads (its TrackingOptions).
    @property
    def backend(self) -> tuple[str, ...]:
        return self.tracking_backend

    @property
    def project(self) -> str:
        return self.tracking_project

    @property
    def wandb_mode(self) -> str:
        return self.tracking_wandb_mode

    @property
    def mlflow_tracking_uri(self) -> str | None:
        return self.tracking_mlflow_tracking_uri


def tracking_environment(block: Mapping[str, Any]) -> str:
    """The value of :data:`TRACKING_VARIABLE` for a config's ``tracking:`` block (checked).

    Raises:
        ValueError: naming the key of a bad value.
    """
    TrackingSettings.from_config(block)
    return json.dumps(dict(block), sort_keys=True)


def add_tracking_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``--tracking-*`` flags (unset: the value of :data:`TRACKING_VARIABLE`, else the
    default)."""
    group = parser.add_argument_group(
        "tracking (no effect on the results; default: the environment's "
        f"{TRACKING_VARIABLE}, else none)"
    )
    add_settings_arguments(group, TrackingSettings)
    # None marks a flag not given, so that the environment's value is taken instead.
    parser.set_defaults(**{field.name: None for field in dataclasses.fields(TrackingSettings)})


def tracking_from_args(args: argparse.Namespace) -> TrackingSettings:
    """The tracking settings of a command: each flag given, else the environment's value
    (:data:`TRACKING_VARIABLE`), else the default.

    Raises:
        ValueError: naming the flag or the variable and key of a bad value.
    """
    text = os.environ.get(TRACKING_VARIABLE, "")
    try:
        block = json.loads(text) if text.strip() else {}
        from_environment = TrackingSettings.from_config(block)
    except (ValueError, TypeError, AttributeError) as error:
        raise ValueError(f"{TRACKING_VARIABLE}: {error} (got {text[:200]!r})") from None
    given = {
        field.name: tuple(value) if isinstance(value, list) else value
        for field in dataclasses.fields(TrackingSettings)
        for value in (getattr(args, field.name, None),)
        if value is not None
    }
    return check_settings(dataclasses.replace(from_environment, **given))
