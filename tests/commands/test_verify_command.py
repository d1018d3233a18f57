"""``vitplasticity recommend-verify`` refuses a bad input with one error line, before it
writes anything."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tests.helpers.cli_errors import refusal
from tests.helpers.rankings import ranking_file
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
