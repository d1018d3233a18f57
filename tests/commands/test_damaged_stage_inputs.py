"""Every file a stage reads ends in one clear error when it is damaged: the file, the member
inside an archive, what is wrong, and the remedy that fits where the file came from (the
user's ImageNet copy is replaced; what the workflow wrote is deleted and made again). Each
case builds the real file and then damages it (truncated, an HTML page, a member missing or
of the wrong format, a table of another kind); nothing may be left half-written."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cli_errors import refusal
from tests.helpers.damaged_files import (
    HTML,
    HTML_HINT,
    TRUNCATED_JPEG,
    assert_message,
    half,
    html,
    retar,
    tar_members,
)
from tests.helpers.fixtures_data import (
    imagenet_val,
    md5_of,
    pet_archive,
    running_server,
    write_hf,
    write_official,
    write_val_folder,
)
from tests.helpers.report_inputs import write_grid
from vitplasticity import cli
from vitplasticity.data.archives import DamagedFileError
from vitplasticity.data.imagenet import imagenet_reference

IMAGENET_REMEDY = (
    "this is your local file from config paths.imagenet (or VITPLASTICITY_IMAGENET): "
    "replace it; it is never downloaded"
)


# --- ImageNet val -------------------------------------------------------------------------
#
# One row per damaged file of the user's ImageNet val copy: how it is damaged (the builder
# writes a val set in one layout and damages it; it returns the path to read, the file and
# member the error names, and what it says). These read the set in-process: the CLI refuses
# a val set of other than 50,000 images by its count before it decodes any image.

DEVKIT = "ILSVRC2012_devkit_t12.tar.gz"
GROUND_TRUTH = "ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt"


@dataclass(frozen=True)
class Read:
    """What reading a damaged val set must report."""

    path: Path  # what the reference set is read from
    culprit: Path
    says: str
    member: str | None = None


def truncated_hf_tar(val, tmp_path: Path) -> Read:
    path = write_hf(val, tmp_path)
    path.write_bytes(half(path.read_bytes()))
    return Read(path, path, "corrupted or truncated archive")


def html_page_as_hf_tar(val, tmp_path: Path) -> Read:
    path = tmp_path / "val_images.tar.gz"
    path.write_bytes(HTML)
    return Read(tmp_path, path, HTML_HINT)


def truncated_official_tar(val, tmp_path: Path) -> Read:
    path = write_official(val, tmp_path)
    path.write_bytes(half(path.read_bytes()))
    return Read(path, path, "corrupted or truncated archive")


def damaged_devkit(val, tmp_path: Path, damage: Callable[[bytes], bytes]) -> tuple[Path, Path]:
    path = write_official(val, tmp_path)
    devkit = tmp_path / DEVKIT
    devkit.write_bytes(damage(devkit.read_bytes()))
    return path, devkit


def html_page_as_devkit(val, tmp_path: Path) -> Read:
    return Read(*damaged_devkit(val, tmp_path, html), HTML_HINT)


def devkit_without_ground_truth(val, tmp_path: Path) -> Read:
    path, devkit = damaged_devkit(val, tmp_path, lambda d: retar(d, drop="ground_truth.txt"))
    return Read(
        path,
        devkit,
        "expected one member 'data/ILSVRC2012_validation_ground_truth.txt', found 0",
    )


def devkit_meta_not_a_mat_file(val, tmp_path: Path) -> Read:
    path, devkit = damaged_devkit(
        val, tmp_path, lambda d: retar(d, meta_mat=b"MATLAB 5.0" + bytes(40))
    )
    member = "ILSVRC2012_devkit_t12/data/meta.mat"
    return Read(path, devkit, "not a readable MATLAB .mat file", member)


def devkit_ground_truth_too_short(val, tmp_path: Path) -> Read:
    def shorten(data: bytes) -> bytes:
        short = b"\n".join(tar_members(data)[GROUND_TRUTH].split()[:-1])
        return retar(data, ILSVRC2012_validation_ground_truth_txt=short)

    path, devkit = damaged_devkit(val, tmp_path, shorten)
    says = f"its ground truth has 5 labels, none for ILSVRC2012_val_00000006.JPEG of {path}"
    return Read(path, devkit, says)


def undecodable_image_in_a_folder(val, tmp_path: Path) -> Read:
    root = write_val_folder(val, tmp_path)
    name = sorted(val.images)[0]
    bad = root / "val" / val.labels[name] / name
    bad.write_bytes(HTML)
    return Read(root, bad, "not a decodable image (Unsupported")


def undecodable_image_in_the_hf_tar(val, tmp_path: Path) -> Read:
    path = write_hf(val, tmp_path)
    member = next(n for n in tar_members(path.read_bytes()) if "_00000004_" in n)
    path.write_bytes(retar(path.read_bytes(), **{member.replace(".", "_"): TRUNCATED_JPEG}))
    return Read(path, path, "not a decodable image (Image is incomplete or truncated)", member)


IMAGENET_DAMAGES = [
    truncated_hf_tar,
    html_page_as_hf_tar,
    truncated_official_tar,
    html_page_as_devkit,
    devkit_without_ground_truth,
    devkit_meta_not_a_mat_file,
    devkit_ground_truth_too_short,
    undecodable_image_in_a_folder,
    undecodable_image_in_the_hf_tar,
]


@pytest.fixture(scope="module")
def val():
    return imagenet_val(n_classes=3, per_class=2)


@pytest.mark.parametrize("build", IMAGENET_DAMAGES, ids=[b.__name__ for b in IMAGENET_DAMAGES])
def test_imagenet_reference_names_the_damaged_file(build, val, tmp_path):
    case = build(val, tmp_path)
    with pytest.raises(DamagedFileError) as error:
        imagenet_reference(case.path, n_images=6, expected=None)
    assert_message(
        str(error.value), case.culprit, IMAGENET_REMEDY, member=case.member, says=case.says
    )


# --- every file a stage reads, through the CLI --------------------------------------------
#
# One row per damaged file: how to damage it (the row's builder writes the inputs and damages
# one), which command reads it, and the words its one error line must hold. Each runs
# ``vitplasticity`` in-process: exit status 2, exactly one ERROR line naming the file (and
# member) with the remedy at its end, no exception escaping (no traceback), no output written.


@dataclass(frozen=True)
class CliCase:
    """A command run on one damaged input, and what its error line must say."""

    argv: list[str]
    culprit: Path | str  # the file (or URL, or config key) the error names
    says: str  # what is wrong
    remedy: str  # how the line ends
    outputs: Path  # the folder the command writes into: must stay empty
    member: str | None = None


@dataclass(frozen=True)
class Inputs:
    """What the builders start from: a prepared store, the tiny model, a file server."""

    store: Path
    model_spec: str
    server: Any
    pet: dict[str, bytes]


def store_copy(inputs: Inputs, tmp_path: Path) -> Path:
    copy = tmp_path / "store" / "demo"
    shutil.copytree(inputs.store, copy)
    return copy


def store_remedy(store: Path) -> str:
    return f"delete the folder {store} and rerun: the workflow prepares it again"


def finetune_argv(inputs: Inputs, store: Path, out: Path) -> list[str]:
    return [
        "finetune", "--experiment", "sgd", "--model", "tiny", "--dataset", "demo",
        "--model-spec", inputs.model_spec, "--dataset-dir", str(store),
        "--configuration", "mha", "--lr", "0.05", "--seed", "0", "--out-dir", str(out),
        "--steps", "2", "--val-every", "1", "--batch-size", "8", "--micro-batch-size", "4",
        "--precision", "fp32", "--device", "cpu", "--num-workers", "0",
    ]  # fmt: skip


def corrupt_column(path: Path, column: str) -> None:
    """Flip 8 bytes in the middle of ``column``'s compressed chunk in Parquet file ``path``
    (the snappy stream: pyarrow then reads "Corrupt snappy compressed data")."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata.row_group(0)
    chunk = next(meta.column(i) for i in range(meta.num_columns)
                 if meta.column(i).path_in_schema == column)  # fmt: skip
    start = (
        chunk.dictionary_page_offset or chunk.data_page_offset
    ) + chunk.total_compressed_size // 2
    data = bytearray(path.read_bytes())
    data[start : start + 8] = bytes(b ^ 0xFF for b in data[start : start + 8])
    path.write_bytes(bytes(data))


