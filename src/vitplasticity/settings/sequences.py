"""How a text dataset becomes token sequences: the keys ``tokenizer`` and ``sequence_length``
of a ``datasets:`` entry of source ``text_file`` or ``labelled_text``, declared once for every
stage that cuts text (text plasticity, its bounds, recommend --text, text finetuning and
classification).

A text dataset is a dataset like any other: its entry names the file and how it is cut, and
every stage reading it cuts it the same way. The schema gives these keys no default (a
default there would be written into every image entry too); :data:`SEQUENCE_DEFAULTS` is
applied where the workflow reads an entry.
"""

from __future__ import annotations

from typing import Any

from vitplasticity.settings.declaration import setting

TEXT_SOURCE = "text_file"
"""The ``source`` of a text dataset entry: a text file, one document per line."""

LABELLED_SOURCE = "labelled_text"
"""The ``source`` of a labelled text dataset entry: documents with a class label
(:mod:`vitplasticity.data.labelled`), which a text model classifies."""

TEXT_SOURCES = (TEXT_SOURCE, LABELLED_SOURCE)
"""The sources of the datasets a text model reads, each cut by its entry's ``tokenizer`` and
``sequence_length``."""

TOKENIZER_KEY = "datasets.<name>.tokenizer"
SEQUENCE_LENGTH_KEY = "datasets.<name>.sequence_length"

SEQUENCE_DEFAULTS: dict[str, Any] = {"tokenizer": "auto", "sequence_length": 128}
"""A text dataset entry's ``tokenizer`` and ``sequence_length`` where it gives none."""


def tokenizer_setting() -> Any:
    """The declaration of a text dataset's ``tokenizer``."""
    return setting(
        SEQUENCE_DEFAULTS["tokenizer"],
        help="auto (bytes for a random-init model, else the model's own: its weights folder), "
        "bytes, or a tokenizer folder",
        key=TOKENIZER_KEY,
        quote=True,
    )


def sequence_length_setting() -> Any:
    """The declaration of a text dataset's ``sequence_length``: tokens per sequence (at least
    2: a next-token loss predicts from one token at least)."""
    return setting(
        SEQUENCE_DEFAULTS["sequence_length"],
        help="tokens per sequence",
        key=SEQUENCE_LENGTH_KEY,
        minimum=2,
    )


def sequence_settings(entry: dict[str, Any]) -> dict[str, Any]:
    """A text dataset entry's ``tokenizer`` and ``sequence_length``, defaults filled in."""
    return {key: entry.get(key, default) for key, default in SEQUENCE_DEFAULTS.items()}
