"""Opt-in experiment tracking: a job's curves and summary sent to Weights & Biases and/or
MLflow besides the files it always writes (timm's convention: its own files always, a
tracker only when asked).

One small interface, :class:`Tracker`: ``log_row`` (a metrics row, at its ``step``),
``log_summary`` (what the job's summary file says), ``run_ids`` (what a checkpoint keeps so
that a resumed run continues its tracker runs), ``finish``. :func:`tracking` opens one for a
job; with no backend it is :class:`Tracker` itself, which does nothing.

A tracker never fails or changes a job: every call into wandb or mlflow is guarded, and the
first error of a backend (package missing, no network, bad key, server down) is logged once
as one warning line naming the backend and why; that backend is then off for the rest of the
process (a packed job's next runs skip it rather than wait on the same dead server again).
Both packages are imported only here, only when a backend is asked for.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)

BACKENDS = ("wandb", "mlflow")
"""The trackers a job can log to (``none``: no tracker)."""

INSTALL_HINT = "pip install 'vitplasticity[tracking]'"

MLFLOW_PARAM_LENGTH = 6000
"""MLflow's longest param value (MAX_PARAM_VAL_LENGTH): longer config values are cut."""


class TrackingOptions(Protocol):
    """Where a job's tracker runs go (:class:`vitplasticity.settings.tracking.TrackingSettings`)."""

    backend: tuple[str, ...]
    project: str
    wandb_mode: str
    mlflow_tracking_uri: str | None


@dataclass(frozen=True)
class TrackedJob:
    """Who a tracker run is: its name (the job's results path), the group of runs it is
    compared within, its kind (``finetune``, ``plasticity``, ``recommend``...) and the
    settings it ran with (logged as the run's config)."""

    name: str
    group: str
    job_type: str
    config: Mapping[str, Any] = field(default_factory=dict)


class Tracker:
    """No tracker: every call does nothing (the default)."""

    def log_row(self, row: Mapping[str, Any]) -> None:
        """Log a metrics row's numbers at its ``step`` (its other values left out)."""

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        """Log the job's summary (what its summary file holds)."""

    def run_ids(self) -> dict[str, str]:
        """The tracker runs' ids by backend, for a checkpoint to keep."""
        return {}

    def finish(self, failed: bool = False) -> None:
        """Close the tracker runs (marked failed when the job stopped on an error)."""


NO_TRACKER = Tracker()

_switched_off: dict[tuple[str, str], str] = {}
"""Backends switched off in this process, by (backend, where it logs to), with why: warned
once, never tried again (another MLflow server, or W&B in another mode, is tried)."""


