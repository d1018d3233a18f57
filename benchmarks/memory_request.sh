#!/bin/bash
# The memory a plasticity job asks for (vitplasticity.workflow.memory) against what it uses:
# image plasticity of a random-init timm ViT-S/16 saved as a safetensors file, through
# Snakemake on the demo preset (one dataset, PAIRS pairs in batches of 32, both protocols, on
# the CPU), `stream: MODE`. With LIMIT_MB the whole Snakemake process runs inside a cgroup v1
# memory limit of that many MiB (as root): give it the job's request to see it fit there.
# Usage: benchmarks/memory_request.sh always|never|auto [PAIRS] [LIMIT_MB]
# Prints the job's request (its resources line), the stream decision its log states, the job's
# benchmark record (max_rss in MiB) and, under a limit, the cgroup's exit, peak and OOM count.
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd)
MODE=$1; PAIRS=${2:-128}; LIMIT=${3:-}
ROOT=/tmp/memrequest; W=$ROOT/$MODE$PAIRS${LIMIT:+_$LIMIT}
export PATH=$REPO/.venv/bin:$PATH
mkdir -p $ROOT
if [ ! -f $ROOT/vit_s.safetensors ]; then
  python - <<PY
import timm, torch
from safetensors.torch import save_file
torch.manual_seed(0)
model = timm.create_model("vit_small_patch16_224", pretrained=False)
save_file({k: v.contiguous() for k, v in model.state_dict().items()}, "$ROOT/vit_s.safetensors")
PY
fi
rm -rf $W; mkdir -p $W; cd $W
REF=$(( PAIRS > 256 ? PAIRS : 256 ))  # the demo's reference set holds 256 images
cat > override.yaml <<YAML
datasets:
  demo-reference: {n_test: $REF}
reference: {n_images: $REF}
models:
  vit_s: {family: timm, timm_id: vit_small_patch16_224, weights: $ROOT/vit_s.safetensors}
plasticity:
  models: [vit_s]
  datasets: [demo-stripes]
  n_pairs: $PAIRS
  batch_size: 32
  device: cpu
  stream: $MODE
YAML
ARGS="--snakefile $REPO/workflow/Snakefile --directory $W --configfile $REPO/config/config.yaml
  $REPO/config/demo.yaml $W/override.yaml --cores 2 results/demo/plasticity/vit_s/demo-stripes.parquet"
if [ -z "$LIMIT" ]; then
  snakemake $ARGS > snakemake.log 2>&1; RC=$?
else
  G=/sys/fs/cgroup/memory/vp_memreq_$MODE
  mkdir -p $G && echo $((LIMIT * 1024 * 1024)) > $G/memory.limit_in_bytes
  echo 0 > $G/memory.swappiness 2>/dev/null
  ( echo $BASHPID > $G/cgroup.procs; exec snakemake $ARGS > snakemake.log 2>&1 ); RC=$?
  echo "cgroup: max_usage=$(( $(cat $G/memory.max_usage_in_bytes) / 1048576 )) MiB failcnt=$(cat $G/memory.failcnt)"
  rmdir $G
fi
echo "rc=$RC"
grep -A12 -E "^(local)?rule plasticity:" snakemake.log | grep "resources:"
grep -h "measured_model" results/demo/logs/plasticity/vit_s/demo-stripes.log 2>/dev/null | head -2
cat results/demo/benchmarks/plasticity/vit_s/demo-stripes.tsv 2>/dev/null
