#!/usr/bin/env bash
# Install and start a single-node SLURM "cluster" on localhost from Debian's packages (root).
# Usage: .ci/start_local_slurm.sh [BASE_DIR]          (default BASE_DIR: ./.slurm-local)
#
# Idempotent: when the daemons recorded in BASE_DIR/pids/ are alive and the node answers, it
# only prints `sinfo` and exits; when the packages are installed it skips apt entirely.
# WITH_ACCOUNTING=1 (default) also runs MariaDB + slurmdbd so that `sacct` works (the
# snakemake SLURM plugin polls job states with sacct, and the tests read them from it).
# Every daemon's PID is written to BASE_DIR/pids/*.pid; .ci/stop_local_slurm.sh kills exactly
# those. Adapted from the team's shared recipe (tools/start_local_slurm.sh).
#
# The node advertises the shape of a GPU node, not the machine's: LOCAL_SLURM_GPUS (default 2)
# stand-in GPUs of type LOCAL_SLURM_GPU_TYPE (default tesla: a typed GRES, gpu:tesla:2, on
# dummy device nodes; --gpus=1, --gres=gpu:1 and --gres=gpu:tesla:1 each get one),
# LOCAL_SLURM_CPUS (default 24) CPUs and
# LOCAL_SLURM_MEM_MB (default 131072) MB, never less than the machine has. So jobs asking for
# the shipped workflow profile's real requests (--gpus=1 --cpus-per-gpu=8 --mem 48000) are
# scheduled, and sacct records what they got. Nothing enforces the numbers (task/none, no
# cgroups, no OverMemoryKill), and no job sees a GPU device: the tests' models run on the CPU.
set -euo pipefail
BASE=$(mkdir -p "${1:-$PWD/.slurm-local}" && cd "${1:-$PWD/.slurm-local}" && pwd)
WITH_ACCOUNTING=${WITH_ACCOUNTING:-1}
export DEBIAN_FRONTEND=noninteractive
t0=$(date +%s)
log() { echo "[start_local_slurm +$(($(date +%s) - t0))s] $*"; }

alive() { [ -f "$BASE/pids/$1.pid" ] && kill -0 "$(cat "$BASE/pids/$1.pid")" 2>/dev/null; }

daemons="munged slurmctld slurmd"
[ "$WITH_ACCOUNTING" = 1 ] && daemons="munged mariadbd slurmdbd slurmctld slurmd"
all_alive=1
for d in $daemons; do alive "$d" || all_alive=0; done
GPU_TYPE=${LOCAL_SLURM_GPU_TYPE:-tesla}
# A cluster started by an older version of this script (no GPU GRES, or an untyped one) is restarted.
if [ "$all_alive" = 1 ] && sinfo -h -o '%T' 2>/dev/null | grep -qE 'idle|mix|alloc' \
  && sinfo -h -o '%G' 2>/dev/null | grep -q "gpu:$GPU_TYPE:"; then
  log "already running (pids in $BASE/pids)"
  sinfo
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "start_local_slurm: needs root (to install packages and run the daemons)" >&2
  exit 3
fi

pkgs="slurmctld slurmd slurm-client munge"
[ "$WITH_ACCOUNTING" = 1 ] && pkgs="$pkgs slurmdbd mariadb-server"
if ! dpkg -s $pkgs >/dev/null 2>&1; then
  command -v apt-get >/dev/null || { echo "start_local_slurm: no apt-get" >&2; exit 3; }
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends $pkgs >/dev/null
fi
log "packages installed: $pkgs"

# A half-started previous attempt: stop what it left (by its recorded PIDs) and start afresh.
"$(dirname "$0")/stop_local_slurm.sh" "$BASE" >/dev/null 2>&1 || true

mkdir -p "$BASE"/{state,spool,log,pids}
GPUS=${LOCAL_SLURM_GPUS:-2}
CPUS=$(( $(nproc) > ${LOCAL_SLURM_CPUS:-24} ? $(nproc) : ${LOCAL_SLURM_CPUS:-24} ))
MEM=$(awk -v want="${LOCAL_SLURM_MEM_MB:-131072}" \
  '/MemTotal/{have = int($2/1024) - 1024; print (have > want ? have : want)}' /proc/meminfo)

if [ "$WITH_ACCOUNTING" = 1 ]; then
  # job_comment: keep each job's --comment (the plugin's rule_<rule>_wildcards_...) in sacct.
  ACCT="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
AccountingStoreFlags=job_comment
AccountingStorageTRES=gres/gpu,gres/gpu:$GPU_TYPE
JobAcctGatherType=jobacct_gather/linux"
else
  ACCT="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
fi

