"""``weights``: fetch one model's pretrained weights for compute jobs that run offline."""

from __future__ import annotations

import argparse
import logging

from vitplasticity.settings.declaration import json_argument

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``weights`` subcommand."""
    parser = subparsers.add_parser(
        "weights",
        help="fetch a model's pretrained weights from the hub once (a local job)",
        description="Through huggingface_hub (HF_ENDPOINT, HF_TOKEN and HF_HOME apply): for a "
        "timm id, download the safetensors checkpoint timm would load into "
        "OUT_DIR/model.safetensors; for a transformers hub id, a snapshot of the repo "
        "(config.json, safetensors weights, image processor and tokenizer files) into "
        "OUT_DIR. Then write OUT_DIR/weights.json (repo, revision, commit, and each file's "
        "sha256 and size). Compute jobs then load them with HF_HUB_OFFLINE=1.",
    )
    parser.add_argument("--model", required=True, help="model name (config key)")
    ids = parser.add_mutually_exclusive_group(required=True)
    ids.add_argument("--timm-id", help="a timm model's id, e.g. vit_base_patch16_224")
    ids.add_argument("--hf-id", help="a transformers model's hub repo, e.g. facebook/dinov2-small")
    parser.add_argument("--revision", default="main", help="hub branch, tag or commit")
    parser.add_argument(
        "--source-kwargs",
        type=json_argument,
        default={},
        help="with --timm-id: its pretrained_cfg / pretrained_cfg_overlay kwargs, as JSON "
        "(default {})",
    )
    parser.add_argument("--out-dir", required=True, help="<resources>/weights/<model>")
    parser.set_defaults(handler=run_weights)


def run_weights(args: argparse.Namespace) -> int:
    """Fetch (:func:`vitplasticity.models.weights.fetch` or ``fetch_snapshot``) and log the record."""
    from vitplasticity.models.weights import SOURCE_KWARGS, fetch, fetch_snapshot

    if args.hf_id is not None:
        if args.source_kwargs:
            raise ValueError("--source-kwargs: a timm option, not one of --hf-id")
        record = fetch_snapshot(args.model, args.hf_id, args.out_dir, revision=args.revision)
        log.info(
            "%s: %s at %s (commit %s): %s -> %s",
            args.model,
            record["repo_id"],
            record["revision"],
            record["commit"],
            ", ".join(
                f"{f['path']} ({f['size']} bytes, sha256 {f['sha256']})" for f in record["files"]
            ),
            args.out_dir,
        )
        return 0
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
