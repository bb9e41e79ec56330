#!/usr/bin/env bash
# The example resources in this folder, as `hvd-bert k8s render` writes them (run from the
# checkout; tests/core/test_k8s.py checks they are what the command writes today). Render your
# own with your image, workers, GPUs, recipe and data: docs/clusters.md.
set -euo pipefail
cd "$(dirname "$0")/.."
HVD=${HVD:-.venv/bin/hvd-bert}
IMAGE=registry.example.com/hvd_bert:gpu
"$HVD" k8s render --kind mpijob --job pretrain --name bert-large-phase1 --image "$IMAGE" --workers 4 \
    --gpus-per-worker 8 --config bert-large-phase1 --set data=/data/wiki-books-seq128 \
    --output k8s/pretrain-mpijob.yaml
"$HVD" k8s render --kind mpijob --job finetune --name bert-large-squad --image "$IMAGE" --workers 1 \
    --gpus-per-worker 8 --config squad --set data=/data/squad-v1.1 \
    --set init_checkpoint=/runs/bert-large-phase2 --output k8s/finetune-mpijob.yaml
"$HVD" k8s render --kind trainjob --job pretrain --name bert-large-phase1 --image "$IMAGE" --workers 4 \
    --gpus-per-worker 8 --config bert-large-phase1 --set data=/data/wiki-books-seq128 \
    --output k8s/pretrain-trainjob.yaml
"$HVD" k8s render --kind trainjob --job finetune --name bert-large-squad --image "$IMAGE" --workers 1 \
    --gpus-per-worker 8 --config squad --set data=/data/squad-v1.1 \
    --set init_checkpoint=/runs/bert-large-phase2 --output k8s/finetune-trainjob.yaml
