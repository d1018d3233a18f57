"""Small archives in each real dataset format, and a local HTTP server with injectable faults.

The builders write the formats the real files use (CIFAR pickles in a tar.gz, CIFAR-10-C
``.npy`` in a tar, a DomainNet zip of class folders, Flowers-102's tgz + ``.mat`` files,
Oxford Pets' two tar.gz, ImageNet's val tar + devkit, the HF tar.gz, a val folder tree) and
return what they put in, so that tests compare the prepared store against it.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import io
import pickle
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from vitplasticity.data.sources.registry import FILES, RemoteFile


def md5_of(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def jpeg(seed: int, size: int = 12) -> bytes:
    """A small distinct JPEG."""
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


def tar_bytes(members: dict[str, bytes], mode: str = "w:gz") -> bytes:
    """A tar (``w:gz`` or plain ``w``) holding ``members`` in the given order."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


# --- the local HTTP server -----------------------------------------------------------------


@dataclass
class FileServer:
    """Serves ``files`` (URL path -> bytes) with HTTP Range support and one-shot faults.

    ``faults[path]`` is a list consumed one request at a time: ``"500"`` (an HTTP 500),
    ``"drop"`` (full Content-Length, half the body, then the connection closes),
    ``"truncate"`` (half the body with a matching Content-Length: looks complete),
    ``"no_range"`` (ignores the Range header, sends the whole file with 200), ``"404"``.
    ``requests`` logs ``(path, Range header)`` of every request.
    """

    files: dict[str, bytes] = field(default_factory=dict)
    faults: dict[str, list[str]] = field(default_factory=dict)
    requests: list[tuple[str, str | None]] = field(default_factory=list)
    port: int = 0

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}"

    def add(self, path: str, data: bytes) -> str:
        self.files["/" + path.lstrip("/")] = data
        return self.url(path)

    def fault(self, path: str, *kinds: str) -> None:
        self.faults.setdefault("/" + path.lstrip("/"), []).extend(kinds)

    def remote(self, filename: str, data: bytes, md5: str | None = None) -> RemoteFile:
        """Serve ``data`` under a registry file name; its entry with this server's URL."""
        url = self.add(f"files/{filename}", data)
        return RemoteFile(filename, url, md5 if md5 is not None else md5_of(data))


def _handler(server: FileServer) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # keep test output quiet
            pass

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            server.requests.append((path, self.headers.get("Range")))
            data = server.files.get(path)
            pending = server.faults.get(path) or []
            fault = pending.pop(0) if pending else None
            if data is None or fault == "404":
                self._reply(404, b"not found")
                return
            if fault == "500":
                self._reply(500, b"server error")
                return
            start = 0
            header = self.headers.get("Range")
            if header and fault != "no_range":
                start = int(header.removeprefix("bytes=").split("-")[0])
                if start >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            body = data[start:]
            if fault == "truncate":
                body = body[: len(body) // 2]
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            if fault == "drop":
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)

        def _reply(self, code: int, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


@contextlib.contextmanager
def running_server() -> Iterator[FileServer]:
    """A FileServer on 127.0.0.1 (ephemeral port) in a background thread."""
    state = FileServer()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    httpd.daemon_threads = True
    state.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()


# --- dataset archives ----------------------------------------------------------------------


@dataclass
class Built:
    """What a builder wrote: served/registry files by name, and the ground truth."""

    blobs: dict[str, bytes]
    truth: dict


def cifar_archive(kind: str, n_per_batch: int = 6, seed: int = 0) -> Built:
    """A cifar-10 (5 train batches) or cifar-100 (one train file) python-pickle tar.gz."""
    rng = np.random.default_rng(seed)
    if kind == "cifar10":
        folder, train, test, meta = (
            "cifar-10-batches-py",
            [f"data_batch_{k}" for k in range(1, 6)],
            ["test_batch"],
            "batches.meta",
        )
        label_key, names_key, num_classes = b"labels", b"label_names", 10
    else:
        folder, train, test, meta = "cifar-100-python", ["train"], ["test"], "meta"
        label_key, names_key, num_classes = b"fine_labels", b"fine_label_names", 100
    class_names = [f"{kind}_class_{k}" for k in range(num_classes)]
    members: dict[str, bytes] = {}
    truth: dict[str, list] = {"pool": [], "test": []}
    for split, batches in (("pool", train), ("test", test)):
        for batch in batches:
            images = rng.integers(0, 256, (n_per_batch, 32, 32, 3), dtype=np.uint8)
            labels = rng.integers(0, num_classes, n_per_batch).tolist()
            names = [f"{batch}_img_{i}.png".encode() for i in range(n_per_batch)]
            payload = {
                b"data": images.transpose(0, 3, 1, 2).reshape(n_per_batch, -1),
                label_key: labels,
                b"filenames": names,
            }
            members[f"{folder}/{batch}"] = pickle.dumps(payload)
            truth[split].extend(
                (images[i], labels[i], f"{batch}/{names[i].decode()}") for i in range(n_per_batch)
            )
    members[f"{folder}/{meta}"] = pickle.dumps({names_key: [n.encode() for n in class_names]})
    members[f"{folder}/readme.html"] = b"<html></html>"
    filename = "cifar-10-python.tar.gz" if kind == "cifar10" else "cifar-100-python.tar.gz"
    return Built({filename: tar_bytes(members)}, {**truth, "class_names": class_names})


def cifar10c_archive(n_per_severity: int = 20, seed: int = 0) -> Built:
    """CIFAR-10-C.tar (plain tar) with motion_blur, snow and labels.npy, five severities."""
    rng = np.random.default_rng(seed)
    n = 5 * n_per_severity
    arrays = {
        c: rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8) for c in ("motion_blur", "snow")
    }
    labels = rng.integers(0, 10, n).astype(np.uint8)
    members = {}
    for name, array in [*arrays.items(), ("labels", labels)]:
        buffer = io.BytesIO()
        np.save(buffer, array)
        members[f"CIFAR-10-C/{name}.npy"] = buffer.getvalue()
    return Built({"CIFAR-10-C.tar": tar_bytes(members, "w")}, {**arrays, "labels": labels})