# SchedulerParameters/intervals: a test cluster should start jobs as soon as they arrive.
cat >"$BASE/slurm.conf" <<CONF
ClusterName=localcluster
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
$ACCT
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
ReturnToService=2
MinJobAge=300
SlurmctldParameters=enable_configless
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool
SlurmctldPidFile=$BASE/slurmctld.pid
SlurmdPidFile=$BASE/slurmd.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd.log
# config_overrides: slurmd reports the CPUs/memory/GRES below instead of the hardware's
# (without it the node is drained for having fewer CPUs than configured).
SlurmdParameters=config_overrides
GresTypes=gpu
NodeName=localhost CPUs=$CPUS RealMemory=$MEM Gres=gpu:$GPU_TYPE:$GPUS State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
# A CPU partition (the same node: what routes there is the partition a job names), as a
# cluster keeps CPU-only jobs off its GPU nodes; and a partition with a 20-minute time limit,
# as a cluster's caps are, for the tests that packed jobs fit under one.
PartitionName=cpu Nodes=localhost MaxTime=INFINITE State=UP
PartitionName=capped Nodes=localhost MaxTime=20 State=UP
CONF
# Stand-in GPUs: SLURM schedules and accounts them as on a real GPU node. Slurm 22.05's gres/gpu
# drops a GPU without File= ("Removing file-less GPU"), and a File= must be a character or
# block device, so each GPU is a device node with /dev/null's numbers (1:3), which nothing
# opens (no cgroup device constraint). slurmctld serves gres.conf to the configless slurmd.
# The GPUs are typed (Type=, as a site's A100s are gpu:a100), so that the tests can request
# them in each form the workflow profile offers: --gpus=1, --gres=gpu:1, --gres=gpu:<type>:1.
mkdir -p "$BASE/dev"
for i in $(seq 0 $((GPUS - 1))); do
  [ -c "$BASE/dev/gpu$i" ] || mknod -m 666 "$BASE/dev/gpu$i" c 1 3
done
cat >"$BASE/gres.conf" <<CONF
NodeName=localhost Name=gpu Type=$GPU_TYPE File=$BASE/dev/gpu[0-$((GPUS - 1))]
CONF

# munge (the Debian package generated /etc/munge/munge.key on install)
mkdir -p /run/munge && chown munge:munge /run/munge
runuser -u munge -- /usr/sbin/munged
cp /run/munge/munged.pid "$BASE/pids/munged.pid"
munge -n | unmunge >/dev/null
log "munged up (pid $(cat "$BASE/pids/munged.pid"))"

if [ "$WITH_ACCOUNTING" = 1 ]; then
  if [ ! -d "$BASE/db/mysql" ]; then
    mariadb-install-db --user=root --datadir="$BASE/db" --auth-root-authentication-method=socket \
      >"$BASE/log/mariadb-install.log" 2>&1
  fi
  nohup mariadbd --user=root --datadir="$BASE/db" --socket="$BASE/mysqld.sock" \
    --bind-address=127.0.0.1 --port=3306 --innodb-buffer-pool-size=64M \
    --log-error="$BASE/log/mariadb.log" >/dev/null 2>&1 &
  echo $! >"$BASE/pids/mariadbd.pid"
  for _ in $(seq 1 80); do mariadb -S "$BASE/mysqld.sock" -e 'select 1' >/dev/null 2>&1 && break; sleep 0.25; done
  mariadb -S "$BASE/mysqld.sock" -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmpw';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"
  log "mariadb up"
  cat >"$BASE/slurmdbd.conf" <<CONF
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=3306
StorageUser=slurm
StoragePass=slurmpw
StorageLoc=slurm_acct_db
PidFile=$BASE/slurmdbd.pid
LogFile=$BASE/log/slurmdbd.log
CONF
  chmod 600 "$BASE/slurmdbd.conf"
  SLURM_CONF="$BASE/slurm.conf" nohup slurmdbd -D >"$BASE/log/slurmdbd.out" 2>&1 &
  echo $! >"$BASE/pids/slurmdbd.pid"
  for _ in $(seq 1 80); do SLURM_CONF="$BASE/slurm.conf" sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.25; done
  SLURM_CONF="$BASE/slurm.conf" sacctmgr -i add cluster localcluster >/dev/null 2>&1 || true
  log "slurmdbd up"
fi

# The node's state comes from slurm.conf alone: a drain saved by an earlier start (another
# node shape, a GRES the slurmd did not find) would otherwise outlive the fix.
rm -f "$BASE/state/node_state" "$BASE/state/node_state.old"
SLURM_CONF="$BASE/slurm.conf" nohup slurmctld -D -i >"$BASE/log/slurmctld.out" 2>&1 &
echo $! >"$BASE/pids/slurmctld.pid"
sleep 0.5
# Configless slurmd: it fetches slurm.conf from slurmctld and links /run/slurm/conf to its
# cache, where every client (sinfo, sbatch, squeue, sacct and the srun *inside* jobs, which
# the snakemake jobstep plugin starts with all SLURM_* variables, SLURM_CONF included,
# removed) finds it without SLURM_CONF and without a file in /etc/slurm.
env -u SLURM_CONF nohup slurmd -D -N localhost --conf-server localhost:6817 >"$BASE/log/slurmd.out" 2>&1 &
echo $! >"$BASE/pids/slurmd.pid"
for _ in $(seq 1 120); do sinfo -h -o '%T' 2>/dev/null | grep -q idle && break; sleep 0.5; done
sinfo -h -o '%T' 2>/dev/null | grep -q idle || { echo "start_local_slurm: node never became idle; see $BASE/log" >&2; exit 1; }
sinfo -h -o '%G' | grep -q "gpu:$GPU_TYPE:$GPUS" || { echo "start_local_slurm: node has no gpu:$GPU_TYPE:$GPUS GRES; see $BASE/log/slurmd.log" >&2; exit 1; }
sinfo -o '%P %N %T %c %m %G'
log "slurm ready"
