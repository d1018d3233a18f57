"""The one registry of remote files: URL, md5 and size per file, and which files each source
needs; and how a dataset entry's ``url``, ``archive`` and ``checksums`` keys override them.
Plain Python (no numpy, no torch): the Snakefile imports it on every node to wire the
download jobs.

md5s and sizes are from docs/protocol.md and torchvision's dataset classes; the DomainNet and
CIFAR-10-C ones are third-party records (no official checksum is published).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The digests a ``checksums`` entry may name, with their hex lengths.
CHECKSUM_HEX_LENGTHS: dict[str, int] = {"md5": 32, "sha256": 64}


@dataclass(frozen=True)
class Checksum:
    """An expected digest: ``algorithm`` (a key of CHECKSUM_HEX_LENGTHS) and lower-case hex."""

    algorithm: str
    hexdigest: str

    @classmethod
    def parse(cls, text: str) -> Checksum:
        """Read ``"md5:<hex>"`` or ``"sha256:<hex>"``.

        Raises:
            ValueError: saying what is wrong (no prefix, another algorithm, bad hex).
        """
        algorithm, sep, digest = str(text).partition(":")
        algorithm, digest = algorithm.strip().lower(), digest.strip().lower()
        if not sep or algorithm not in CHECKSUM_HEX_LENGTHS:
            forms = " or ".join(f"'{a}:<hex>'" for a in CHECKSUM_HEX_LENGTHS)
            raise ValueError(f"{text!r} is not {forms}")
        length = CHECKSUM_HEX_LENGTHS[algorithm]
        if not re.fullmatch(f"[0-9a-f]{{{length}}}", digest):
            raise ValueError(f"{text!r}: {algorithm} digests have {length} hex digits")
        return cls(algorithm, digest)

    def __str__(self) -> str:
        return f"{self.algorithm}:{self.hexdigest}"


@dataclass(frozen=True)
class RemoteFile:
    """One downloadable file: its name in the downloads folder, URL, md5 and size."""

    filename: str
    url: str
    md5: str | None
    size: int | None = None

    @property
    def checksum(self) -> Checksum | None:
        """The registry's md5 as a Checksum (None where none is recorded)."""
        return Checksum("md5", self.md5.lower()) if self.md5 else None


def _files(*entries: RemoteFile) -> dict[str, RemoteFile]:
    return {entry.filename: entry for entry in entries}


_DOMAINNET = "http://csr.bu.edu/ftp/visda/2019/multi-source"
# clipart and painting were re-released de-duplicated under groundtruth/ (the ones to use).
_DOMAINNET_ZIPS = {
    "clipart": (f"{_DOMAINNET}/groundtruth/clipart.zip", "cd0d8f2d77a4e181449b78ed62bccf1e"),
    "infograph": (f"{_DOMAINNET}/infograph.zip", "720380b86f9e6ab4805bb38b6bd135f8"),
    "painting": (f"{_DOMAINNET}/groundtruth/painting.zip", "1ae32cdb4f98fe7ab5eb0a351768abfd"),
    "quickdraw": (f"{_DOMAINNET}/quickdraw.zip", "bdc1b6f09f277da1a263389efe0c7a66"),
    "real": (f"{_DOMAINNET}/real.zip", "dcc47055e8935767784b7162e7c7cca6"),
    "sketch": (f"{_DOMAINNET}/sketch.zip", "658d8009644040ff7ce30bb2e820850f"),
}
# The official train/test lists (used with split: official), md5s as recorded by awslabs/renate.
_DOMAINNET_LISTS = {
    "clipart": ("b4349693a7f9c05c53955725c47ed6cb", "f5ddbcfd657a3acf9d0f7da10db22565"),
    "infograph": ("379b50054f4ac2018dca4f89421b92d9", "779626b50869edffe8ea6941c3755c71"),
    "painting": ("7db0e7ca73ad9982f6e1f7f3ef372c0a", "232b35dc53f26d414686ae579e38d9b5"),
    "quickdraw": ("b732ced3939ac8efdd8c0a889dca56cc", "c1a828fdfe216fb109f1c0083a252c6f"),
    "real": ("8ebf02c2075fadd564705f0dc7cd6291", "6098816791c3ebed543c71ffa11b9054"),
    "sketch": ("1233bd18aa9a8a200bf4cecf1c34ef3e", "d8a222e4672cfd585298aa14d02ea441"),
}
DOMAINNET_DOMAINS: tuple[str, ...] = tuple(_DOMAINNET_ZIPS)
CIFAR10C_CORRUPTIONS: tuple[str, ...] = (
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "defocus_blur",
    "glass_blur",
    "motion_blur",
    "zoom_blur",
    "snow",
    "frost",
    "fog",
    "brightness",
    "contrast",
    "elastic_transform",
    "pixelate",
    "jpeg_compression",
    "speckle_noise",
    "gaussian_blur",
    "spatter",
    "saturate",
)

