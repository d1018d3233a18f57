"""The data a job reads: downloads, prepared datasets, the plasticity reference set and the
text datasets' files or folders (``source: text_file`` or ``labelled_text``, read where their
entry names them), below ``<resources>`` or where the config names them."""

from __future__ import annotations

from typing import Any

from vitplasticity.data.sources import registry
from vitplasticity.settings.sequences import sequence_settings
from vitplasticity.workflow.config import imagenet_path
from vitplasticity.workflow.dataset_kinds import is_text_dataset
from vitplasticity.workflow.jobs import names_pattern
from vitplasticity.workflow.params import Wildcards, as_json

# Dataset keys that shape training, not the prepared data: editing them must not re-prepare.
TRAINING_KEYS = ("steps", "val_every")


class DatasetJobs:
    """The data inputs and params of the download, prepare, reference and compute jobs.

    Args:
        config: the validated config (every default filled in by the schema).
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.datasets: dict[str, dict[str, Any]] = config["datasets"]
        self.resources = config["paths"]["resources"]
        self.downloads = f"{self.resources}/downloads"
        # A wildcard constraint: the download rule makes the registry's files only.
        self.registry_files = names_pattern(registry.FILES)

    def download_url(self, wildcards: Wildcards) -> str:
        """The URL of one registry file: the registry's, or the datasets' mirror override."""
        return registry.download_url(self.datasets, wildcards.file)

    def download_checksum(self, wildcards: Wildcards) -> str:
        """The digest the download job verifies ("" when the registry has none)."""
        return str(registry.download_checksum(self.datasets, wildcards.file) or "")

    def prepare_inputs(self, wildcards: Wildcards) -> list[str]:
        """The files a dataset's prepare job reads: its local archives, else the downloads."""
        return registry.download_inputs(self.datasets, wildcards.dataset, self.downloads)

    def source_spec(self, wildcards: Wildcards) -> str:
        """The dataset's config entry without its training keys, as JSON; a file it downloads
        carries the checksum its download job verified (another dataset may override it)."""
        entry = registry.with_download_checksums(self.datasets, wildcards.dataset)
        return as_json({k: v for k, v in entry.items() if k not in TRAINING_KEYS})

    def dataset_dir(self, dataset: str) -> str:
        """The prepared dataset's folder: ``<resources>/datasets/<dataset>``."""
        return f"{self.resources}/datasets/{dataset}"

    def dataset(self, wildcards: Wildcards) -> str:
        """Input function: what the job's dataset is read from: an image dataset's prepared
        folder, a text dataset's file or labelled text's file or folder
        (``datasets.<name>.path``, read where it is)."""
        if is_text_dataset(self.datasets[wildcards.dataset]):
            return self.datasets[wildcards.dataset]["path"]
        return self.dataset_dir(wildcards.dataset)

    def reference_file(self) -> str:
        """The plasticity reference set: ``<resources>/reference/<reference.name>.parquet``."""
        return f"{self.resources}/reference/{self.config['reference']['name']}.parquet"

    def reference_input(self, wildcards: Wildcards) -> list[str]:
        """The prepared dataset a 'dataset'-sourced reference set is taken from."""
        reference = self.config["reference"]
        return [self.dataset_dir(reference["dataset"])] if reference["source"] == "dataset" else []

    def imagenet(self, wildcards: Wildcards) -> str:
        """Params function: ImageNet val's folder ("" when neither the environment nor
        ``paths.imagenet`` names one)."""
        return imagenet_path(self.config) or ""

    def reference_dataset_dir(self, wildcards: Wildcards, input: Any) -> str:
        """Params function: the reference job's prepared dataset ("" when it reads none)."""
        return input[0] if input else ""

    def text_reference(self, wildcards: Wildcards) -> str:
        """Input function: the text file of text plasticity's reference dataset
        (``datasets.<text_plasticity.reference>.path``)."""
        return self.datasets[self.config["text_plasticity"]["reference"]]["path"]

    def recommend_reference(self, wildcards: Wildcards) -> str:
        """Input function: what a recommend job ranks against: the plasticity reference set
        for an image dataset, text plasticity's reference text for labelled text (cut by the
        job as the labelled dataset is cut: its text flags)."""
        if is_text_dataset(self.datasets[wildcards.dataset]):
            return self.text_reference(wildcards)
        return self.reference_file()

    def reference_sequences(self) -> dict[str, Any]:
        """Params: :func:`text_reference_sequences` of the config."""
        return text_reference_sequences(self.config)


def text_reference_sequences(config: dict[str, Any]) -> dict[str, Any]:
    """The tokenizer and sequence length of text plasticity's reference dataset: the text
    stages cut every dataset as they cut the reference (check_config refuses a dataset cut
    otherwise); the defaults while the stage names no reference (disabled)."""
    reference = config["text_plasticity"]["reference"]
    return sequence_settings(config["datasets"].get(reference) or {})
