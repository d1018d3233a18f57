"""A subcommand that became a flag of another stops with what to write instead, and the one
finetune command takes images or text: a text flag given with an image dataset's folder is
refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from vitplasticity import cli

REMOVED = [("finetune-text", "vitplasticity finetune --text <file>")]


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
    assert "--sequence-length cut a text dataset (--text)" in caplog.text
    assert not (tmp_path / "run").exists()


def test_the_data_is_one_of_a_folder_or_a_text_file(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["finetune", "--experiment", "e", "--model", "m", "--dataset", "d",
                  "--model-spec", "{}", "--dataset-dir", "x", "--text", "y"])  # fmt: skip
    assert "not allowed with argument" in capsys.readouterr().err