FILES: dict[str, RemoteFile] = _files(
    RemoteFile(
        "cifar-10-python.tar.gz",
        "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        "c58f30108f718f92721af3b95e74349a",
        170498071,
    ),
    RemoteFile(
        "cifar-100-python.tar.gz",
        "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
        "eb9058c3a382ffc7106e4002c42a8d85",
        169001437,
    ),
    RemoteFile(
        "CIFAR-10-C.tar",
        "https://zenodo.org/records/2535967/files/CIFAR-10-C.tar?download=1",
        "56bf5dcef84df0e2308c6dcbcbbd8499",
    ),
    *(RemoteFile(f"{d}.zip", url, md5) for d, (url, md5) in _DOMAINNET_ZIPS.items()),
    *(
        RemoteFile(f"{d}_{part}.txt", f"{_DOMAINNET}/domainnet/txt/{d}_{part}.txt", md5)
        for d, md5s in _DOMAINNET_LISTS.items()
        for part, md5 in zip(("train", "test"), md5s, strict=True)
    ),
    RemoteFile(
        "102flowers.tgz",
        "https://www.robots.ox.ac.uk/~vgg/data/flowers/102/102flowers.tgz",
        "52808999861908f626f3c1f4e79d11fa",
    ),
    RemoteFile(
        "imagelabels.mat",
        "https://www.robots.ox.ac.uk/~vgg/data/flowers/102/imagelabels.mat",
        "e0620be6f572b9609742df49c70aed4d",
    ),
    RemoteFile(
        "setid.mat",
        "https://www.robots.ox.ac.uk/~vgg/data/flowers/102/setid.mat",
        "a5357ecc9cb78c4bef273ce3793fc85c",
    ),
    RemoteFile(
        "images.tar.gz",
        "https://www.robots.ox.ac.uk/~vgg/data/pets/data/images.tar.gz",
        "5c4f3ee8e5d25df40f4fd59a7f44e54c",
    ),
    RemoteFile(
        "annotations.tar.gz",
        "https://www.robots.ox.ac.uk/~vgg/data/pets/data/annotations.tar.gz",
        "95a8c909bbe2e81eed6a22bccdf3f68f",
    ),
)

# Known split sizes (and class counts) that a prepared dataset is checked against. DomainNet's
# per-domain totals differ between releases, so they are recorded in meta.json, not checked.
KNOWN_COUNTS: dict[str, dict[str, int]] = {
    "cifar10": {"pool": 50000, "test": 10000, "num_classes": 10},
    "cifar100": {"pool": 50000, "test": 10000, "num_classes": 100},
    "cifar10c": {"pool": 8000, "test": 2000, "num_classes": 10},
    "domainnet": {"num_classes": 345},
    "flowers102": {"pool": 1020, "val": 1020, "test": 6149, "num_classes": 102},
    "pet": {"pool": 3680, "test": 3669, "num_classes": 37},
}


def source_files(source: str, spec: Mapping[str, Any]) -> list[str]:
    """The registry file names that ``source`` needs for this dataset entry (main file first).

    Raises:
        ValueError: an unknown source, or a DomainNet domain without files.
    """
    if source == "cifar10":
        return ["cifar-10-python.tar.gz"]
    if source == "cifar100":
        return ["cifar-100-python.tar.gz"]
    if source == "cifar10c":
        return ["CIFAR-10-C.tar"]
    if source == "domainnet":
        domain = spec.get("domain")
        if domain not in DOMAINNET_DOMAINS:
            raise ValueError(f"domain: {domain!r} is not one of {', '.join(DOMAINNET_DOMAINS)}")
        lists = [f"{domain}_train.txt", f"{domain}_test.txt"]
        return [f"{domain}.zip", *(lists if spec.get("split", "random") == "official" else [])]
    if source == "flowers102":
        return ["102flowers.tgz", "imagelabels.mat", "setid.mat"]
    if source == "pet":
        return ["images.tar.gz", "annotations.tar.gz"]
    raise ValueError(f"source: {source!r} has no files in the registry")


def has_files(source: str) -> bool:
    """Whether ``source`` reads registry files (synthetic and image_folder do not)."""
    return source in KNOWN_COUNTS


