"""``prepare`` and ``reference``: datasets into the prepared store, the reference set."""

from __future__ import annotations

import _frozen_importlib
import _frozen_importlib_external
import argparse
import contextlib
import logging
import signal
from collections.abc import Iterator
from types import FrameType

from vitplasticity.commands import StoppedBySignal
from vitplasticity.settings.declaration import json_argument

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``prepare`` and ``reference`` subcommands."""
    prepare = subparsers.add_parser(
        "prepare",
        help="download (when needed) and prepare one dataset into the Parquet store",
        description="Prepare one dataset: per split a Parquet file of encoded images and "
        "labels, plus meta.json. Downloads are checksum-verified.",
    )
    prepare.add_argument("--dataset", required=True, help="dataset name (config key)")
    prepare.add_argument(
        "--spec", required=True, type=json_argument, help="its config entry, as JSON"
    )
    prepare.add_argument("--downloads", default="resources/downloads", help="download cache folder")
    prepare.add_argument("--out", required=True, help="output folder of the prepared dataset")
    prepare.set_defaults(handler=run_prepare)

    reference = subparsers.add_parser(
        "reference",
        help="build the plasticity reference set (ImageNet val, or a prepared split)",
        description="Select the reference images (paper: the first 12,800 ImageNet-1k val "
        "images sorted by wnid and file name) into one Parquet file.",
    )
    reference.add_argument("--source", choices=["imagenet", "dataset"], required=True)
    reference.add_argument("--imagenet", default="", help="ImageNet val folder or archive")
    reference.add_argument(
        "--dataset-dir", default="", help="with --source dataset: prepared dataset"
    )
    reference.add_argument("--split", default="test", help="with --source dataset: its split")
    reference.add_argument("--n-images", type=int, default=12800)
    reference.add_argument("--selection", choices=["paper", "stratified"], default="paper")
    reference.add_argument("--seed", type=int, default=0, help="seed of the stratified selection")
    reference.add_argument("--out", required=True, help="output Parquet file")
    reference.set_defaults(handler=run_reference)


# How often a SIGTERM that arrived during an import looks again whether the import is over.
SIGTERM_RECHECK_SECONDS = 0.001
# The source files of Python's import machinery, as its frames name them (frozen or not).
IMPORT_MACHINERY = frozenset(
    {
        _frozen_importlib._find_and_load.__code__.co_filename,
        _frozen_importlib_external.SourceFileLoader.get_data.__code__.co_filename,
    }
)


def importing(frame: FrameType | None) -> bool:
    """Whether ``frame`` runs inside an import (its stack passes through importlib)."""
    while frame is not None:
        if frame.f_code.co_filename in IMPORT_MACHINERY:
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM (scancel, a killed Snakemake) into :class:`StoppedBySignal` (a SystemExit)
    while the block runs.

    Python's default SIGTERM ends the process at once, skipping every ``finally``: the
    prepared-store writer's and ``atomic_path``'s temporary files would stay behind. As an
    exception, the writers remove them on the way out.

    A SIGTERM that arrives while a module is being imported is held until the import returns
    (checked every ``SIGTERM_RECHECK_SECONDS`` with SIGALRM): torch's extension swallows an
    exception raised inside the imports it makes (numpy's), and the job would run to its end.
    So the block may import lazily (torchvision only where images are decoded).
    """

    received: list[int] = []
    raised: list[bool] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGTERM:
            received.append(signum)
        if not received or raised:  # another's SIGALRM; or already stopping: let cleanup run
            return
        if importing(frame):
            signal.setitimer(signal.ITIMER_REAL, SIGTERM_RECHECK_SECONDS)
            return
        signal.setitimer(signal.ITIMER_REAL, 0)
        raised.append(True)
        raise StoppedBySignal(128 + received[0])

    previous_term = signal.signal(signal.SIGTERM, stop)
    previous_alarm = signal.signal(signal.SIGALRM, stop)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_alarm)
        signal.signal(signal.SIGTERM, previous_term)
    if received:
        # The SystemExit was swallowed on its way out (library code with a bare except):
        # the job was still told to stop, so it must not report success.
        raise StoppedBySignal(128 + received[0])


def run_prepare(args: argparse.Namespace) -> int:
    from vitplasticity.data.prepare import prepare_dataset

    with exit_on_sigterm():
        counts = prepare_dataset(args.dataset, args.spec, args.out, downloads=args.downloads)
    log.info("prepared %s into %s: %s", args.dataset, args.out, counts)
    return 0


def run_reference(args: argparse.Namespace) -> int:
    from vitplasticity.data.reference import build_reference

    with exit_on_sigterm():
        n = build_reference(
            args.out,
            source=args.source,
            imagenet=args.imagenet or None,
            dataset_dir=args.dataset_dir or None,
            split=args.split,
            n_images=args.n_images,
            selection=args.selection,
            seed=args.seed,
        )
    log.info("reference set %s: %d images", args.out, n)
    return 0
