"""What turns an image into a model's input (:class:`Preprocessing`), and ImageNet's mean and
std, the normalisation most checkpoints expect. Shared by both model families
(:mod:`vitplasticity.models.timm_build`, :mod:`vitplasticity.models.hf_preprocessing`) and the data
pipelines."""

from __future__ import annotations

from dataclasses import dataclass

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Preprocessing:
    """What turns an image into the model's input: resolution, crop and normalisation."""

    input_size: int
    crop_pct: float
    interpolation: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @property
    def resize_size(self) -> int:
        """The shorter-side resize before the center crop (timm's crop_pct convention)."""
        return round(self.input_size / self.crop_pct)