def store_parquet_corrupted(inputs: Inputs, tmp_path: Path) -> CliCase:
    store = store_copy(inputs, tmp_path)
    corrupt_column(store / "pool.parquet", "label")
    out = tmp_path / "out"
    argv = ["reference", "--source", "dataset", "--dataset-dir", str(store), "--split", "pool"]
    argv += ["--n-images", "8", "--out", str(out / "reference.parquet")]
    return CliCase(
        argv,
        store / "pool.parquet",
        "not a readable Parquet file (OSError: Corrupt snappy compressed data.)",
        store_remedy(store),
        out,
    )


def rewrite_meta(store: Path, **changes: Any) -> None:
    meta = json.loads((store / "meta.json").read_text())
    (store / "meta.json").write_text(json.dumps({**meta, **changes}))


def store_meta_not_json(inputs: Inputs, tmp_path: Path) -> CliCase:
    store = store_copy(inputs, tmp_path)
    (store / "meta.json").write_text('{"num_classes": 4,')
    out = tmp_path / "out"
    return CliCase(
        finetune_argv(inputs, store, out / "run"),
        store / "meta.json",
        "not valid JSON (Expecting property name enclosed in double quotes: line 1 column 19",
        store_remedy(store),
        out,
    )


def store_meta_fewer_classes_than_labels(inputs: Inputs, tmp_path: Path) -> CliCase:
    store = store_copy(inputs, tmp_path)
    rewrite_meta(store, num_classes=2, class_names=["a", "b"])
    out = tmp_path / "out"
    return CliCase(
        finetune_argv(inputs, store, out / "run"),
        store / "meta.json",
        "num_classes 2, but pool.parquet has labels from 0 to 3 (a label must lie in 0..1)",
        store_remedy(store),
        out,
    )


