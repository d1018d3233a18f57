"""Why each failed job failed, on the console: Snakemake's error report of a job names its
log file but not what the log says (``message: None``); the workflow's ``onerror:`` handler
adds the last error line of each failed job's log. Plain Python: no torch import."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

# Snakemake's report of a failed job (or of a job of a failed group) in its log file.
_FAILED_RULE = re.compile(r"^(?:Error in rule|\s+rule) (\S+):$")
_JOB_LOGS = re.compile(r"^\s+log: (.+) \(check log file\(s\) for error details\)$")
# A record the vitplasticity command logs at ERROR (cli.py's format), and the last line of a
# Python traceback.
_LOGGED_ERROR = re.compile(r"^\S+ \S+ (?:ERROR|CRITICAL) \S+: (.+)$")
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b.*$")
# How much of a log's end is read: its error is at the end, and a finetuning log is long.
TAIL_BYTES = 64 * 1024


def failed_job_logs(snakemake_log: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """(rule, log file) of every failed job in the order Snakemake's log reports them."""
    try:
        lines = Path(snakemake_log).read_text(errors="replace").splitlines()
    except OSError:
        return []
    failed, rule = [], None
    for line in lines:
        if match := _FAILED_RULE.match(line):
            rule = match.group(1)
        elif (match := _JOB_LOGS.match(line)) and rule is not None:
            failed += [(rule, log) for log in match.group(1).split(", ")]
    return list(dict.fromkeys(failed))


def last_error_line(log: str | os.PathLike[str]) -> str:
    """The last error a job's log holds: its last ERROR record or exception line, else its
    last line (a shell's message, ``Killed``)."""
    try:
        with open(log, "rb") as file:
            file.seek(max(0, file.seek(0, os.SEEK_END) - TAIL_BYTES))
            lines = file.read().decode(errors="replace").splitlines()
    except OSError as error:
        return f"(its log cannot be read: {error.strerror})"
    lines = [line.strip() for line in lines if line.strip()]
    for line in reversed(lines):
        if match := _LOGGED_ERROR.match(line):
            return match.group(1)
        if _EXCEPTION.match(line):
            return line
    return lines[-1] if lines else "(its log is empty)"


def failed_jobs_report(snakemake_logs: Iterable[str | os.PathLike[str]]) -> str | None:
    """For each failed job of the run whose Snakemake log files are ``snakemake_logs``: its
    rule, log file and the last error line of its log, one line each; None when none failed."""
    failed = [job for log in snakemake_logs for job in failed_job_logs(log)]
    if not failed:
        return None
    lines = [f"  {rule} ({log}): {last_error_line(log)}" for rule, log in failed]
    return "Why each failed job failed (the last error line of its log):\n" + "\n".join(lines)


def report_failed_jobs(snakemake_logs: str | list[str]) -> None:
    """The ``onerror:`` handler: log :func:`failed_jobs_report` on the console.

    Args:
        snakemake_logs: what Snakemake passes the handler as ``log``: its log file(s).
    """
    from snakemake.logging import logger

    logs = [snakemake_logs] if isinstance(snakemake_logs, str) else list(snakemake_logs)
    report = failed_jobs_report(logs)
    if report:
        logger.error(report)
