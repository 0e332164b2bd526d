#!/usr/bin/env bash
# Off-Policy Lab: what training-worker.sbatch and rollout-worker.sbatch run once they have found
# the checkout (LAB_REPO) and chosen LAB_QUEUE. Checks the settings a worker on a cluster node
# needs, says what it starts, and becomes the worker (`manage.py worker`, which becomes Celery),
# so the job's batch process is the worker itself: Slurm's signals reach it, and its PID is the one
# in the worker's identity (host:pid:start) that the lab records against the runs it trains.
set -euo pipefail

fail() {
    echo "error: $*" >&2
    exit 2
}

case "${LAB_WORKER_KIND:-}:${LAB_QUEUE:-}" in
training:gpu | training:cpu | rollout:rollout-gpu | rollout:rollout) ;;
training:*) fail "LAB_QUEUE=$LAB_QUEUE: a training worker's queue is gpu or cpu" ;;
rollout:*) fail "LAB_QUEUE=$LAB_QUEUE: a rollout worker's queue is rollout-gpu or rollout" ;;
*) fail "submit training-worker.sbatch or rollout-worker.sbatch; they run $0 (LAB_WORKER_KIND unset)" ;;
esac
for name in DATABASE_URL REDIS_URL LAB_VAR_DIR; do
    [ -n "${!name:-}" ] || fail "$name is not set: a worker on a cluster node must use the lab's" \
        "PostgreSQL (DATABASE_URL), Redis (REDIS_URL) and shared folder (LAB_VAR_DIR)"
done
[ -d "$LAB_VAR_DIR" ] || fail "LAB_VAR_DIR=$LAB_VAR_DIR is no folder on $(hostname): it must be the" \
    "lab's shared folder, mounted on every node"
PYTHON="${LAB_PYTHON:-$LAB_REPO/.venv/bin/python}"
[ -x "$PYTHON" ] || fail "LAB_PYTHON=$PYTHON is not executable: run \`make install\` (EXTRAS=gpu for" \
    "GPU workers) in $LAB_REPO, or point LAB_PYTHON at its Python"
if [[ "$LAB_QUEUE" == *gpu ]] && ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    fail "LAB_QUEUE=$LAB_QUEUE needs a GPU and this job sees none (nvidia-smi -L): ask for one" \
        "(--gres=gpu:1), or take CPU work (LAB_QUEUE=$([ "$LAB_WORKER_KIND" = training ] && echo cpu || echo rollout))"
fi

# Torch threads: the job's CPUs, unless set (`manage.py worker` tells OpenMP and MKL the same).
threads="${LAB_TORCH_THREADS:-${SLURM_CPUS_PER_TASK:-${SLURM_CPUS_ON_NODE:-}}}"
if [ -n "$threads" ]; then
    export LAB_TORCH_THREADS="$threads"
fi
# A run's memory ceiling: 3/4 of the job's memory when Slurm says how much (the rest is the
# worker's own: Python, torch, a CUDA context), unless set.
if [ -z "${LAB_RUN_MEMORY_MB:-}" ] && [ "${SLURM_MEM_PER_NODE:-0}" -ge 1024 ]; then
    export LAB_RUN_MEMORY_MB=$((SLURM_MEM_PER_NODE * 3 / 4))
fi

echo "Off-Policy Lab $LAB_WORKER_KIND worker, queue $LAB_QUEUE: Slurm job ${SLURM_JOB_ID:-?} on" \
    "$(hostname), pid $$, LAB_VAR_DIR=$LAB_VAR_DIR, torch threads ${LAB_TORCH_THREADS:-default}," \
    "run memory ceiling ${LAB_RUN_MEMORY_MB:-default} MiB"
cd "$LAB_REPO"
exec "$PYTHON" manage.py worker "$LAB_QUEUE" --name "$LAB_QUEUE-slurm${SLURM_JOB_ID:-$$}"