def store_meta_num_classes_edited(inputs: Inputs, tmp_path: Path) -> CliCase:
    store = store_copy(inputs, tmp_path)
    rewrite_meta(store, num_classes=10)  # the store's 4 class names stay
    out = tmp_path / "out"
    return CliCase(
        finetune_argv(inputs, store, out / "run"),
        store / "meta.json",
        "num_classes 10 but 4 class_names",
        store_remedy(store),
        out,
    )


def reference_truncated(inputs: Inputs, tmp_path: Path) -> CliCase:
    reference = tmp_path / "reference.parquet"
    shutil.copy(inputs.store / "test.parquet", reference)
    reference.write_bytes(half(reference.read_bytes()))
    out = tmp_path / "out"
    argv = [
        "plasticity", "--model", "tiny", "--model-spec", inputs.model_spec,
        "--reference", str(reference), "--dataset-dir", str(inputs.store), "--n-pairs", "4",
        "--batch-size", "4", "--device", "cpu",
        "--out", str(out / "pairs.parquet"), "--summary", str(out / "summary.parquet"),
    ]  # fmt: skip
    return CliCase(
        argv,
        reference,
        "a truncated Parquet file (its footer is missing)",
        f"delete {reference} and rerun: the workflow builds the reference set again",
        out,
    )


def grid(tmp_path: Path) -> tuple[list[Path], Path, Path]:
    """Run summaries, and the runs and selected tables aggregated from them."""
    summaries = write_grid(tmp_path / "runs", datasets=("a", "b"), lrs=(0.01,), seeds=(0,))
    tables = tmp_path / "tables"
    runs, selected = tables / "runs.parquet", tables / "selected.parquet"
    argv = ["aggregate", "--experiment", "sgd", "--summaries", *map(str, summaries)]
    assert cli.main([*argv, "--runs-out", str(runs), "--selected-out", str(selected)]) == 0
    return summaries, runs, selected


def results_truncated(inputs: Inputs, tmp_path: Path) -> CliCase:
    _, runs, _ = grid(tmp_path)
    runs.write_bytes(runs.read_bytes()[:-100])
    out = tmp_path / "out"
    return CliCase(
        ["concat", "--inputs", str(runs), "--out", str(out / "all.parquet")],
        runs,
        "a truncated Parquet file (its footer is missing)",
        f"give runs tables (aggregate --runs-out); if the workflow wrote {runs}, delete it "
        "and rerun",
        out,
    )


def concat_of_a_text_file(inputs: Inputs, tmp_path: Path) -> CliCase:
    readme = tmp_path / "README.md"
    readme.write_text("# vitplasticity\n" * 20)
    out = tmp_path / "out"
    return CliCase(
        ["concat", "--inputs", str(readme), "--out", str(out / "all.parquet")],
        readme,
        "not a Parquet file (it starts with b'# vitplasticity\\n')",
        f"give runs tables (aggregate --runs-out); if the workflow wrote {readme}, delete it "
        "and rerun",
        out,
    )


def wilcoxon_table_of_a_selected_table(inputs: Inputs, tmp_path: Path) -> CliCase:
    _, _, selected = grid(tmp_path)
    out = tmp_path / "out"
    return CliCase(
        ["table", "--kind", "wilcoxon", "--inputs", str(selected), "--out", str(out / "w.tex")],
        selected,
        "not a comparison table (stats --out) (no column(s) reference, component, alternative",
        "give a comparison table (stats --out)",
        out,
    )


def summary_with_a_string_seed(inputs: Inputs, tmp_path: Path) -> CliCase:
    summaries = write_grid(tmp_path / "runs", datasets=("a", "b"), lrs=(0.01,), seeds=(0,))
    bad = summaries[3]
    bad.write_text(json.dumps({**json.loads(bad.read_text()), "seed": "zero"}))
    out = tmp_path / "out"
    argv = ["aggregate", "--experiment", "sgd", "--summaries", *map(str, summaries)]
    argv += ["--runs-out", str(out / "runs.parquet"), "--selected-out", str(out / "s.parquet")]
    return CliCase(
        argv,
        bad,
        'seed is "zero", not an integer',
        "it is written by the finetune job: delete it and rerun that run",
        out,
    )