def row_metrics(row: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a metrics row, by column, without ``step`` and the unset columns."""
    return {
        name: float(value)
        for name, value in row.items()
        if name != "step"
        and isinstance(value, int | float)
        and not isinstance(value, bool)
        and value is not None
    }


def flat_items(values: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(a.b.c, value)`` for every leaf of a nested mapping."""
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from flat_items(value, f"{name}.")
        else:
            yield name, value


class _Backend:
    """One tracker run; subclasses call their package. Every method may raise: :class:`_Guarded`
    catches."""

    name = ""
    resumed = False
    where = ""  # where it logs to: the key of _switched_off

    def log_row(self, step: int, metrics: dict[str, float]) -> None:
        raise NotImplementedError

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def last_step(self) -> int:
        """The last step the (resumed) run already holds; 0 for a new run."""
        return 0

    def run_id(self) -> str:
        raise NotImplementedError

    def finish(self, failed: bool) -> None:
        raise NotImplementedError


class _WandbRun(_Backend):
    name = "wandb"

    def __init__(self, options: TrackingOptions, job: TrackedJob, resume_id: str | None) -> None:
        self.where = options.wandb_mode
        import wandb

        # Its INFO lines (threads, atexit) would fill the job's log.
        logging.getLogger("wandb").setLevel(logging.WARNING)
        # Console capture off: the job's log already has every line the run prints.
        self.run = wandb.init(
            project=options.project,
            name=job.name,
            group=job.group,
            job_type=job.job_type,
            config=dict(job.config),
            mode=options.wandb_mode,
            id=resume_id,
            resume="allow" if resume_id else None,
            reinit="finish_previous",
            # Read at every run: wandb's own reading is once per process.
            dir=os.environ.get("WANDB_DIR"),
            settings=wandb.Settings(console="off", silent=True),
        )
        self.resumed = resume_id is not None
        self.last_logged: int | None = None

    def log_row(self, step: int, metrics: dict[str, float]) -> None:
        # A step's row is committed when a later step arrives: its train and validation rows
        # become one history row.
        self.run.log(metrics, step=step)
        self.last_logged = step

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        # The last row committed first: committed after, its values would overwrite the
        # summary's (test_accuracy at the last step instead of the selected one).
        if self.last_logged is not None:
            self.run.log({}, step=self.last_logged, commit=True)
        self.run.summary.update(dict(summary))

    def last_step(self) -> int:
        # An online run resumed from the server starts at the step after its last (run.step);
        # an offline one knows no step of the server's (0): its rows are all sent.
        return max(int(self.run.step) - 1, 0) if self.resumed else 0

    def run_id(self) -> str:
        return str(self.run.id)

    def finish(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


class _MlflowRun(_Backend):
    name = "mlflow"

    def __init__(self, options: TrackingOptions, job: TrackedJob, resume_id: str | None) -> None:
        uri = self.where = mlflow_uri(options.mlflow_tracking_uri)
        if uri.startswith("file:"):
            # A folder is MLflow's file store, which MLflow 3 keeps only when asked for.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        self.resumed = resume_id is not None
        if resume_id is not None:
            self.run_id_ = resume_id
            self.client.update_run(resume_id, status="RUNNING")
            return
        tags = {"job_type": job.job_type, "group": job.group}
        run = self.client.create_run(
            self._experiment_id(options.project), run_name=job.name, tags=tags
        )
        self.run_id_ = run.info.run_id
        params = [
            Param(mlflow_name(key), str(value)[:MLFLOW_PARAM_LENGTH])
            for key, value in flat_items(job.config)
        ]
        for start in range(0, len(params), 100):  # MLflow takes 100 params per batch
            self.client.log_batch(self.run_id_, params=params[start : start + 100])

    def _experiment_id(self, project: str) -> str:
        experiment = self.client.get_experiment_by_name(project)
        if experiment is not None:
            return experiment.experiment_id
        try:
            return self.client.create_experiment(project)
        except Exception:  # a parallel job created it first
            return self.client.get_experiment_by_name(project).experiment_id

    def log_row(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        batch = [Metric(mlflow_name(name), value, stamp, step) for name, value in metrics.items()]
        # Synchronous: an error reaches the guard (one warning); a logged row is one request
        # per log_every steps.
        self.client.log_batch(self.run_id_, metrics=batch)

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        # Prefixed: a summary's lr or test_accuracy is not one more point of the curve.
        numbers = [
            Metric(mlflow_name(f"summary/{key}"), float(value), stamp, 0)
            for key, value in flat_items(summary)
            if isinstance(value, int | float) and not isinstance(value, bool)
            if math.isfinite(value)
        ]
        self.client.log_batch(self.run_id_, metrics=numbers)
        self.client.log_text(self.run_id_, json.dumps(dict(summary), indent=2), "summary.json")

    def last_step(self) -> int:
        if not self.resumed:
            return 0
        run = self.client.get_run(self.run_id_)
        steps = [
            point.step
            for key in run.data.metrics
            if not key.startswith("summary/")
            for point in self.client.get_metric_history(self.run_id_, key)
        ]
        return max(steps, default=0)

    def run_id(self) -> str:
        return self.run_id_

    def finish(self, failed: bool) -> None:
        self.client.set_terminated(self.run_id_, status="FAILED" if failed else "FINISHED")


def mlflow_name(name: str) -> str:
    """``name`` as MLflow takes a metric or param name: characters besides alphanumerics,
    ``_ - . : /`` and spaces as ``_`` (a configuration ``mha+fc1`` as ``mha_fc1``)."""
    return re.sub(r"[^\w\-. :/]", "_", name)


def mlflow_uri(uri: str | None) -> str:
    """An MLflow tracking URI: a folder (absolute or relative) as its ``file:`` URI, a URI
    (``http://``, ``file:``, ``sqlite:``...) as it is; None: MLflow's own default
    (``MLFLOW_TRACKING_URI``, else ./mlruns)."""
    if uri is None:
        return os.environ.get("MLFLOW_TRACKING_URI", "file:" + os.path.abspath("mlruns"))
    if "://" in uri or uri.startswith(("file:", "databricks")):
        return uri
    return "file:" + os.path.abspath(uri)


_BACKEND_CLASSES: dict[str, type[_Backend]] = {"wandb": _WandbRun, "mlflow": _MlflowRun}


def _where(name: str, options: TrackingOptions) -> str:
    """Where backend ``name`` logs to under ``options`` (W&B's mode, MLflow's URI)."""
    return options.wandb_mode if name == "wandb" else mlflow_uri(options.mlflow_tracking_uri)


def _switch_off(name: str, where: str, error: BaseException) -> None:
    """Warn once that backend ``name`` (logging to ``where``) is off for this process, and
    why."""
    if (name, where) in _switched_off:
        return
    why = f"{type(error).__name__}: {error}".splitlines()[0][:300]
    if isinstance(error, ImportError):
        why = f"{why} ({INSTALL_HINT})"
    _switched_off[name, where] = why
    log.warning(
        "tracking: %s (%s) is off for this process (%s); the run goes on without it",
        name,
        where,
        why,
    )


class _Guarded(Tracker):
    """The backends that opened, each call guarded (:func:`_switch_off` on an error)."""

    def __init__(self, backends: Sequence[_Backend]) -> None:
        self.backends = list(backends)
        # A resumed run's rows after its checkpoint were logged by the process before:
        # they are computed again, bit for bit, and not sent twice.
        self.skip_through: dict[str, int] = {}
        for backend in list(self.backends):
            self.skip_through[backend.name] = self._call(backend, backend.last_step) or 0

    def _call(self, backend: _Backend, method: Any, *args: Any) -> Any:
        if (backend.name, backend.where) in _switched_off:
            return None
        try:
            return method(*args)
        except Exception as error:  # a tracker never fails the job
            _switch_off(backend.name, backend.where, error)
            return None

    def log_row(self, row: Mapping[str, Any]) -> None:
        step, metrics = int(row["step"]), row_metrics(row)
        for backend in self.backends:
            if step > self.skip_through[backend.name]:
                self._call(backend, backend.log_row, step, metrics)

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        for backend in self.backends:
            self._call(backend, backend.log_summary, summary)

    def run_ids(self) -> dict[str, str]:
        ids = {backend.name: self._call(backend, backend.run_id) for backend in self.backends}
        return {name: run_id for name, run_id in ids.items() if run_id is not None}

    def finish(self, failed: bool = False) -> None:
        for backend in self.backends:
            self._call(backend, backend.finish, failed)


def open_tracker(
    options: TrackingOptions | None, job: TrackedJob, resume_ids: Mapping[str, str] | None = None
) -> Tracker:
    """The tracker of ``job``: one run per backend of ``options`` (none: :data:`NO_TRACKER`).

    Args:
        options: the tracking settings; None or no backend: no tracker.
        job: the run's name, group, kind and config.
        resume_ids: the ids of the tracker runs a resumed job continues, by backend
            (:meth:`Tracker.run_ids` of the process before, kept in its checkpoint).

    Returns:
        A tracker whose every call is safe: a backend that fails to open or to log is warned
        about once and left out.
    """
    names = [name for name in (options.backend if options else ()) if name != "none"]
    if not names:
        return NO_TRACKER
    opened = []
    for name in names:
        where = _where(name, options)
        if (name, where) in _switched_off:
            continue
        resume_id = (resume_ids or {}).get(name)
        try:
            opened.append(_BACKEND_CLASSES[name](options, job, resume_id))
        except Exception as error:  # ImportError included: a tracker never fails the job
            _switch_off(name, where, error)
    return _Guarded(opened) if opened else NO_TRACKER


@contextmanager
def tracking(
    options: TrackingOptions | None, job: TrackedJob, resume_ids: Mapping[str, str] | None = None
) -> Iterator[Tracker]:
    """:func:`open_tracker` for the block; its runs finished when it ends (marked failed when
    it ends on an error, which goes on unchanged)."""
    tracker = open_tracker(options, job, resume_ids)
    try:
        yield tracker
    except BaseException:
        tracker.finish(failed=True)
        raise
    tracker.finish()
