"""The commands .ci/readme_commands.sh runs in a fresh clone and a fresh shell (CI, after
`make test`) are the README's own: each one is written in README.md, so that the check cannot
drift from what a user reads."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from snakemake.cli import get_argument_parser

from tests.helpers.repo import REPO


def script_commands() -> list[str]:
    script = (REPO / ".ci/readme_commands.sh").read_text()
    block = script[script.index("README_COMMANDS=(") : script.index("\n)\n")]
    return re.findall(r'^\s+"([^"]+)"$', block, re.M)


def test_the_ci_check_runs_the_readmes_commands() -> None:
    readme = " ".join((REPO / "README.md").read_text().split())
    commands = script_commands()
    assert len(commands) == 4
    assert commands[0] == "source .venv/bin/activate"
    assert any("--report" in command for command in commands)
    for command in commands:
        assert command in readme, f"{command!r} is not in README.md"


def test_ci_runs_the_readme_check() -> None:
    assert ".ci/readme_commands.sh" in (REPO / ".ci/run").read_text()


def test_the_readmes_slurm_demo_is_what_snakemake_reads() -> None:
    """--configfile takes every name up to the next option: the README's SLURM demo names the
    demo preset, then the profile, then the target (the preset that unpacks the runs is named
    in words, after demo.yaml)."""
    readme = " ".join((REPO / "README.md").read_text().split())
    (command,) = re.findall(r"`(snakemake [^`]*--profile slurm[^`]*)`", readme)
    parsed = get_argument_parser().parse_args(shlex.split(command)[1:])
    assert parsed.configfile == [Path("config/demo.yaml")], command
    assert parsed.profile == ["slurm"] and parsed.targets == ["all"], command
    assert "`config/demo_slurm.yaml` after `demo.yaml`" in readme
    assert (REPO / "config/demo_slurm.yaml").is_file()
