#!/usr/bin/env bash
# Runs `chinchax train` as N processes on this machine, each with D virtual CPU devices,
# joined through a coordinator on 127.0.0.1 with gloo collectives: a multi-host run in miniature.
#
#   launch/local_multiprocess.sh [--processes N] [--devices D] [--port P] [--log-dir DIR]
#                                [--] [chinchax train flags...]
#
#   --processes N  processes to start (default 2)
#   --devices D    virtual CPU devices per process (default 4); the mesh spans N x D devices
#   --port P       coordinator port on 127.0.0.1 (default: a free port)
#   --log-dir DIR  write process I's output to DIR/process_I.log (default: this terminal)
#
# Environment: PYTHON (default python3) runs `PYTHON -m chinchax.cli train`.
# SIGTERM or SIGINT to this script is passed to every process: the run checkpoints at the
# next step boundary and exits with status 75; run the same command again to resume.
# Exit status: 0 if every process succeeded, 75 if the run was preempted, else the first
# failing process's status (the others are then killed: they cannot go on without it).
set -euo pipefail

usage() { awk 'NR == 1 || /^#SBATCH/ {next} /^#/ {sub(/^# ?/, ""); print; next} {exit}' "$0"; }

processes=2
devices=4
port=""
log_dir=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --processes) processes="$2"; shift 2 ;;
    --devices) devices="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    --log-dir) log_dir="$2"; shift 2 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
for value in "$processes" "$devices" ${port:+"$port"}; do
  if ! [[ "$value" =~ ^[1-9][0-9]*$ ]]; then
    echo "error: --processes, --devices and --port take positive integers, got '$value'" >&2
    exit 2
  fi
done
python="${PYTHON:-python3}"
if [[ -z "$port" ]]; then
  port="$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
fi
if [[ -n "$log_dir" ]]; then mkdir -p "$log_dir"; fi

pids=()
forward() {
  for pid in "${pids[@]}"; do kill -s "$1" "$pid" 2>/dev/null || true; done
}
trap 'forward TERM' TERM
trap 'forward TERM' INT  # background children ignore SIGINT; TERM checkpoints and exits 75

for ((i = 0; i < processes; i++)); do
  # The user's flags come first: ml_collections needs --config before any --config.* override.
  cmd=("$python" -m chinchax.cli train "$@"
       "--config.mesh.num_cpu_devices=${devices}"
       "--config.distributed.mode=explicit"
       "--config.distributed.coordinator_address=127.0.0.1:${port}"
       "--config.distributed.num_processes=${processes}"
       "--config.distributed.process_id=${i}")
  # gloo prints "[Gloo] Rank r is connected to p peer ranks..." on stdout for every collective
  # group it sets up (a dozen lines per process); they are dropped, the rest passes line by line.
  if [[ -n "$log_dir" ]]; then
    XLA_FLAGS="" JAX_PLATFORMS=cpu "${cmd[@]}" \
      > >(grep --line-buffered -v '^\[Gloo\] Rank ' >"${log_dir}/process_${i}.log") 2>&1 &
  else
    XLA_FLAGS="" JAX_PLATFORMS=cpu "${cmd[@]}" > >(grep --line-buffered -v '^\[Gloo\] Rank ') &
  fi
  pids+=("$!")
done

# Wait for every process; once one fails (other than by preemption), stop the rest.
status=0
remaining=${#pids[@]}
declare -A done_pids=()
while ((remaining > 0)); do
  for pid in "${pids[@]}"; do
    [[ -n "${done_pids[$pid]:-}" ]] && continue
    if ! kill -0 "$pid" 2>/dev/null; then
      rc=0
      wait "$pid" || rc=$?
      done_pids[$pid]=1
      remaining=$((remaining - 1))
      if ((rc != 0 && status == 0)); then
        status=$rc
        if ((rc != 75)); then forward KILL; fi
      fi
    fi
  done
  ((remaining > 0)) && sleep 0.2
done
wait 2>/dev/null || true  # the output filters' last lines, before the caller reads the logs
exit "$status"
