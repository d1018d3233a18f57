"""Imports go one way: no module of vitplasticity imports a module of a higher layer, and the
graph of its imports has no cycle.

The graph is read from the source with ``ast`` (nothing is imported). Every import counts:
module-level, function-level (the lazy imports that keep torch out of ``--help`` and the
Snakefile are still dependencies: the code cannot run without the module) and
``TYPE_CHECKING``-only (a type named in a signature is a concept the module depends on). An
import of a name a package re-exports counts as an import of that package; ``from pkg import
mod`` of a submodule counts as an import of the submodule. ``importlib.import_module`` calls
are not read (the CLI loads its command modules with it, the dataset-source registry its
sources: downward or within a layer).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers.repo import REPO

SOURCE = REPO / "src" / "vitplasticity"
PACKAGE = "vitplasticity"

# Lowest first: (name, what it holds and why it sits there, folders). The layers are the
# package's folders (and the few modules at its root): a module belongs to the layer of its
# top-level folder ("" is the package's own __init__), and may import its own layer and the
# layers below. docs/architecture.md describes each folder.
LAYERS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "base",
        "facts and plumbing every layer shares, knowing no model, dataset or config: the "
        "component names, the criteria's registry, the version, utils/ (atomic files and the "
        "one reader, progress, optional packages, local GPU slots)",
        ("components", "criteria", "version", "utils"),
    ),
    (
        "settings",
        "how a stage declares its settings once (fields, CLI flags, checks, rule params)",
        ("settings",),
    ),
    (
        "data",
        "inputs onto disk and back: dataset sources, downloads, archives, the prepared store, "
        "ImageNet and the reference set, text files, the loader and its preprocessing",
        ("data",),
    ),
    (
        "models",
        "what a model is: its spec, the one build entry point, weights, the architectures "
        "(blocks, components, parameters by identity), LoRA, parameter selection; and "
        "provenance, the record of what made a file (it hashes the weights)",
        ("models", "provenance"),
    ),
    (
        "stages",
        "the workflow's stages, each a computation over models and data: plasticity and the "
        "bounds, finetuning, and the report's tables, figures and statistics",
        ("plasticity", "finetune", "report"),
    ),
    (
        "recommend",
        "which components to finetune for one model: plasticity, bounds and other criteria "
        "ranked, drawn in the report's style",
        ("recommend",),
    ),
    (
        "workflow",
        "what the Snakefile imports, without torch: config keys and cross-checks, the run "
        "grid, packs, the runtime a job asks for (from a model's FLOPs); it wires the stages' "
        "settings, grids and halving into jobs, and no stage imports it",
        ("workflow",),
    ),
    (
        "commands",
        "the CLI's subcommands: read flags, call one stage, write its files",
        ("commands",),
    ),
    (
        "entry",
        "what users run or import: the CLI, and the package itself (vitplasticity.select)",
        ("cli", ""),
    ),
)


def module_names() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    names = {}
    for path in SOURCE.rglob("*.py"):
        parts = path.relative_to(SOURCE.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _owner(name: str, modules: dict[str, Path]) -> str:
    """The module that defines ``name`` (a module, or a name inside a module)."""
    while name not in modules:
        name = name.rpartition(".")[0]
    return name


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``module`` imports, anywhere in its source."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {
                _owner(a.name, modules) for a in node.names if a.name.split(".")[0] == PACKAGE
            }
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, *([base] if base else [])])
            if base.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in modules else _owner(base, modules))
    found.discard(module)
    return found


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of ``module``'s layer: that of its top-level folder (or
    root module; ``""`` is the package itself)."""
    top = module.removeprefix(PACKAGE).removeprefix(".").split(".")[0]
    for index, (_, _, folders) in enumerate(LAYERS):
        if top in folders:
            return index
    raise AssertionError(f"{module} is in no layer: add its folder {top!r} to LAYERS")


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_every_module_has_a_layer(graph: dict[str, set[str]]) -> None:
    unplaced = []
    for module in graph:
        try:
            layer_of(module)
        except AssertionError as error:
            unplaced.append(str(error))
    assert not unplaced, "\n".join(unplaced)


def test_no_module_imports_a_higher_layer(graph: dict[str, set[str]]) -> None:
    upward = [
        f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if layer_of(target) > layer_of(module)
    ]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_imports_have_no_cycle(graph: dict[str, set[str]]) -> None:
    assert not cycles(graph), f"import cycles: {cycles(graph)}"


def test_the_graph_sees_every_kind_of_import(graph: dict[str, set[str]]) -> None:
    """The reader is what the checks stand on: module-level, function-level, relative and
    TYPE_CHECKING imports of known modules all appear."""
    assert "vitplasticity.finetune.settings" in graph["vitplasticity.finetune.identity"]
    # Function-level: the text stage imports the (torch) text-model helpers when it measures.
    assert "vitplasticity.models.text" in graph["vitplasticity.plasticity.text"]
    # TYPE_CHECKING-only.
    assert "vitplasticity.plasticity.summary" in graph["vitplasticity.commands"]
    # from package import submodule.
    assert "vitplasticity.data.store" in graph["vitplasticity.data.loader"]


def test_cycles_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
