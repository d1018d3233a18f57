"""The test suite's own layout: test modules share code through tests/helpers/, never by
importing one another or conftest.py (pytest loads conftest itself; a test module that imports
another also runs, or collects, that module's module-level code and fixtures)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


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
