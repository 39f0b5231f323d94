#!/usr/bin/env bash
# Runs `chinchax train` on every worker of a Cloud TPU VM slice: one process per host, started
# together over `gcloud compute tpus tpu-vm ssh --worker=all`.
#
#   launch/tpu_pod.sh --name NAME --zone ZONE [--project PROJECT] [--accelerator-type TYPE]
#                     [--create | --queued] [--spot] [--version VERSION] [--sync] [--setup]
#                     [--slices K] [--dir DIR] [--dry-run] [--] [chinchax train flags...]
#
#   --name NAME              TPU VM (and queued resource) name
#   --zone ZONE              zone, e.g. us-east5-a
#   --project PROJECT        GCP project (default: gcloud's configured project)
#   --accelerator-type TYPE  slice type for --create / --queued, e.g. v5p-32, v4-64, v6e-16
#   --version VERSION        TPU software version for --create / --queued
#                            (default: tpu-ubuntu2204-base)
#   --create                 create the TPU VM first (tpu-vm create)
#   --queued                 create it through a queued resource and wait until it is ACTIVE
#   --spot                   spot (preemptible) capacity, with --create / --queued
#   --sync                   copy this checkout (without .git, .venv, runs/) to DIR on every worker
#   --setup                  make DIR/.venv and pip install -e "DIR[tpu]" on every worker
#   --slices K               K slices joined over the data-center network (multislice; needs
#                            --queued to create them, or an existing queued resource whose
#                            slices are NAME-0 … NAME-<K-1>); train runs on all of them
#   --dir DIR                code directory on the workers (default: chinchax, under $HOME)
#   --dry-run                print the gcloud commands instead of running them
#   --skip-compile           do not compile the run for the slice first (see below)
#
# Before anything is created, synced or started, `chinchax compile --topology TYPE` (run here,
# no TPU needed: pip install -e ".[tpu]") compiles the train step for the slice with the same
# flags and stops the launch, with its report, when the program does not fit in the chips' HBM
# (exit status 3). It needs --accelerator-type; --skip-compile launches without the check.
# The `chinchax` it runs is $CHINCHAX when set.
#
# Every worker runs `chinchax train --config.distributed.mode=tpu FLAGS`; JAX reads the slice's
# worker list and starts the coordinator on worker 0. Give --config.workdir and
# --config.data.store_root as gs:// URLs (docs/storage.md): every host writes its shards of each
# orbax checkpoint there, process 0 builds the token store once and all hosts read it in place;
# the hosts need no shared disk (the VM's service account needs storage.objectAdmin on the
# bucket). On preemption or maintenance (SIGTERM) every worker checkpoints at the same step and
# exits with status 75; run the same command again (after re-creating a spot VM) to resume.
#
# Example:
#   launch/tpu_pod.sh --name my-v5p --zone us-east5-a --accelerator-type v5p-32 --create \
#     --sync --setup -- --config=configs/train.py:125m --config.workdir=gs://my-bucket/runs/125m \
#     --config.data.store_root=gs://my-bucket/stores
#
# Multislice: two v5e-16 slices, FSDP inside each and data parallelism between them, so that
# only the gradient's data-parallel reduction crosses the data-center network (mesh.dcn_data;
# the pre-launch compile runs with --slices 2 and reports that traffic):
#   launch/tpu_pod.sh --name my-ms --zone us-west4-a --accelerator-type v5e-16 --slices 2 \
#     --queued --sync --setup -- --config=configs/train.py:125m --config.mesh.dcn_data=2 \
#     --config.mesh.data=2 --config.mesh.fsdp=-1 --config.train.global_batch_size=64 \
#     --config.workdir=gs://my-bucket/runs/125m-ms --config.data.store_root=gs://my-bucket/stores
set -euo pipefail

usage() { awk 'NR == 1 || /^#SBATCH/ {next} /^#/ {sub(/^# ?/, ""); print; next} {exit}' "$0"; }

name="" zone="" project="" accel="" version="tpu-ubuntu2204-base" dir="chinchax"
create=0 queued=0 spot=0 sync=0 setup=0 dry_run=0 skip_compile=0 slices=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --name) name="$2"; shift 2 ;;
    --zone) zone="$2"; shift 2 ;;
    --project) project="$2"; shift 2 ;;
    --accelerator-type) accel="$2"; shift 2 ;;
    --version) version="$2"; shift 2 ;;
    --dir) dir="$2"; shift 2 ;;
    --slices) slices="$2"; shift 2 ;;
    --create) create=1; shift ;;
    --queued) queued=1; shift ;;
    --spot) spot=1; shift ;;
    --sync) sync=1; shift ;;
    --setup) setup=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    --skip-compile) skip_compile=1; shift ;;
    --) shift; break ;;
    *) break ;;
  esac
done
if [[ -z "$name" || -z "$zone" ]]; then
  echo "error: --name and --zone are required (see --help)" >&2
  exit 2
fi
if ! [[ "$slices" =~ ^[1-9][0-9]*$ ]]; then
  echo "error: --slices takes a positive integer, got '$slices'" >&2
  exit 2
fi
if ((slices > 1 && create)); then
  echo "error: --slices $slices creates its slices as one queued resource: use --queued, not --create" >&2
  exit 2
fi
if [[ $((create + queued)) -gt 0 && -z "$accel" ]]; then
  echo "error: --create / --queued need --accelerator-type, e.g. v5p-32" >&2
  exit 2
fi

where=(--zone="$zone")
if [[ -n "$project" ]]; then where+=(--project="$project"); fi

# shellcheck source=launch/tpu_common.bash
source "$(dirname "${BASH_SOURCE[0]}")/tpu_common.bash"

tpu_precompile "$@"

if ((create)); then
  tpu_create "$name" create
elif ((queued)); then
  tpu_create "$name" queued
  tpu_wait_active "$name"
fi
nodes=("$name")
if ((slices > 1)); then
  nodes=()
  for ((i = 0; i < slices; i++)); do nodes+=("$name-$i"); done
fi
if ((sync)); then
  tpu_pack
  for node in "${nodes[@]}"; do tpu_sync "$node"; done
fi
if ((setup)); then
  for node in "${nodes[@]}"; do tpu_setup "$node"; done
fi

flags=""
if [[ $# -gt 0 ]]; then flags="$(printf ' %q' "$@")"; fi
run="cd $dir && .venv/bin/chinchax train${flags} --config.distributed.mode=tpu"
if ((slices == 1)); then
  tpu_on_all_workers "$name" "$run"
  exit 0
fi
# Every worker of every slice at once: the run starts when all of them have joined.
pids=()
for node in "${nodes[@]}"; do
  if ((dry_run)); then tpu_on_all_workers "$node" "$run"; continue; fi
  tpu_on_all_workers "$node" "$run" &
  pids+=($!)
done
status=0
for pid in ${pids[@]+"${pids[@]}"}; do
  wait "$pid" || { code=$?; if ((status == 0)); then status=$code; fi; }
done
exit "$status"
