"""Every caption of the Snakemake report (workflow/report/*.rst) renders without a docutils
error or warning, the way ``snakemake --report`` renders it: Jinja2 with the report's
settings (``trim_blocks``, ``lstrip_blocks``), the report's link targets appended, then
docutils ``publish_parts`` to HTML. A docutils problem there does not fail the report: it is
printed into the caption (an "Undefined substitution referenced" box), so only this test
sees it."""

from __future__ import annotations

import io
import textwrap
from collections import namedtuple
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from docutils.core import publish_parts
from docutils.utils import SystemMessage
from jinja2 import Environment
from snakemake.report import __file__ as report_module

from tests.helpers.repo import REPO

Category = namedtuple("Category", "name")
CAPTIONS = sorted((REPO / "workflow" / "report").glob("*.rst"))


class Wildcards(SimpleNamespace):
    """Any wildcard a caption names, with its own name as value."""

    def __getattr__(self, name: str) -> str:
        return f"<{name}>"


def report_links() -> str:
    """The link targets snakemake appends to each caption (``rst_links`` of its report),
    read from the installed snakemake so the test follows its version."""
    source = Path(report_module).read_text()
    start = source.index('rst_links = textwrap.dedent("""') + len('rst_links = textwrap.dedent("""')
    return textwrap.dedent(source[start : source.index('""")', start)])


def test_the_report_links_are_found():
    assert ".. _Workflow:" in report_links()


@pytest.mark.parametrize("demo", [False, True], ids=["paper", "demo"])
@pytest.mark.parametrize("caption", CAPTIONS, ids=[p.name for p in CAPTIONS])
def test_caption_renders_without_docutils_messages(caption, demo):
    config = {**yaml.safe_load((REPO / "config/config.yaml").read_text()), "demo": demo}
    snakemake = SimpleNamespace(wildcards=Wildcards(), config=config)
    category = Category("Tables")  # the report sorts categories: hashable and ordered
    text = (
        Environment(trim_blocks=True, lstrip_blocks=True)
        .from_string(caption.read_text() + report_links())
        .render(
            snakemake=snakemake,
            categories={category: {}},
            files=[SimpleNamespace(target="x.pdf", path="results/x.pdf")],
        )
    )
    warnings = io.StringIO()
    try:
        publish_parts(
            text,
            writer="html",  # what snakemake gives as writer_name (deprecated spelling)
            # halt on any warning (level 2) instead of printing it into the caption
            settings_overrides={"halt_level": 2, "report_level": 2, "warning_stream": warnings},
        )
    except SystemMessage as message:
        pytest.fail(f"{caption.name}: {message}")
    assert warnings.getvalue() == "", warnings.getvalue()
