#!/usr/bin/env bash
# Submit BERT phase 1, then phase 2 to start only when phase 1 has succeeded.
#   slurm/submit_pretrain.sh [sbatch options...]    e.g. -N 92 --ntasks-per-node=16 --gpus-per-task=1
# The environment settings of pretrain.sbatch apply to both (PHASE is set here).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
p1=$(PHASE=1 sbatch --parsable "$@" "$here/pretrain.sbatch")
p2=$(PHASE=2 sbatch --parsable --dependency=afterok:"${p1%%;*}" "$@" "$here/pretrain.sbatch")
echo "phase 1: job ${p1%%;*}; phase 2: job ${p2%%;*} (after phase 1 succeeds)"
