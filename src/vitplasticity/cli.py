"""The ``vitplasticity`` command: one subcommand per workflow stage.

Each subcommand lives in ``vitplasticity.commands.<module>`` as a ``register(subparsers)``
function; its handler parses, calls one stage module, and writes. Heavy imports (torch,
timm) happen inside handlers so that ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from vitplasticity.commands import StoppedBySignal
from vitplasticity.utils import gpu_slots
from vitplasticity.version import __version__

# The stages that compute on a GPU: on a workstation each takes a GPU of its own before it
# imports torch (vitplasticity.utils.gpu_slots; nothing changes under SLURM or without a GPU).
GPU_COMMANDS: frozenset[str] = frozenset(
    {
        "finetune",
        "plasticity",
        "recommend",
        "recommend-verify",
    }
)

# Modules that register subcommands, in the order --help lists them.
COMMAND_MODULES: tuple[str, ...] = (
    "download",
    "weights",
    "data",
    "plasticity",
    "bounds",
    "finetune",
    "report",
    "recommend",
    "verify",
    "criteria",
)


# Subcommands that became a flag of another: the old name stops with what to write instead.
REMOVED_COMMANDS: dict[str, str] = {
    "finetune-text": "vitplasticity finetune --text <file> (with --tokenizer, --sequence-length "
    "and --mask-probability): one finetune command takes images or text",
    "text-plasticity": "vitplasticity plasticity --text <downstream text file> --reference "
    "<reference text file> (with --tokenizer and --sequence-length): one plasticity command "
    "measures image and text models",
    "text-bounds": "vitplasticity bounds --text <reference text file> (with --tokenizer, "
    "--sequence-length and --n-sequences): one bounds command computes image and text models'",
    "recommend-text": "vitplasticity recommend --text <files> --reference <text file> "
    "--model-spec <entry>: one recommend command ranks image and text models",
    "text-criteria": "vitplasticity criteria --runs <summary.json files> --experiment <name> "
    "--selected-out <file> --markdown <file> --out <file>: one criteria command scores image "
    "and text experiments",
}


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every stage's subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="vitplasticity",
        description="Plasticity and single-component finetuning of vision transformers "
        "(arXiv 2602.06883). Each subcommand runs one workflow stage.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="STAGE")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"vitplasticity.commands.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"vitplasticity.commands.{name}":
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    command = next((word for word in argv if not word.startswith("-")), None)
    if command in REMOVED_COMMANDS:
        print(
            f"vitplasticity: the {command} subcommand is removed; write {REMOVED_COMMANDS[command]}",
            file=sys.stderr,
        )
        return 2
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        if args.command in GPU_COMMANDS:
            gpu_slots.hold_slot(getattr(args, "device", None))
        return int(args.handler(args) or 0)
    except StoppedBySignal as stop:
        # Its files are cleaned up by now. Leave without the interpreter's finalisation: a
        # SIGTERM that lands while torch is being imported can stop the process with torch's
        # native threads half started, and their static destructors at exit then abort it
        # ("terminate called without an active exception", status -6 instead of 143; seen in CI).
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(stop.code or 1))
    except (ValueError, OSError, RuntimeError) as error:
        # Bad input, or an output the system refuses (full disk, read-only folder): one clear
        # line naming the culprit, no traceback to dig through.
        logging.getLogger("vitplasticity").error("%s", one_line(error))
        if args.verbose:
            raise
        return 2


def one_line(error: BaseException) -> str:
    """What ``error`` says, naming its file: an OSError raised by the system reads
    ``[Errno 28] No space left on device: 'x'``; it becomes ``x: No space left on device``."""
    if isinstance(error, OSError) and error.strerror and str(error).startswith("[Errno"):
        names = [str(n) for n in (error.filename, error.filename2) if n is not None]
        return f"{' -> '.join(names)}: {error.strerror}" if names else error.strerror
    return str(error)


if __name__ == "__main__":
    sys.exit(main())