def summary_not_json(inputs: Inputs, tmp_path: Path) -> CliCase:
    summaries = write_grid(tmp_path / "runs", datasets=("a",), lrs=(0.01,), seeds=(0,))
    summaries[0].write_bytes(half(summaries[0].read_bytes()))
    out = tmp_path / "out"
    argv = ["aggregate", "--experiment", "sgd", "--summaries", *map(str, summaries)]
    argv += ["--runs-out", str(out / "runs.parquet"), "--selected-out", str(out / "s.parquet")]
    return CliCase(
        argv,
        summaries[0],
        "not valid JSON",
        "it is written by the finetune job: delete it and rerun that run",
        out,
    )


def finetune_out_dir_is_a_file(inputs: Inputs, tmp_path: Path) -> CliCase:
    out = tmp_path / "out"
    out.mkdir()
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    return CliCase(
        finetune_argv(inputs, inputs.store, a_file),
        a_file,
        "a file, not a folder",
        "give a folder (it is created)",
        out,
    )


def config_checksum_wrong(inputs: Inputs, tmp_path: Path) -> CliCase:
    # The user's own digest is the wrong one: the error says it came from their config.
    data = inputs.pet["images.tar.gz"]
    inputs.server.files["/mirror/images.tar.gz"] = data
    out = tmp_path / "out"
    wrong = "md5:" + "0" * 32
    argv = [
        "download",
        "--file",
        "images.tar.gz",
        "--url",
        inputs.server.url("/mirror/images.tar.gz"),
    ]
    argv += ["--checksum", wrong, "--retries", "0", "--out", str(out / "images.tar.gz")]
    return CliCase(
        argv,
        inputs.server.url("/mirror/images.tar.gz"),
        f"checksum mismatch for {inputs.server.url('/mirror/images.tar.gz')}: expected md5 "
        f"{'0' * 32}, got {md5_of(data)}; the expected digest is yours, from --checksum (in "
        "the workflow: a datasets.<name>.checksums.images.tar.gz entry of your config)",
        "if the server's bytes are right, correct that digest; the downloaded file was deleted",
        out,
    )


def local_config_checksum_wrong(inputs: Inputs, tmp_path: Path) -> CliCase:
    folder = tmp_path / "mine"
    folder.mkdir()
    for name, data in inputs.pet.items():
        (folder / name).write_bytes(data)
    checksums = {name: f"md5:{md5_of(data)}" for name, data in inputs.pet.items()}
    checksums["images.tar.gz"] = "md5:" + "0" * 32  # a typo in the user's digest
    spec = {"source": "pet", "archive": str(folder), "checksums": checksums}
    out = tmp_path / "out"
    argv = ["prepare", "--dataset", "pets", "--spec", json.dumps(spec)]
    argv += ["--out", str(out / "pets"), "--downloads", str(tmp_path / "downloads")]
    return CliCase(
        argv,
        "datasets.pets.archive",
        f"checksum mismatch for {folder / 'images.tar.gz'}: expected md5 {'0' * 32} "
        "(images.tar.gz, from your config datasets.pets.checksums.images.tar.gz)",
        "(or, if these bytes are right, correct that digest)",
        out,
    )


CLI_CASES = [
    store_parquet_corrupted,
    store_meta_not_json,
    store_meta_fewer_classes_than_labels,
    store_meta_num_classes_edited,
    reference_truncated,
    results_truncated,
    concat_of_a_text_file,
    wilcoxon_table_of_a_selected_table,
    summary_with_a_string_seed,
    summary_not_json,
    finetune_out_dir_is_a_file,
    config_checksum_wrong,
    local_config_checksum_wrong,
]


@pytest.fixture(scope="module")
def pet() -> dict[str, bytes]:
    """Oxford Pets' files, built in their real formats."""
    return pet_archive().blobs


@pytest.fixture
def inputs(demo_dataset, tiny_spec, pet):
    spec = {"timm_id": tiny_spec.timm_id, "weights": "random", "kwargs": tiny_spec.kwargs}
    with running_server() as server:
        yield Inputs(demo_dataset, json.dumps(spec), server, pet)


@pytest.mark.parametrize("build", CLI_CASES, ids=[case.__name__ for case in CLI_CASES])
def test_cli_names_the_damaged_file(build, inputs, tmp_path, caplog):
    case = build(inputs, tmp_path)
    message = refusal(case.argv, caplog, case.outputs)
    where = f"{case.culprit}, member {case.member}:" if case.member else f"{case.culprit}:"
    assert message.startswith(where) or f" {where}" in message, message
    assert case.says in message, message
    assert message.endswith(case.remedy), message
