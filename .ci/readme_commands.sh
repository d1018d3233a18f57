#!/usr/bin/env bash
# The README's commands as a new user runs them: a fresh clone, a fresh shell (no variables
# but HOME and a bare PATH: nothing activated), the README's `source .venv/bin/activate`, then
# the paper's dry run, the demo and the demo's report command. Exits non-zero on the first
# that fails. Usage: .ci/readme_commands.sh [WORKDIR]   (run by .ci/run after `make test`).
#
# Cost: one demo on the CI machine's CPUs (the report needs its results) and two dry runs.
# The clone reuses this checkout's .venv (a link: `make` in the clone would reinstall it);
# the venv's editable install is this checkout's commit, the clone's too.
# tests/test_readme_commands.py checks that every command below is written in README.md.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$(mktemp -d)}"
clone="$work/clone"
rm -rf "$clone"
git clone -q "$repo" "$clone"
ln -s "$repo/.venv" "$clone/.venv"

# Run $1 in the clone in a shell that has inherited nothing. PYTHONPATH makes the clone's own
# package win over the one the linked venv's editable install points to (the same commit in
# CI; on a developer's machine it may be another checkout); it puts nothing on PATH.
fresh_shell() {
    env -i HOME="$HOME" PATH=/usr/local/bin:/usr/bin:/bin PYTHONPATH="$clone/src" \
        bash -c "cd '$clone' && set -euo pipefail && $1"
}

# Without the README's activation the commands are not found (what a new user met).
if fresh_shell "command -v snakemake" >/dev/null 2>&1; then
    echo "note: snakemake is on the bare PATH; the activation check proves less here"
fi
README_COMMANDS=(
    "source .venv/bin/activate"
    "snakemake -n all"
    "snakemake --configfile config/demo.yaml --cores 2 all"
    "snakemake --configfile config/demo.yaml --report report.html"
)
fresh_shell "$(IFS=';'; echo "${README_COMMANDS[*]}") && vitplasticity --help >/dev/null"
test -s "$clone/report.html"
grep -q "plasticity_depth" "$clone/report.html"
echo "README commands: all passed in a fresh clone and a fresh shell ($clone)"
