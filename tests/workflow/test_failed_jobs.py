"""The last error line of a failed job's log, and the failed jobs a Snakemake log reports
(tests/pipeline/test_failed_job_message.py shows them on the console, end to end)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vitplasticity.workflow.failed_jobs import failed_job_logs, failed_jobs_report, last_error_line

TRACEBACK = "Traceback (most recent call last):\n  File \"x.py\", line 1\nKeyError: 'cifar10'\n"
# (id, the log's text, its last error line)
LOGS = [
    (
        "a logged error",
        "2026-01-01 10:00:00,000 INFO vitplasticity: start\n"
        "2026-01-01 10:00:01,000 ERROR vitplasticity: cifar10.tar.gz: truncated\n",
        "cifar10.tar.gz: truncated",
    ),
    ("a traceback", f"step 1\n{TRACEBACK}", "KeyError: 'cifar10'"),
    ("a killed process", "step 1\nstep 2\nKilled\n\n", "Killed"),
    ("an empty log", "", "(its log is empty)"),
]


@pytest.mark.parametrize(("text", "line"), [c[1:] for c in LOGS], ids=[c[0] for c in LOGS])
def test_the_last_error_line_of_a_log(tmp_path: Path, text: str, line: str) -> None:
    (tmp_path / "job.log").write_text(text)
    assert last_error_line(tmp_path / "job.log") == line


def test_a_missing_log_is_said(tmp_path: Path) -> None:
    assert (
        last_error_line(tmp_path / "none.log")
        == "(its log cannot be read: No such file or directory)"
    )


def test_the_failed_jobs_of_a_snakemake_log_and_of_a_group(tmp_path: Path) -> None:
    (tmp_path / "a.log").write_text("ERROR: no\n")
    snakemake_log = tmp_path / "snakemake.log"
    snakemake_log.write_text(
        "Error in rule prepare:\n    jobid: 1\n"
        f"    log: {tmp_path}/a.log (check log file(s) for error details)\n"
        "Error in group pack:\n    jobs:\n        rule finetune:\n            jobid: 2\n"
        "            log: b.log, c.log (check log file(s) for error details)\n"
    )
    logs = [("prepare", f"{tmp_path}/a.log"), ("finetune", "b.log"), ("finetune", "c.log")]
    assert failed_job_logs(snakemake_log) == logs
    report = failed_jobs_report([snakemake_log])
    assert f"  prepare ({tmp_path}/a.log): ERROR: no" in report
    assert failed_jobs_report([tmp_path / "a.log"]) is None
