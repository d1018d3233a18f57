"""``download``: fetch one registry file, checksum-verified, atomic and resumable."""

from __future__ import annotations

import argparse
import logging

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``download`` subcommand."""
    parser = subparsers.add_parser(
        "download",
        help="download one file of the source registry (checksum-verified, resumable)",
        description="Download one file named in the source registry into the downloads "
        "folder: resumed from a partial .part file, retried with backoff, renamed into "
        "place only when its checksum matches.",
    )
    parser.add_argument("--file", required=True, help="registry file name, e.g. clipart.zip")
    parser.add_argument("--url", default="", help="URL to fetch (default: the registry's)")
    parser.add_argument("--md5", default="", help="expected md5 (default: the registry's)")
    parser.add_argument(
        "--checksum",
        default="",
        help="expected digest, md5:<hex> or sha256:<hex> (replaces --md5 and the registry's)",
    )
    parser.add_argument("--retries", type=int, default=5, help="retries of failed attempts")
    parser.add_argument("--out", required=True, help="destination path")
    parser.set_defaults(handler=run_download)


def run_download(args: argparse.Namespace) -> int:
    from vitplasticity.data.download import download, expected_checksum
    from vitplasticity.data.sources.registry import FILES

    if args.file not in FILES:
        raise ValueError(f"--file: {args.file!r} is not in the registry; known: {sorted(FILES)}")
    entry = FILES[args.file]
    given = expected_checksum(None, args.checksum or None)
    # The workflow passes the registry's digest or a config override; only the latter is the
    # user's to correct.
    origin = (
        f"--checksum (in the workflow: a datasets.<name>.checksums.{args.file} entry of your "
        "config)"
        if given is not None and given != entry.checksum
        else None
    )
    download(
        args.url or entry.url,
        args.out,
        md5=args.md5 or entry.md5,
        checksum=given,
        checksum_origin=origin,
        retries=args.retries,
    )
    return 0