def _files_problems(
    name: str, key: str, given: Mapping[str, Any], files: list[str], source: str
) -> list[str]:
    """One problem per key of the mapping ``datasets.<name>.<key>`` that is not in ``files``."""
    problems = []
    for filename in given:
        if filename not in files:
            close = difflib.get_close_matches(str(filename), files, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            problems.append(
                f"datasets.{name}.{key}: {filename!r} is not a file of this {source} entry; "
                f"{hint}(its files: {', '.join(files)})"
            )
    return problems


def entry_problems(name: str, spec: Mapping[str, Any]) -> list[str]:
    """Everything wrong with the ``url``, ``archive`` and ``checksums`` keys of dataset ``name``.

    A mapping may only name the files this entry uses; a checksum must parse; a single URL
    without a trailing ``/`` is only allowed for a source with one file (for several files it
    would silently fetch the others from the registry's URL).

    Returns:
        One message per problem, each starting with the key (``datasets.<name>.<key>``).
    """
    source = spec.get("source", "")
    if not has_files(source):
        return []
    try:
        files = source_files(source, spec)
    except ValueError as error:
        return [f"datasets.{name}.{error}"]
    problems: list[str] = []
    for key in ("url", "archive", "checksums"):
        value = spec.get(key)
        if isinstance(value, Mapping):
            problems += _files_problems(name, key, value, files, source)
        elif key == "checksums" and value is not None:
            problems.append(
                f"datasets.{name}.checksums: expected {{file name: 'md5:<hex>' or "
                f"'sha256:<hex>'}}, got {value!r}"
            )
    url = spec.get("url")
    if isinstance(url, str) and url and not url.endswith("/") and len(files) > 1:
        problems.append(
            f"datasets.{name}.url: {url!r} is one URL but this {source} entry needs "
            f"{len(files)} files ({', '.join(files)}): end it with '/' if it is a folder "
            f"holding them under these names, or map each file to its URL "
            f"(url: {{{files[0]}: {url}, ...}})"
        )
    checksums = spec.get("checksums")
    if isinstance(checksums, Mapping):
        for filename, text in checksums.items():
            try:
                Checksum.parse(text)
            except ValueError as error:
                problems.append(f"datasets.{name}.checksums.{filename}: {error}")
    return problems


def _check_entry(name: str, spec: Mapping[str, Any]) -> list[str]:
    """The entry's files, after raising ValueError listing every problem of its overrides."""
    problems = entry_problems(name, spec)
    if problems:
        raise ValueError("\n".join(problems))
    return source_files(spec["source"], spec)


def local_archives(name: str, spec: Mapping[str, Any]) -> dict[str, Path]:
    """The files a dataset entry's ``archive`` key points at, by registry file name.

    ``archive`` is a path (the main file; for a multi-file source a folder holding the files
    under their registry names) or a mapping from registry file name to path. Files it does
    not cover are downloaded as usual.

    Raises:
        ValueError: the entry's ``url``, ``archive`` or ``checksums`` is invalid (named).
    """
    archive = spec.get("archive")
    if not archive:
        return {}
    files = _check_entry(name, spec)
    if isinstance(archive, Mapping):
        return {key: Path(os.path.expanduser(value)) for key, value in archive.items()}
    path = Path(os.path.expanduser(str(archive)))
    if path.is_dir():
        return {filename: path / filename for filename in files}
    return {files[0]: path}


def remote_file(name: str, spec: Mapping[str, Any], filename: str) -> RemoteFile:
    """The registry entry of ``filename`` with the dataset's ``url`` override applied.

    ``url`` is a URL (of the file, for a single-file source), a mirror folder ending in ``/``
    (every file under its registry name), or a mapping from registry file name to URL.

    Raises:
        ValueError: the entry's ``url``, ``archive`` or ``checksums`` is invalid (named).
    """
    entry = FILES[filename]
    url = spec.get("url")
    if not url:
        return entry
    files = _check_entry(name, spec)
    if isinstance(url, Mapping):
        return RemoteFile(filename, url.get(filename, entry.url), entry.md5, entry.size)
    if url.endswith("/"):
        return RemoteFile(filename, url + filename, entry.md5, entry.size)
    return RemoteFile(filename, url if filename == files[0] else entry.url, entry.md5, entry.size)


def file_checksum(
    name: str, spec: Mapping[str, Any], filename: str, entry: RemoteFile | None = None
) -> Checksum | None:
    """The digest that ``filename`` of dataset ``name`` must have: the entry's ``checksums``
    override (a mirror or local copy with other bytes), else the registry's md5.

    Args:
        name: the dataset's config key (named in errors).
        spec: its config entry.
        filename: a registry file name the entry uses.
        entry: the registry entry to fall back on (default ``FILES[filename]``).

    Raises:
        ValueError: the entry's ``url``, ``archive`` or ``checksums`` is invalid (named).
    """
    fallback = (entry or FILES[filename]).checksum
    checksums = spec.get("checksums")
    if not checksums:
        return fallback
    _check_entry(name, spec)
    return Checksum.parse(checksums[filename]) if filename in checksums else fallback


def download_inputs(
    datasets: Mapping[str, Mapping[str, Any]], name: str, downloads: str
) -> list[str]:
    """The files the ``prepare`` job of dataset ``name`` reads: local archives as given,
    everything else as ``<downloads>/<registry file name>`` (made by the download rule)."""
    spec = datasets[name]
    if not has_files(spec.get("source", "")):
        return []
    local = local_archives(name, spec)
    return [
        str(local[f]) if f in local else f"{downloads}/{f}"
        for f in source_files(spec["source"], spec)
    ]


def _downloaders(
    datasets: Mapping[str, Mapping[str, Any]], filename: str
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """The (name, entry) of every dataset that reads ``filename`` from the downloads folder
    (it uses the file and no ``archive`` of its own covers it)."""
    for name, spec in datasets.items():
        source = spec.get("source", "")
        uses = has_files(source) and filename in source_files(source, spec)
        if uses and filename not in local_archives(name, spec):
            yield name, spec


def _agreed(chosen: Mapping[str, str], filename: str, what: str) -> str | None:
    """The one value that the config keys in ``chosen`` (key path -> value) give for
    ``filename``, None when none does.

    Raises:
        ValueError: two keys give different values (both named).
    """
    if len(set(chosen.values())) > 1:
        raise ValueError(
            f"datasets: conflicting {what} overrides for {filename} (one download serves "
            "every dataset using it; give them the same value): "
            + ", ".join(f"{path}: {value}" for path, value in sorted(chosen.items()))
        )
    return next(iter(chosen.values()), None)


def download_url(datasets: Mapping[str, Mapping[str, Any]], filename: str) -> str:
    """The URL the download job of ``filename`` fetches: the registry's, or the one mirror
    URL that the datasets downloading the file agree on.

    Raises:
        ValueError: two datasets give different URLs for the same file (named).
    """
    official = FILES[filename].url
    urls = {
        name: remote_file(name, spec, filename).url
        for name, spec in _downloaders(datasets, filename)
    }
    chosen = {f"datasets.{name}.url": url for name, url in urls.items() if url != official}
    return _agreed(chosen, filename, "url") or official


def download_checksum(datasets: Mapping[str, Mapping[str, Any]], filename: str) -> Checksum | None:
    """The digest the download job of ``filename`` verifies: the registry's md5, or the
    ``checksums`` override that the datasets downloading the file agree on.

    Overrides are compared per algorithm: an md5 and a sha256 cannot be compared without the
    file, and those of the same bytes are no conflict. The download job verifies the sha256
    (the stronger digest) where one is given; each dataset's prepare job then verifies the
    file against its own override, so a wrong one is still found, naming its key.

    Raises:
        ValueError: two datasets give different digests of one algorithm for the same file
            (both named).
    """
    chosen = {
        f"datasets.{name}.checksums.{filename}": file_checksum(name, spec, filename)
        for name, spec in _downloaders(datasets, filename)
        if filename in (spec.get("checksums") or {})
    }
    agreed: dict[str, Checksum] = {}
    for algorithm in sorted(CHECKSUM_HEX_LENGTHS, key=lambda a: -CHECKSUM_HEX_LENGTHS[a]):
        same = {key: str(value) for key, value in chosen.items() if value.algorithm == algorithm}
        value = _agreed(same, filename, "checksums")
        if value is not None:
            agreed[algorithm] = Checksum.parse(value)
    return next(iter(agreed.values()), None) or FILES[filename].checksum


def shared_download_problems(datasets: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Conflicting ``url`` or ``checksums`` overrides of a file that several datasets download
    (one download job serves them all), one message per file and key."""
    problems = []
    for filename in FILES:
        for resolve in (download_url, download_checksum):
            try:
                resolve(datasets, filename)
            except ValueError as error:
                problems.append(str(error))
    return problems


def with_download_checksums(datasets: Mapping[str, Mapping[str, Any]], name: str) -> dict[str, Any]:
    """Dataset ``name``'s entry with a ``checksums`` item for every file it downloads whose
    download job verifies another digest than the registry's (another dataset sharing the file
    overrides it), so that its prepare job accepts the file the download job verified."""
    spec = dict(datasets[name])
    if not has_files(spec.get("source", "")):
        return spec
    own = dict(spec.get("checksums") or {})
    for filename in source_files(spec["source"], spec):
        if filename in own or filename in local_archives(name, spec):
            continue
        shared = download_checksum(datasets, filename)
        if shared != FILES[filename].checksum:
            own[filename] = str(shared)
    if own:
        spec["checksums"] = own
    return spec
