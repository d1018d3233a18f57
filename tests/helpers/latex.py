"""Compiling the report's LaTeX tables, as a paper would include them; tests that need a
LaTeX engine are skipped (naming the packages to install) where there is none."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

LATEX = shutil.which("pdflatex") or shutil.which("lualatex")
needs_latex = pytest.mark.skipif(
    LATEX is None,
    reason="no LaTeX engine (pdflatex/lualatex) installed: "
    "apt-get install texlive-latex-base texlive-latex-recommended",
)


def compile_tables(tmp_path: Path, tables: dict[str, str]) -> None:
    """Compile every table (name -> LaTeX) in one booktabs document; fail with the log."""
    for name, tex in tables.items():
        (tmp_path / f"{name}.tex").write_text(tex)
    inputs = "\n".join(rf"\input{{{name}.tex}}" for name in tables)
    (tmp_path / "doc.tex").write_text(
        "\\documentclass{article}\n\\usepackage{booktabs}\n\\begin{document}\n"
        f"{inputs}\n\\end{{document}}\n"
    )
    result = subprocess.run(
        [LATEX, "-interaction=nonstopmode", "-halt-on-error", "doc.tex"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert (tmp_path / "doc.pdf").stat().st_size > 1000
