"""The one registry of remote files: URL, md5 and size per file, and which files each source
needs. Plain Python (no numpy, no torch): the Snakefile imports it on every node to wire the
download jobs.

md5s and sizes are from PROTOCOL.md and torchvision's dataset classes; the DomainNet and
CIFAR-10-C ones are third-party records (no official checksum is published).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RemoteFile:
    """One downloadable file: its name in the downloads folder, URL, md5 and size."""

    filename: str
    url: str
    md5: str | None
    size: int | None = None


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


def local_archives(name: str, spec: Mapping[str, Any]) -> dict[str, Path]:
    """The files a dataset entry's ``archive`` key points at, by registry file name.

    ``archive`` is a path (the main file; for a multi-file source a folder holding the files
    under their registry names) or a mapping from registry file name to path. Files it does
    not cover are downloaded as usual.
    """
    archive = spec.get("archive")
    if not archive:
        return {}
    files = source_files(spec["source"], spec)
    if isinstance(archive, Mapping):
        unknown = sorted(set(archive) - set(files))
        if unknown:
            raise ValueError(
                f"datasets.{name}.archive: {unknown} not among this source's files {files}"
            )
        return {key: Path(os.path.expanduser(value)) for key, value in archive.items()}
    path = Path(os.path.expanduser(str(archive)))
    if path.is_dir():
        return {filename: path / filename for filename in files}
    return {files[0]: path}


def remote_file(name: str, spec: Mapping[str, Any], filename: str) -> RemoteFile:
    """The registry entry of ``filename`` with the dataset's ``url`` override applied.

    ``url`` is a URL (of the main file), a mirror folder ending in ``/`` (every file under
    its registry name), or a mapping from registry file name to URL.
    """
    entry = FILES[filename]
    url = spec.get("url")
    files = source_files(spec["source"], spec)
    if isinstance(url, Mapping):
        unknown = sorted(set(url) - set(files))
        if unknown:
            raise ValueError(
                f"datasets.{name}.url: {unknown} not among this source's files {files}"
            )
        return RemoteFile(filename, url.get(filename, entry.url), entry.md5, entry.size)
    if isinstance(url, str) and url:
        if url.endswith("/"):
            return RemoteFile(filename, url + filename, entry.md5, entry.size)
        if filename == files[0]:
            return RemoteFile(filename, url, entry.md5, entry.size)
    return entry


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


def download_url(datasets: Mapping[str, Mapping[str, Any]], filename: str) -> str:
    """The URL the download job of ``filename`` fetches: the registry's, or the one mirror
    URL that the datasets using the file agree on.

    Raises:
        ValueError: two datasets give different URLs for the same file (named).
    """
    chosen: dict[str, str] = {}
    for name, spec in datasets.items():
        source = spec.get("source", "")
        if has_files(source) and filename in source_files(source, spec) and spec.get("url"):
            chosen[name] = remote_file(name, spec, filename).url
    urls = set(chosen.values())
    if len(urls) > 1:
        raise ValueError(
            f"datasets: conflicting url overrides for {filename}: "
            + ", ".join(f"{n}: {u}" for n, u in sorted(chosen.items()))
        )
    return urls.pop() if urls else FILES[filename].url
