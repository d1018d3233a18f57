"""The test suite's own layout.

Tests mirror src: a test module sits in the folder of the package it tests, tests/<package>/
for a package of src/vitplasticity (the modules it imports include that package's; for
tests/commands, ``vitplasticity.cli``, which runs the commands, counts; for tests/models,
``vitplasticity.provenance``), in tests/pipeline
when it tests the whole workflow (it runs Snakemake or reads what it runs: the helpers that
start it, or snakemake itself), or in tests/ itself when it tests what lies outside the
package (the schema, the docs, the benchmarks, the report's captions) or the suite. Each such
folder is a package (``__init__.py``): pytest would take two same-named modules of two
folders for one. tests/helpers holds no tests.

Test modules share code through tests/helpers/, never by importing one another or conftest.py
(pytest loads conftest itself; a test module that imports another also runs, or collects, that
module's module-level code and fixtures); and the repository's root is found in one place,
``tests.helpers.repo.REPO``, not from each module's own ``__file__``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.repo import REPO

TESTS = REPO / "tests"
PACKAGES = {path.parent.name for path in (REPO / "src/vitplasticity").glob("*/__init__.py")}
# What a whole-workflow test imports: the helpers that run Snakemake, or snakemake.
WORKFLOW_RUNNERS = (
    "snakemake",
    "tests.helpers.workflow",
    "tests.helpers.demo_workflow",
    "tests.helpers.slurm_harness",
)
# Modules of vitplasticity's root that, imported by a test, count as a package's: the CLI runs
# the commands; provenance is of the models layer (docs/architecture.md: it hashes the weights).
FRONT_DOORS = {"cli": "commands", "provenance": "models"}


def imported_modules(source: str, package: str) -> list[str]:
    """The dotted names of the modules a module's ``source`` imports, anywhere in it (a
    function's body too), its relative imports resolved against ``package``."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # from .x import y, from . import test_x
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{module}" if module else base
                if not node.module:
                    names += [f"{module}.{alias.name}" for alias in node.names]
                    continue
            names.append(module)
    return names


def forbidden(module: str) -> bool:
    """Whether ``module`` is a test module or conftest of this suite."""
    parts = module.split(".")
    return parts[0] == "tests" and any(
        part.startswith("test_") or part == "conftest" for part in parts[1:]
    )


def package_of(path: Path) -> str:
    """The dotted package of a file under tests/ (tests, tests.helpers)."""
    return ".".join(["tests", *path.parent.relative_to(TESTS).parts])


def test_no_test_module_imports_another_or_conftest() -> None:
    offenders = {
        f"{path.relative_to(TESTS.parent)} imports {module}"
        for path in sorted(TESTS.rglob("*.py"))
        for module in imported_modules(path.read_text(), package_of(path))
        if forbidden(module)
    }
    assert not offenders, "move what test modules share to tests/helpers/: " + "; ".join(
        sorted(offenders)
    )


def test_the_check_sees_every_form_of_import() -> None:
    """The forms the suite used: absolute, relative, in a function, and conftest."""
    source = (
        "from tests.pipeline.test_workflow import snakemake\n"
        "from .test_weights import FakeHub\n"
        "from . import test_tables\n"
        "from .conftest import TINY_SPEC\n"
        "import tests.workflow.test_config\n"
        "def f():\n"
        "    from tests.recommend.test_recommend import _image_folder\n"
        "from tests.helpers.tiny_models import TINY_MODELS\n"
        "from .helpers import tiny_models\n"
    )
    found = {module for module in imported_modules(source, "tests") if forbidden(module)}
    assert found == {
        "tests.pipeline.test_workflow",
        "tests.test_weights",
        "tests.test_tables",
        "tests.conftest",
        "tests.workflow.test_config",
        "tests.recommend.test_recommend",
    }


def packages_imported(source: str) -> set[str]:
    """The vitplasticity packages a module's ``source`` imports from (``import
    vitplasticity.data``, ``from vitplasticity.data.store import x``, ``from vitplasticity
    import data``), a :data:`FRONT_DOORS` module counted as its package."""
    packages = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for parts in (name.split(".") for name in names):
            if parts[0] == "vitplasticity" and len(parts) > 1:
                packages.add(FRONT_DOORS.get(parts[1], parts[1]))
    return packages


def misplaced(path: Path, source: str) -> str | None:
    """Why the test module at ``path`` (under tests/) is in the wrong folder; None if it is not."""
    folder = path.parent.relative_to(TESTS).parts
    if not folder:
        return None
    if folder == ("pipeline",):
        imported = imported_modules(source, package_of(path))
        runs = any(m == r or m.startswith(f"{r}.") for m in imported for r in WORKFLOW_RUNNERS)
        return None if runs else "runs no Snakemake: move it beside the package it tests"
    if len(folder) > 1 or folder[0] not in PACKAGES:
        return f"tests/{'/'.join(folder)} mirrors no package of src/vitplasticity"
    tested = packages_imported(source)
    if folder[0] not in tested:
        found = ", ".join(sorted(tested)) or "nothing of vitplasticity"
        return f"imports no vitplasticity.{folder[0]} (it imports {found})"
    return None


def test_every_test_module_sits_beside_the_package_it_tests() -> None:
    offenders = [
        f"{path.relative_to(REPO)}: {why}"
        for path in sorted(TESTS.rglob("test_*.py"))
        if (why := misplaced(path, path.read_text()))
    ]
    assert not offenders, "\n".join(offenders)


def test_the_placement_check_sees_each_misplacement() -> None:
    cases = {
        "data/test_a.py": ("from vitplasticity.data.store import x\n", None),
        "data/test_b.py": ("from vitplasticity import cli, data\n", None),
        "commands/test_c.py": ("from vitplasticity import cli\n", None),
        "pipeline/test_d.py": ("from tests.helpers.workflow import snakemake\n", None),
        "test_e.py": ("import yaml\n", None),
        "utils/test_f.py": ("from vitplasticity.commands.data import f\n", "imports no"),
        "pipeline/test_g.py": ("import yaml\n", "runs no Snakemake"),
        "nowhere/test_h.py": ("import vitplasticity.data\n", "mirrors no package"),
        "data/deep/test_i.py": ("import vitplasticity.data\n", "mirrors no package"),
    }
    for name, (source, why) in cases.items():
        found = misplaced(TESTS / name, source)
        assert (found is None) if why is None else (why in str(found)), (name, found)


def test_every_test_folder_is_a_package_and_helpers_holds_no_tests() -> None:
    folders = {path.parent for path in TESTS.rglob("test_*.py")}
    assert [f for f in folders if not (f / "__init__.py").is_file()] == []
    assert list((TESTS / "helpers").rglob("test_*.py")) == []


def finds_its_own_place(source: str) -> bool:
    """Whether a module's ``source`` reads its own ``__file__`` (to find the repository)."""
    return any(
        isinstance(node, ast.Name) and node.id == "__file__" for node in ast.walk(ast.parse(source))
    )


def test_the_repository_is_found_in_one_place() -> None:
    assert finds_its_own_place("REPO = Path(__file__).resolve().parents[1]\n")
    assert not finds_its_own_place("from snakemake.report import __file__ as report_module\n")
    offenders = [
        str(path.relative_to(REPO))
        for path in sorted(TESTS.rglob("*.py"))
        if path != TESTS / "helpers/repo.py" and finds_its_own_place(path.read_text())
    ]
    assert offenders == [], "use tests.helpers.repo.REPO in " + ", ".join(offenders)
