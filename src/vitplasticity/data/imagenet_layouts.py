"""Where the ImageNet-1k val images of the plasticity reference set are found: the environment
variable, the layouts :mod:`vitplasticity.data.imagenet` reads, and the message when no path is
set. Plain Python (no torch): :mod:`vitplasticity.workflow.config` imports it for the Snakefile."""

IMAGENET_ENV = "VITPLASTICITY_IMAGENET"
IMAGENET_LAYOUTS = (
    "a folder val/<wnid>/*.JPEG (or the val folder itself)",
    "the official ILSVRC2012_img_val.tar with ILSVRC2012_devkit_t12.tar.gz beside it",
    "the HF-hosted val_images.tar.gz",
)


def imagenet_missing_message() -> str:
    """The error shown when a job needs ImageNet and no path is set."""
    layouts = "\n".join(f"  - {layout}" for layout in IMAGENET_LAYOUTS)
    return (
        f"ImageNet-1k val is needed for the plasticity reference set, but no path is set.\n"
        f"Set paths.imagenet in config.yaml (or the environment variable {IMAGENET_ENV}) to one of:\n"
        f"{layouts}\n"
        "ImageNet cannot be downloaded by a program (its terms of access)."
    )
