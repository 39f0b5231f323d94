#!/usr/bin/env bash
# Single-node SLURM on this machine (Debian packages slurmctld + slurmd + munge, localhost),
# then the tiny ladder submitted as a job array through launch/slurm_ladder.sbatch, then a check
# of its results table: every run of the grid exactly once, all done.
#
#   sudo benchmarks/slurm_ladder_local.sh [--tasks K] [--workdir DIR] [--venv DIR] [--no-install]
#
#   --tasks K     array tasks = ladder workers (default 2)
#   --workdir D   the ladder's workdir (default /tmp/chinchax-slurm-ladder; emptied first)
#   --venv DIR    virtual environment holding chinchax (default: .venv of this checkout)
#   --no-install  SLURM and munge are installed and configured already
#
# Needs root (apt-get, munged, slurmd). Not part of the test suite. The daemons stay up after
# the script; stop them with: pkill -x slurmd; pkill -x slurmctld; pkill -x munged.
set -euo pipefail

usage() { awk 'NR == 1 {next} /^#/ {sub(/^# ?/, ""); print; next} {exit}' "$0"; }

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tasks=2 workdir=/tmp/chinchax-slurm-ladder venv="$repo/.venv" install=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --tasks) tasks="$2"; shift 2 ;;
    --workdir) workdir="$2"; shift 2 ;;
    --venv) venv="$2"; shift 2 ;;
    --no-install) install=0; shift ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [[ "$(id -u)" != 0 ]]; then
  echo "error: run as root (apt-get, munged and slurmd need it)" >&2
  exit 2
fi
host="$(hostname -s)"

if ((install)); then
  echo "== installing slurmctld, slurmd, munge"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
  echo "== munge key and daemon"
  mkdir -p /etc/munge /var/log/munge /var/lib/munge /run/munge
  if [[ ! -s /etc/munge/munge.key ]]; then
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
  fi
  chown -R munge:munge /etc/munge /var/log/munge /var/lib/munge /run/munge
  chmod 0400 /etc/munge/munge.key
  chmod 0700 /etc/munge /var/log/munge /var/lib/munge
  chmod 0755 /run/munge
  echo "== slurm.conf for $host"
  mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
  node="$(slurmd -C | head -n 1)"
  cat > /etc/slurm/slurm.conf <<EOF
ClusterName=local
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
$node State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
fi

echo "== daemons"
pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged
munge -n | unmunge >/dev/null
pgrep -x slurmctld >/dev/null || slurmctld
pgrep -x slurmd >/dev/null || slurmd
for _ in $(seq 60); do
  if sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then break; fi
  scontrol update nodename="$host" state=resume 2>/dev/null || true
  sleep 1
done
sinfo

echo "== tiny ladder as an array of $tasks workers"
rm -rf "$workdir"
mkdir -p "$workdir"
# This node has no GPUs: the worker script without its GPU request, on the CPU.
script="$workdir/slurm_ladder_cpu.sbatch"
sed '/^#SBATCH --gpus-per-task/d' "$repo/launch/slurm_ladder.sbatch" > "$script"
t0=$(date +%s)
job="$(cd "$repo" && sbatch --parsable --array=0-$((tasks - 1)) --cpus-per-task=1 \
  --output="$workdir/worker-%A_%a.out" --chdir="$repo" "$script" --venv "$venv" --cpu -- \
  --config=configs/ladder.py:tiny --config.workdir="$workdir/ladder" \
  --config.train_config.data.store_root="$workdir/stores" --config.ladder.bootstrap=5)"
echo "submitted array job $job"
while [[ -n "$(squeue -h -j "$job" 2>/dev/null)" ]]; do sleep 2; done
echo "array finished in $(( $(date +%s) - t0 )) s"
sacct -j "$job" 2>/dev/null || true
tail -n 3 "$workdir"/worker-*.out

echo "== results table"
"$venv/bin/python" - "$workdir/ladder" <<'EOF'
import json, pathlib, sys
wd = pathlib.Path(sys.argv[1])
grid = json.loads((wd / "grid.json").read_text())
rows = [json.loads(l) for l in (wd / "results.jsonl").read_text().splitlines()]
ids = [r["run_id"] for r in rows]
workers = sorted({r["worker"] for r in rows})
print(f"{len(rows)} rows for {len(grid)} runs; workers {workers}")
ok = sorted(ids) == sorted(grid) and len(set(ids)) == len(ids)
ok = ok and all(r["status"] == "done" for r in rows)
print("fit:", "yes" if (wd / "fit" / "fit.json").exists() else "no")
print("table OK: every run exactly once, all done" if ok else "table WRONG")
sys.exit(0 if ok else 1)
EOF
