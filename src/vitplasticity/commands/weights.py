"""``weights``: fetch one model's pretrained checkpoint for compute jobs that run offline."""

from __future__ import annotations

import argparse
import logging

from vitplasticity.commands import json_argument

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``weights`` subcommand."""
    parser = subparsers.add_parser(
        "weights",
        help="fetch a model's pretrained checkpoint from the hub once (a local job)",
        description="Download the safetensors checkpoint timm would load for a timm id "
        "through huggingface_hub (HF_ENDPOINT, HF_TOKEN and HF_HOME apply) into "
        "OUT_DIR/model.safetensors, and write OUT_DIR/weights.json (repo, revision, commit, "
        "sha256, size, URL). Compute jobs then load that file with HF_HUB_OFFLINE=1.",
    )
    parser.add_argument("--model", required=True, help="model name (config key)")
    parser.add_argument("--timm-id", required=True, help="its timm id, e.g. vit_base_patch16_224")
    parser.add_argument("--revision", default="main", help="hub branch, tag or commit")
    parser.add_argument(
        "--source-kwargs",
        type=json_argument,
        default={},
        help="its pretrained_cfg / pretrained_cfg_overlay kwargs, as JSON (default {})",
    )
    parser.add_argument("--out-dir", required=True, help="<resources>/weights/<model>")
    parser.set_defaults(handler=run_weights)


def run_weights(args: argparse.Namespace) -> int:
    from vitplasticity.weights import SOURCE_KWARGS, fetch

    if not isinstance(args.source_kwargs, dict) or set(args.source_kwargs) - set(SOURCE_KWARGS):
        raise ValueError(
            f"--source-kwargs: expected an object with keys among {list(SOURCE_KWARGS)}, "
            f"got {args.source_kwargs!r}"
        )
    record = fetch(
        args.model,
        args.timm_id,
        args.out_dir,
        revision=args.revision,
        kwargs=args.source_kwargs,
    )
    log.info(
        "%s: %s/%s at %s (commit %s), %d bytes, sha256 %s -> %s",
        args.model,
        record["repo_id"],
        record["filename"],
        record["revision"],
        record["commit"],
        record["size"],
        record["sha256"],
        args.out_dir,
    )
    return 0
