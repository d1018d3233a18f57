"""The layout counts of docs/architecture.md's rules, for a checkout: `python3 .ci/layout_counts.py [REPO]`.

Prints the package's root modules, its files over 500 lines, its functions over 50 lines (from
`def` to the end, docstring included), the lines on `family` that branch outside the model
registry (models/spec, models/registry, models/architectures/registry), and the Python lines
of the .smk files and the Snakefile outside rule bodies (blank lines, comments and directives
such as include: not counted), with their lambdas. A heuristic reader (regular expressions and
ast), for comparing two checkouts, not a test."""

import ast
import re
import sys
from pathlib import Path

repo = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
pkg = repo / "src" / "vitplasticity"
root_modules = sorted(p.name for p in pkg.glob("*.py"))
print(f"root modules: {len(root_modules)} ({' '.join(root_modules)})")
big = sorted((len(p.read_text().splitlines()), str(p.relative_to(pkg))) for p in pkg.rglob("*.py"))
over = [(n, f) for n, f in big if n > 500]
print(f"files over 500 lines: {len(over)} {over}")
longf = []
for p in pkg.rglob("*.py"):
    tree = ast.parse(p.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > 50:
                longf.append((n, f"{p.relative_to(pkg)}:{node.name}"))
longf.sort(reverse=True)
print(f"functions over 50 lines: {len(longf)}")
for n, f in longf:
    print(f"   {n} {f}")
# branches on family: comparisons/ifs mentioning family outside the registry/spec modules
allowed = re.compile(r"^models/(spec|registry)|^models/architectures/registry")
hits = []
for p in pkg.rglob("*.py"):
    rel = str(p.relative_to(pkg))
    if allowed.match(rel):
        continue
    for i, line in enumerate(p.read_text().splitlines(), 1):
        s = line.strip()
        if (
            re.match(r"(if|elif|while|assert|return|case)\b.*\bfamily\b", s)
            or re.search(r"\bfamily\b\S*\s*(==|!=|\bin\b|\bnot in\b)|(==|!=)\s*\S*family", s)
            or re.search(r"\b(TIMM_FAMILY|FAMILY)\b\s*(==|!=)|(==|!=)\s*(TIMM_FAMILY|FAMILY)\b", s)
            or re.search(r"get\(\"family\"", s)
        ):
            hits.append(f"{rel}:{i}: {s[:100]}")
print(f"branches on family outside the registry: {len(hits)}")
for h in hits:
    print("   ", h)
# Python lines outside rule bodies in .smk files
total = 0
for p in [*sorted((repo / "workflow" / "rules").glob("*.smk")), repo / "workflow/Snakefile"]:
    inside = False
    n = 0
    for line in p.read_text().splitlines():
        if re.match(r"^(rule|checkpoint|localrule)\s+\w*.*:\s*$", line) or re.match(
            r"^(use rule|rule)\b", line
        ):
            inside = True
            continue
        if inside and (line.startswith((" ", "\t")) or not line.strip()):
            continue
        inside = False
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        if re.match(
            r"^(include|configfile|localrules|wildcard_constraints|onstart|onsuccess|onerror|report|container|workdir|min_version)\b",
            s,
        ):
            continue
        n += 1
    total += n
    print(f"   {p.relative_to(repo)}: {n}")
print(f"python lines outside rule bodies in .smk/Snakefile: {total}")
lambdas = sum(p.read_text().count("lambda") for p in (repo / "workflow" / "rules").glob("*.smk"))
print(f"lambdas in .smk: {lambdas}")
# Issue 40's counts: the text twins, the size, the CLI, the rule files, the config blocks, and
# the stage modules that import the workflow layer (which sits above them).
text_files = sorted(str(p.relative_to(pkg)) for p in pkg.rglob("*text*.py"))
print(f"files with 'text' in their name under src: {len(text_files)} {text_files}")
src_lines = sum(len(p.read_text().splitlines()) for p in pkg.rglob("*.py"))
print(f"src lines: {src_lines}")
cli_source = "\n".join(p.read_text() for p in (pkg / "commands").glob("*.py"))
subcommands = re.findall(r"add_parser\(\s*\"([a-z0-9-]+)\"", cli_source)
print(f"CLI subcommands: {len(subcommands)} ({' '.join(sorted(subcommands))})")
print(f"rule files: {len(list((repo / 'workflow' / 'rules').glob('*.smk')))}")
config_file = repo / "config" / "config.yaml"
blocks = re.findall(r"^([a-z_]+):", config_file.read_text(), re.M)
print(f"top-level config blocks: {len(blocks)} ({' '.join(blocks)})")
stages = ("plasticity", "finetune", "report", "recommend")
importing = sorted(
    str(p.relative_to(pkg))
    for folder in stages
    for p in (pkg / folder).rglob("*.py")
    if re.search(r"^\s*(from|import) vitplasticity\.workflow", p.read_text(), re.M)
)
print(f"stage modules importing vitplasticity.workflow: {len(importing)} {importing}")
