#!/bin/bash
# Text plasticity (or recommend --text) of benchmarks/streamed.py's large random Llama through
# Snakemake, inside a cgroup v1 memory limit (as root). Usage:
#   benchmarks/streamed_workflow.sh WEIGHTS LIMIT_GB auto|always|never [plasticity|recommend]
# Prints the job's exit, the cgroup's peak and its OOM count; the job's benchmark record is under
# /tmp/wfstream/<stage><mode><limit>/results/demo/benchmarks/.
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd)
WEIGHTS=$1; LIMIT=$2; MODE=${3:-auto}; STAGE=${4:-plasticity}
case $STAGE in
  plasticity) TARGET=plasticity_text/big_llama/notes_summary.parquet; RECORD=plasticity_text ;;
  recommend) TARGET=recommend_text/big_llama/notes.md; RECORD=recommend_text ;;
  *) echo "stage: plasticity or recommend, not $STAGE" >&2; exit 2 ;;
esac
W=/tmp/wfstream/$STAGE$MODE$LIMIT; rm -rf $W; mkdir -p $W; cd $W
python3 - <<PY
lines = "".join(f"Reference line {i}: the quick brown fox jumps over the lazy dog {i * 7} times.\n" for i in range(40))
open("reference.txt", "w").write(lines)
open("notes.txt", "w").write(lines.upper())
PY
cat > override.yaml <<YAML
models:
  big_llama: {family: transformers, hf_id: bench/llama, weights: $WEIGHTS}
datasets:
  ref_text: {source: text_file, path: $W/reference.txt, tokenizer: bytes, sequence_length: 16, steps: 10, val_every: 5}
  notes: {source: text_file, path: $W/notes.txt, tokenizer: bytes, sequence_length: 16, steps: 10, val_every: 5}
text_plasticity:
  enabled: true
  run_models: [big_llama]
  reference: ref_text
  datasets: [notes]
  n_pairs: 8
  batch_size: 4
  device: cpu
  stream: $MODE
recommend:
  batch_size: 2
  batches: 2
  device: cpu
  stream: $MODE
YAML
G=/sys/fs/cgroup/memory/vp_wf_$STAGE$MODE$LIMIT
mkdir -p $G && echo $((LIMIT * 1024 * 1024 * 1024)) > $G/memory.limit_in_bytes && echo 0 > $G/memory.swappiness 2>/dev/null
export PATH=$REPO/.venv/bin:$PATH
export PYTHONPATH=$REPO/src  # this checkout's code, whichever checkout the venv was installed from
# The job runs in the cgroup (a subshell moved into it), this script outside, so that the
# cgroup can be removed after.
(
  echo $BASHPID > $G/cgroup.procs
  exec snakemake --snakefile $REPO/workflow/Snakefile --directory $W \
    --configfile $REPO/config/config.yaml $REPO/config/demo.yaml $W/override.yaml \
    --cores 2 results/demo/$TARGET > $W/snakemake.log 2>&1
)
RC=$?
echo "rc=$RC max_usage=$(cat $G/memory.max_usage_in_bytes) failcnt=$(cat $G/memory.failcnt)"
cat $W/results/demo/benchmarks/$RECORD/big_llama/notes.tsv 2>/dev/null
rmdir $G
