"""A subcommand that became a flag of another stops with what to write instead; the one
finetune and criteria commands take an image or a text experiment's input, and a flag of the
other kind is refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from vitplasticity import cli

REMOVED = [
    ("finetune-text", "vitplasticity finetune --text <file>"),
    ("text-plasticity", "vitplasticity plasticity --text <downstream text file> --reference"),
    ("text-bounds", "vitplasticity bounds --text <reference text file>"),
    ("recommend-text", "vitplasticity recommend --text <files> --reference <text file>"),
    ("text-criteria", "vitplasticity criteria --runs <summary.json files> --experiment <name>"),
]


@pytest.mark.parametrize(("command", "instead"), REMOVED)
def test_a_removed_subcommand_says_what_to_write_instead(
    command: str, instead: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert set(cli.REMOVED_COMMANDS) == {row[0] for row in REMOVED}
    assert cli.main([command, "--model", "m", "--text", "t.txt"]) == 2
    err = capsys.readouterr().err
    assert f"the {command} subcommand is removed; write {instead}" in err
    assert "Traceback" not in err


def test_a_text_flag_with_an_image_dataset_is_refused_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    argv = [
        "finetune", "--experiment", "e", "--model", "m", "--dataset", "d",
        "--model-spec", "{}", "--dataset-dir", str(tmp_path), "--configuration", "mha",
        "--lr", "0.1", "--seed", "0", "--out-dir", str(tmp_path / "run"),
        "--steps", "2", "--val-every", "1",
        "--sequence-length", "64",
    ]  # fmt: skip
    assert cli.main(argv) == 2
    assert (
        "finetune: --sequence-length goes with --text or --labelled-text (a text dataset's"
        in caplog.text
    )
    assert not (tmp_path / "run").exists()


def test_the_data_is_one_of_a_folder_or_a_text_file(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["finetune", "--experiment", "e", "--model", "m", "--dataset", "d",
                  "--model-spec", "{}", "--dataset-dir", "x", "--text", "y"])  # fmt: skip
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--runs", "a.json", "--out", "o.parquet"], "criteria --runs: --experiment, --selected-out, --markdown required"),
        (["--selected", "s.parquet", "--markdown", "m.md", "--out", "o.parquet"], "criteria: --markdown goes with --runs"),
    ],
)  # fmt: skip
def test_the_criteria_command_takes_an_image_or_a_text_experiment_not_half_of_one(
    flags: list[str], message: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert cli.main(["criteria", *flags]) == 2
    assert message in caplog.text


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--text", "t.txt", "--reference", "r.txt", "--warmup-steps", "5"], "recommend: --warmup-steps goes with an image dataset"),
        (["--text", "t.txt", "--reference", "r.txt", "--timm-id", "vit_tiny_patch16_224"], "recommend: --timm-id goes with an image dataset"),
        (["--text", "t.txt"], "recommend --text: --reference required (a text model's)"),
        (["--dataset-dir", "d", "--reference-fallback", "synthetic", "--sequence-length", "64"], "recommend: --sequence-length goes with --text"),
        (["--dataset-dir", "d", "--reference-fallback", "synthetic", "--protocol", "in_situ"], "recommend: --protocol goes with --text"),
    ],
)  # fmt: skip
def test_the_recommend_command_takes_an_image_or_a_text_model_not_half_of_one(
    flags: list[str], message: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec = '{"family": "transformers", "hf_id": "tiny", "weights": "random"}'
    argv = ["recommend", "--model-spec", spec, *flags, "--out-prefix", str(tmp_path / "o")]
    assert cli.main(argv) == 2
    assert message in caplog.text
