"""``vitplasticity recommend-verify`` refuses a bad input with one error line, before it
writes anything: among them (issue 42) a budget too short to halve, a learning rate or seed
given twice, a ranking that is not recommend's or is another model's, an output prefix it
cannot write."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest

from tests.helpers.cli_errors import refusal
from tests.helpers.rankings import ranking_file
from tests.helpers.repo import REPO
from vitplasticity import cli
from vitplasticity.commands import verify as verify_command
from vitplasticity.models.spec import TimmSpec


def argv(tmp_path: Path, spec: TimmSpec, **flags: str) -> list[str]:
    ranking = ranking_file(
        tmp_path / "ranking.parquet", [("mha", "plasticity", 1)], "tiny", dataclasses.asdict(spec)
    )
    values = {
        "ranking": str(ranking),
        "model": "tiny",
        "dataset": "demo-stripes",
        "dataset-dir": str(tmp_path / "data"),
        "lrs": "0.01",
        "runs-dir": str(tmp_path / "out" / "runs"),
        "out-prefix": str(tmp_path / "out" / "demo"),
        "model-spec": json.dumps(dataclasses.asdict(spec)),
        "steps": "12",
        "val-every": "3",
        **flags,
    }
    args = ["recommend-verify"]
    for key, value in values.items():
        args += [f"--{key}", *(value.split() if key in ("lrs", "seeds") else [value])]
    return args


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        ({"criterion": "snr"}, "'snr' is not in the ranking"),
        ({"top-k": "0"}, "top_k: must be >= 1"),
        ({"eta": "1"}, "eta: must be >= 2"),
        ({"lrs": "0.01 -1"}, "--lrs"),
        ({"budget": "lots"}, "budget 'lots'"),
        ({"ranking": "/nonexistent/r.parquet"}, "--ranking /nonexistent/r.parquet"),
    ],
)
def test_a_bad_input_is_refused_naming_it(
    tmp_path: Path, tiny_spec: TimmSpec, caplog, flags: dict, named: str
) -> None:
    message = refusal(argv(tmp_path, tiny_spec, **flags), caplog, outputs=tmp_path / "out")
    assert named in message


def test_the_cli_hands_recommend_verify_to_its_command(tmp_path: Path, tiny_spec: TimmSpec) -> None:
    args = cli.build_parser().parse_args(argv(tmp_path, tiny_spec, lrs="0.01 0.1", seeds="0 42"))
    assert args.handler is verify_command.run_verify
    assert (args.lrs, args.seeds, args.top_k, args.eta) == ([0.01, 0.1], [0, 42], 2, 2)
    assert "recommend-verify" in cli.GPU_COMMANDS  # takes a GPU slot of its own, as finetune


# --- issue 42: what recommend-verify refuses before it trains, one row per case --------------


def deeper(spec: TimmSpec) -> str:
    """The same ViT one block deeper: another model than the one ranked."""
    kwargs = {**spec.kwargs, "depth": spec.kwargs.get("depth", 3) + 1}
    return json.dumps(dataclasses.asdict(dataclasses.replace(spec, kwargs=kwargs)))


def swin(spec: TimmSpec) -> str:
    """A Swin: another family of model than the one ranked."""
    return json.dumps({"timm_id": "swin_tiny_patch4_window7_224", "weights": "random"})


def plain_parquet(tmp_path: Path) -> str:
    """recommend's columns without its footer (no record of the model it ranked)."""
    path = tmp_path / "plain.parquet"
    pl.DataFrame(
        {"configuration": ["mha"], "criterion": ["plasticity"], "rank": [1]}
    ).write_parquet(path)
    return str(path)


def other_table(tmp_path: Path) -> str:
    """A Parquet file that is not a ranking."""
    path = tmp_path / "other.parquet"
    pl.DataFrame({"step": [1], "loss": [0.5]}).write_parquet(path)
    return str(path)


def under_a_file(tmp_path: Path) -> str:
    """An output prefix whose folder is a file: it cannot be made."""
    (tmp_path / "taken").write_text("a file\n")
    return str(tmp_path / "taken" / "demo")


# (flags over a sound verification of the tiny ViT: each a text, or made from (tmp_path,
# spec); what the one error line must say)
Flags = dict[str, str | Callable[..., str]]
ROWS: list = [
    pytest.param(
        {"lrs": "0.01 0.1", "steps": "12", "val-every": "12"},
        "--steps: 12 steps are too short to halve 2 learning rates (--lrs) with --eta 2",
        id="rung-longer-than-the-budget",
    ),
    pytest.param(
        {"lrs": "0.01 0.1", "eta": "8"},
        "give at least 24 steps, a smaller --val-every or --eta, or one learning rate",
        id="eta-too-large-for-the-budget",
    ),
    pytest.param(
        {"lrs": "0.001 0.003 0.01 0.03", "steps": "4", "val-every": "3"},
        "--steps: 4 steps are too short to halve 4 learning rates",
        id="four-lrs-on-a-short-run",
    ),
    pytest.param({"lrs": "0.01 0.1 0.01"}, "--lrs: 0.01 given more than once", id="duplicate-lrs"),
    pytest.param({"seeds": "0 0"}, "--seeds: give each seed once", id="duplicate-seeds"),
    pytest.param(
        {"ranking": str(REPO / "README.md")},
        "README.md: not a Parquet file",
        id="ranking-not-parquet",
    ),
    pytest.param(
        {"ranking": other_table},
        "other.parquet: no column(s) configuration, criterion, rank; --ranking takes "
        "recommend's PREFIX.parquet",
        id="ranking-another-table",
    ),
    pytest.param(
        {"ranking": plain_parquet},
        "plain.parquet: no record of the model it ranks in its footer",
        id="ranking-without-its-model",
    ),
    pytest.param(
        {"model-spec": deeper},
        "--model-spec: not the model --ranking",
        id="model-spec-another-depth",
    ),
    pytest.param({"model-spec": swin}, "--model-spec: not the model --ranking", id="swin"),
    pytest.param({"model": "other"}, "--model other: --ranking", id="model-another-name"),
    pytest.param(
        {"out-prefix": under_a_file}, "taken/demo_verified.md: Not a directory", id="out-prefix"
    ),
]


@pytest.mark.parametrize(("flags", "message"), ROWS)
def test_recommend_verify_refuses_before_training(
    tmp_path: Path,
    tiny_spec: TimmSpec,
    caplog: pytest.LogCaptureFixture,
    flags: Flags,
    message: str,
) -> None:
    values = {
        key: value if isinstance(value, str) else value(tmp_path)
        for key, value in flags.items()
        if key != "model-spec"
    }
    if "model-spec" in flags:
        values["model-spec"] = flags["model-spec"](tiny_spec)
    got = refusal(argv(tmp_path, tiny_spec, **values), caplog, outputs=tmp_path / "out")
    assert message in got
