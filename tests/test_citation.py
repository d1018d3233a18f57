"""CITATION.cff is valid Citation File Format 1.2.0 (its required keys, no key the format does not
define), its version is the package's (pyproject.toml), so a release cannot forget it, and the
README's BibTeX cites the same paper as its preferred-citation."""

from __future__ import annotations

import re
import tomllib

import yaml

from tests.helpers.repo import REPO

# CFF 1.2.0's schema (https://citation-file-format.github.io, schema.json): the keys of the
# root and of a reference (preferred-citation is one), and which of them are required.
ROOT_KEYS = {
    "abstract", "authors", "cff-version", "commit", "contact", "date-released", "doi",
    "identifiers", "keywords", "license", "license-url", "message", "preferred-citation",
    "references", "repository", "repository-artifact", "repository-code", "title", "type",
    "url", "version",
}  # fmt: skip
ROOT_REQUIRED = {"authors", "cff-version", "message", "title"}
REFERENCE_KEYS = {
    "abbreviation", "abstract", "authors", "collection-doi", "collection-title",
    "collection-type", "commit", "conference", "contact", "copyright", "data-type", "database",
    "database-provider", "date-accessed", "date-downloaded", "date-published", "date-released",
    "department", "doi", "edition", "editors", "editors-series", "end", "entry", "filename",
    "format", "identifiers", "institution", "isbn", "issn", "issue", "issue-date", "issue-title",
    "journal", "keywords", "languages", "license", "license-url", "loc-end", "loc-start",
    "location", "medium", "month", "nihmsid", "notes", "number", "number-volumes", "pages",
    "patent-states", "pmcid", "publisher", "recipients", "repository", "repository-artifact",
    "repository-code", "scope", "section", "senders", "start", "status", "term", "thesis-type",
    "title", "translators", "type", "url", "version", "volume", "volume-title", "year",
    "year-original",
}  # fmt: skip
REFERENCE_REQUIRED = {"authors", "title", "type"}
PERSON_KEYS = {
    "address", "affiliation", "alias", "city", "country", "email", "family-names", "fax",
    "given-names", "name-particle", "name-suffix", "orcid", "post-code", "region", "tel",
    "website",
}  # fmt: skip
ENTITY_KEYS = {
    "address", "alias", "city", "country", "date-end", "date-start", "email", "fax", "location",
    "name", "orcid", "post-code", "region", "tel", "website",
}  # fmt: skip


def citation() -> dict:
    return yaml.safe_load((REPO / "CITATION.cff").read_text())


def check_authors(authors: list[dict], where: str) -> None:
    """Each author a person (family and given names) or an entity (a name), with its keys only."""
    assert authors, f"{where}: no authors"
    for author in authors:
        keys = PERSON_KEYS if "family-names" in author else ENTITY_KEYS
        assert set(author) <= keys, f"{where}: {sorted(set(author) - keys)} in {author}"
        assert author.get("name") or (author.get("family-names") and author.get("given-names"))


def test_citation_is_cff_1_2_0_with_its_required_keys_only() -> None:
    cff = citation()
    assert cff["cff-version"] == "1.2.0"
    assert ROOT_REQUIRED <= set(cff) <= ROOT_KEYS, sorted(set(cff) - ROOT_KEYS)
    assert cff["type"] in ("software", "dataset")
    check_authors(cff["authors"], "authors")
    paper = cff["preferred-citation"]
    assert REFERENCE_REQUIRED <= set(paper) <= REFERENCE_KEYS, sorted(set(paper) - REFERENCE_KEYS)
    assert paper["type"] == "conference-paper"
    check_authors(paper["authors"], "preferred-citation.authors")


def test_citation_version_is_the_packages() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert str(citation()["version"]) == project["version"]


def test_readme_bibtex_cites_the_preferred_citation() -> None:
    readme = (REPO / "README.md").read_text()
    (entry,) = re.findall(r"```bibtex\n(@inproceedings\{.*?\n\})\n```", readme, re.S)
    fields = dict(re.findall(r"^\s+(\w+)\s*=\s*\{(.*)\},?$", entry, re.M))
    paper = citation()["preferred-citation"]
    assert fields["title"] == paper["title"]
    names = [f"{a['family-names']}, {a['given-names']}" for a in paper["authors"]]
    assert fields["author"].split(" and ") == names
    assert fields["booktitle"] == paper["collection-title"]
    assert fields["publisher"] == paper["publisher"]["name"]
    assert (int(fields["volume"]), int(fields["year"])) == (paper["volume"], paper["year"])
    arxiv = [i["value"] for i in paper["identifiers"] if i["value"].startswith("arXiv:")]
    assert arxiv == [f"arXiv:{fields['eprint']}"] and fields["archivePrefix"] == "arXiv"
    assert paper["url"] == f"https://arxiv.org/abs/{fields['eprint']}"