def domainnet_archive(domain: str = "clipart", per_class: tuple[int, ...] = (7, 5, 6)) -> Built:
    """<domain>.zip of <domain>/<class>/<file>.jpg (written unsorted), plus official lists."""
    classes = [f"cls_{chr(ord('c') - k)}" for k in range(len(per_class))]  # cls_c, cls_b, cls_a
    images = {}
    for k, (name, count) in enumerate(zip(classes, per_class, strict=True)):
        for i in reversed(range(count)):
            images[f"{domain}/{name}/{domain}_{k:03d}_{i:06d}.jpg"] = jpeg(100 * k + i)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path, data in images.items():
            archive.writestr(path, data)
    paths = sorted(images)
    train = [p for i, p in enumerate(paths) if i % 3]
    test = [p for i, p in enumerate(paths) if not i % 3]
    label = {c: k for k, c in enumerate(sorted(classes))}

    def listing(entries: list[str]) -> bytes:
        return "".join(f"{p} {label[p.split('/')[1]]}\n" for p in entries).encode()

    blobs = {
        f"{domain}.zip": buffer.getvalue(),
        f"{domain}_train.txt": listing(train),
        f"{domain}_test.txt": listing(test),
    }
    return Built(blobs, {"images": images, "train": train, "test": test})


def flowers_archive(n_images: int = 18, num_classes: int = 3, seed: int = 0) -> Built:
    """102flowers.tgz (jpg/image_XXXXX.jpg), imagelabels.mat and setid.mat."""
    from scipy.io import savemat

    rng = np.random.default_rng(seed)
    labels = rng.integers(1, num_classes + 1, n_images)
    labels[:num_classes] = np.arange(1, num_classes + 1)  # every class present
    ids = rng.permutation(np.arange(1, n_images + 1))
    setid = {"trnid": ids[:5], "valid": ids[5:9], "tstid": ids[9:]}
    images = {i: jpeg(i) for i in range(1, n_images + 1)}
    members = {f"jpg/image_{i:05d}.jpg": data for i, data in images.items()}
    blobs = {"102flowers.tgz": tar_bytes(members)}
    for filename, content in (("imagelabels.mat", {"labels": labels}), ("setid.mat", setid)):
        buffer = io.BytesIO()
        savemat(buffer, content)
        blobs[filename] = buffer.getvalue()
    return Built(blobs, {"labels": labels, "setid": setid, "images": images})


