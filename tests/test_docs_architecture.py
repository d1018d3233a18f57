"""docs/architecture.md's package tree is the package as ``ls`` shows it: every folder with
every module in it, nothing more, nothing less; and every folder of the tree is a layer of
tests/test_import_layers.py (the folders are the layers)."""

from __future__ import annotations

import re

from tests.helpers.repo import REPO

PACKAGE = REPO / "src" / "vitplasticity"
DOC = REPO / "docs" / "architecture.md"
LAYERS_TEST = REPO / "tests" / "test_import_layers.py"


def documented_tree(text: str) -> dict[str, set[str]]:
    """The modules the doc's package tree lists, by folder ("" for the package's root).

    The tree is the code block that opens with ``src/vitplasticity/``: a line ``  name/ m1 m2``
    names a folder (its depth by indent, two spaces a level) and its modules without ``.py``
    (``__init__`` left out: every folder has one); a line of names alone, indented deeper,
    continues the folder above it; the first line of names is the root's modules."""
    block = re.search(r"```\nsrc/vitplasticity/\n(.*?)```", text, re.S)
    assert block, f"{DOC}: no code block opening with src/vitplasticity/"
    tree: dict[str, set[str]] = {"": set()}
    stack: list[tuple[int, str]] = []  # (indent, folder path) of the open folders
    current = ""
    for line in block.group(1).splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        words = line.split()
        if words[0].endswith("/"):
            while stack and stack[-1][0] >= indent:
                stack.pop()
            parent = stack[-1][1] if stack else ""
            current = f"{parent}/{words[0][:-1]}".lstrip("/")
            stack.append((indent, current))
            tree[current] = set(words[1:])
        else:
            tree[current] |= set(words)
    return tree


def package_tree() -> dict[str, set[str]]:
    """The package's folders and their modules, as on disk (``__init__`` left out)."""
    tree: dict[str, set[str]] = {}
    for init in sorted(PACKAGE.rglob("__init__.py")):
        folder = init.parent
        if "__pycache__" in folder.parts:
            continue
        key = "/".join(folder.relative_to(PACKAGE).parts)
        tree[key] = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    return tree


def test_the_tree_is_the_package() -> None:
    documented, actual = documented_tree(DOC.read_text()), package_tree()
    assert sorted(documented) == sorted(actual), "folders of docs/architecture.md's tree"
    differences = {
        folder: {
            "on disk, not in the doc": sorted(actual[folder] - documented[folder]),
            "in the doc, not on disk": sorted(documented[folder] - actual[folder]),
        }
        for folder in actual
        if actual[folder] != documented[folder]
    }
    assert not differences, f"docs/architecture.md's tree is not the package: {differences}"


def test_every_top_level_folder_is_a_layer_of_the_import_test() -> None:
    layers_source = LAYERS_TEST.read_text()
    folders = {key for key in package_tree() if key and "/" not in key}
    unlisted = sorted(f for f in folders if f'"{f}"' not in layers_source)
    assert not unlisted, (
        f"folders that tests/test_import_layers.py's LAYERS do not name: {unlisted}"
    )


def test_the_reader_reads_folders_continuations_and_the_root() -> None:
    text = (
        "```\nsrc/vitplasticity/\n  cli version\n  models/ build spec\n    lora\n"
        "    architectures/ base\n  utils/ io\n```\n"
    )
    assert documented_tree(text) == {
        "": {"cli", "version"},
        "models": {"build", "spec", "lora"},
        "models/architectures": {"base"},
        "utils": {"io"},
    }


def common_changes(text: str) -> list[tuple[str, list[str]]]:
    """(file, the names the doc says it holds) of every file the "Common changes" table
    names, in its files' column and its tests' column, placeholders (``<source>``) left out."""
    section = text.split("## Common changes", 1)[1].split("\n## ", 1)[0]
    found = []
    for files, tests in re.findall(r"\n\| [^|]+ \| ([^|]+) \| ([^|]*) \|", section):
        for path, names in re.findall(r"`([\w./<>-]+\.(?:py|yaml|md))`(?: \(([^)]*)\))?", files):
            if "<" not in path:
                found.append((path, re.findall(r"`(\w+)`", names)))
        found += [(path, []) for path in re.findall(r"`(tests/[\w./]+\.py)`", tests)]
    return found


def test_every_file_and_name_of_the_common_changes_exists() -> None:
    named = common_changes(DOC.read_text())
    assert len(named) >= 10, named
    for path, names in named:
        source = REPO / path
        assert source.is_file(), f"docs/architecture.md names {path}, which does not exist"
        text = source.read_text()
        for name in names:
            assert name in text, f"docs/architecture.md says {path} holds {name}; it does not"
