"""Which hub file timm loads for a model's pretrained weights (the weights stage fetches it;
the provenance finds it in the huggingface_hub cache). Importing this module imports neither
torch nor timm.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class HubFile:
    """The file of a hub repo that timm would load for a model."""

    repo_id: str
    filename: str
    revision: str


def hub_file(
    timm_id: str,
    revision: str = "main",
    kwargs: Mapping[str, Any] | None = None,
    model: str = "?",
) -> HubFile:
    """The hub repo, file and revision of ``timm_id``'s pretrained weights, as timm finds them.

    Resolves the pretrained_cfg the way ``timm.create_model`` does (the tag of
    ``arch.tag``, or the architecture's default tag; ``kwargs``' ``pretrained_cfg`` and
    ``pretrained_cfg_overlay`` applied) and takes its ``hf_hub_id``. A revision pinned in
    ``hf_hub_id`` (``repo@rev``) is used unless ``revision`` names another than "main".

    Args:
        timm_id: the model's timm id (config ``models.<model>.timm_id``).
        revision: branch, tag or commit (config ``models.<model>.revision``).
        kwargs: the model's timm.create_model kwargs.
        model: the model's config key, for error messages.

    Raises:
        ValueError: naming ``models.<model>`` when timm does not know the id, or its
            pretrained_cfg names no hub repo or no safetensors file.
    """
    where = f"models.{model}.timm_id {timm_id!r}"
    cfg = _pretrained_cfg(timm_id, kwargs or {}, where)
    if not cfg.hf_hub_id:
        raise ValueError(
            f"{where}: no hub weights (its timm pretrained_cfg has no hf_hub_id); "
            "use weights: random or a local weights file"
        )
    repo_id, _, pinned = cfg.hf_hub_id.partition("@")
    filename = safetensors_name(cfg.hf_hub_filename or "pytorch_model.bin")
    if filename is None:
        raise ValueError(
            f"{where}: hub file {cfg.hf_hub_filename!r} of {repo_id} has no safetensors "
            "counterpart; download it yourself and set weights: <path>"
        )
    if cfg.hf_hub_filename and cfg.custom_load:
        raise ValueError(
            f"{where}: {repo_id}/{cfg.hf_hub_filename} needs timm's custom loader; "
            "download it yourself and set weights: <path>"
        )
    return HubFile(repo_id, filename, revision if revision != "main" else pinned or "main")


def safetensors_name(filename: str) -> str | None:
    """The safetensors file timm loads in place of ``filename`` (timm's _get_safe_alternatives)."""
    if filename.endswith(".safetensors"):
        return filename
    special = {
        "pytorch_model.bin": "model.safetensors",
        "open_clip_pytorch_model.bin": "open_clip_model.safetensors",
    }
    if filename in special:
        return special[filename]
    return filename.removesuffix(".bin") + ".safetensors" if filename.endswith(".bin") else None


def _pretrained_cfg(timm_id: str, kwargs: Mapping[str, Any], where: str) -> Any:
    """``timm_id``'s pretrained_cfg as ``timm.create_model`` resolves it.

    Raises:
        ValueError: naming ``where`` for a hub-config id, an unknown architecture or tag.
    """
    import timm
    from timm.models import parse_model_name, split_model_name_tag
    from timm.models._builder import resolve_pretrained_cfg

    source, name = parse_model_name(timm_id)
    if source:
        raise ValueError(
            f"{where}: '{source}:' ids load their config from the hub in every job; use the timm "
            "registry id (arch.tag) or download the file yourself and set weights: <path>"
        )
    arch, tag = split_model_name_tag(name)
    if not timm.is_model(arch):
        raise ValueError(f"{where}: timm has no architecture {arch!r}")
    try:
        return resolve_pretrained_cfg(
            arch, kwargs.get("pretrained_cfg") or tag or None, kwargs.get("pretrained_cfg_overlay")
        )
    except RuntimeError as error:  # timm: "Invalid pretrained tag (...) for <arch>"
        raise ValueError(f"{where}: {error}") from error