def pet_archive() -> Built:
    """images.tar.gz (images/<id>.jpg) and annotations.tar.gz (trainval.txt, test.txt)."""
    breeds = ["Abyssinian", "american_bulldog", "great_pyrenees"]
    rows = {"trainval": [], "test": []}
    images = {}
    for k, breed in enumerate(breeds):
        for i in range(1, 6):
            image_id = f"{breed}_{i}"
            images[image_id] = jpeg(10 * k + i)
            rows["test" if i > 3 else "trainval"].append((image_id, k + 1))
    header = "#Image CLASS-ID SPECIES BREED ID\n"

    def listing(entries: list[tuple[str, int]]) -> bytes:
        return (header + "".join(f"{i} {c} 1 {c}\n" for i, c in entries)).encode()

    image_members = {f"images/{i}.jpg": data for i, data in images.items()}
    image_members["images/Abyssinian_1.mat"] = b"not an image"
    annotations = {
        "annotations/trainval.txt": listing(rows["trainval"]),
        "annotations/test.txt": listing(rows["test"]),
        "annotations/list.txt": b"# other list\n",
    }
    blobs = {
        "images.tar.gz": tar_bytes(image_members),
        "annotations.tar.gz": tar_bytes(annotations),
    }
    return Built(blobs, {"rows": rows, "images": images})


# --- ImageNet val ------------------------------------------------------------------------


@dataclass
class ImageNetVal:
    """A tiny ImageNet val set: wnid and bytes per ILSVRC2012_val_<n>.JPEG."""

    wnids: list[str]
    labels: dict[str, str]  # file name -> wnid
    images: dict[str, bytes]  # file name -> bytes

    def manifest(self) -> list[str]:
        """Every image as <wnid>/<file>, sorted by (wnid, file name)."""
        return sorted(f"{self.labels[f]}/{f}" for f in self.images)


def imagenet_val(n_classes: int = 5, per_class: int = 4, seed: int = 0) -> ImageNetVal:
    """Classes with scattered numbers, images numbered in a shuffled class order."""
    rng = np.random.default_rng(seed)
    wnids = sorted({f"n{int(v):08d}" for v in rng.choice(10**8, size=n_classes, replace=False)})
    order = rng.permutation(np.repeat(np.arange(n_classes), per_class))
    labels, images = {}, {}
    for number, k in enumerate(order, start=1):
        name = f"ILSVRC2012_val_{number:08d}.JPEG"
        labels[name], images[name] = wnids[k], jpeg(number)
    return ImageNetVal(wnids, labels, images)


def write_val_folder(val: ImageNetVal, root: Path) -> Path:
    """root/val/<wnid>/<file>, plus a stray non-wnid folder that must be ignored."""
    for name, data in val.images.items():
        target = root / "val" / val.labels[name] / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    (root / "val" / "README").mkdir()
    return root


def write_official(val: ImageNetVal, folder: Path, *, devkit: bool = True) -> Path:
    """ILSVRC2012_img_val.tar (flat) and, beside it, the devkit with meta.mat + ground truth."""
    from scipy.io import savemat

    folder.mkdir(parents=True, exist_ok=True)
    val_tar = folder / "ILSVRC2012_img_val.tar"
    val_tar.write_bytes(tar_bytes(dict(sorted(val.images.items())), "w"))
    if devkit:
        # ILSVRC2012_IDs in an order unrelated to the wnid order, plus a non-leaf synset.
        ids = {wnid: k + 1 for k, wnid in enumerate(reversed(val.wnids))}
        dtype = [("ILSVRC2012_ID", "O"), ("WNID", "O"), ("words", "O"), ("num_children", "O")]
        synsets = np.array(
            [(ids[w], w, f"words {w}", 0) for w in val.wnids]
            + [(len(ids) + 1, "n99999999", "a parent", 3)],
            dtype=dtype,
        )
        meta = io.BytesIO()
        savemat(meta, {"synsets": synsets})
        truth = "".join(f"{ids[val.labels[name]]}\n" for name in sorted(val.images))
        members = {
            "ILSVRC2012_devkit_t12/data/meta.mat": meta.getvalue(),
            "ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt": truth.encode(),
        }
        (folder / "ILSVRC2012_devkit_t12.tar.gz").write_bytes(tar_bytes(members))
    return val_tar


def write_hf(val: ImageNetVal, folder: Path) -> Path:
    """val_images.tar.gz with ILSVRC2012_val_<n>_<wnid>.JPEG members."""
    folder.mkdir(parents=True, exist_ok=True)
    members = {
        f"{name.removesuffix('.JPEG')}_{val.labels[name]}.JPEG": data
        for name, data in val.images.items()
    }
    path = folder / "val_images.tar.gz"
    path.write_bytes(tar_bytes(members))
    return path


def registry_override(server: FileServer, built: Built) -> dict[str, RemoteFile]:
    """Serve every file of ``built``; the registry entries pointing at this server."""
    assert set(built.blobs) <= set(FILES), "test archives must use registry file names"
    return {name: server.remote(name, data) for name, data in built.blobs.items()}
