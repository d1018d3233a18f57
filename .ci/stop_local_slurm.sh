#!/usr/bin/env bash
# Stop exactly the daemons .ci/start_local_slurm.sh started, by the PIDs it recorded.
# Usage: .ci/stop_local_slurm.sh [BASE_DIR]          (default BASE_DIR: ./.slurm-local)
BASE=${1:-$PWD/.slurm-local}
for d in slurmd slurmctld slurmdbd mariadbd munged; do
  f="$BASE/pids/$d.pid"
  [ -f "$f" ] || continue
  pid=$(cat "$f")
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    echo "stopped $d ($pid)"
  fi
  rm -f "$f"
done
