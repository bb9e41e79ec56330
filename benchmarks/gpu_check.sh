#!/usr/bin/env bash
# The GPU figures in one run (under 10 minutes), on a machine with an NVIDIA GPU and this
# project's set-up (`make setup` with HVD_BERT_GPU=1) or its GPU image (docker/Dockerfile.gpu):
#   1. BERT-Base and BERT-Large pretraining steps, phase 1 (seq 128, 20 predictions) and
#      phase 2 (seq 512, 80 predictions), in bf16 where the GPU has it (else fp16 with loss
#      scaling): hvd_bert's PyTorch BERT against Hugging Face transformers' BertForPreTraining
#      built from the same config, same batch, optimizer and precision, each in its own
#      process, in the same run (benchmarks/bert_train.py); the batches have Wikipedia's padding
#      (0.92 of the tokens real at 128, 0.78 at 512) and hvd_bert also runs them packed
#      (pack_sequences);
#   2. where the step's time goes: benchmarks/gpu_profile.py (torch.profiler), BERT-Large at 128
#      and 512: padded, packed, and with the encoder layers compiled (compile_layers);
#   3. the job's own step: `hvd-bert pretrain` (PyTorch, 1 rank, Horovod, NVLAMB, bf16) on data
#      prepared here from the built-in corpus with BERT's 30,522-entry vocabulary (the corpus's
#      WordPiece tokens plus [unused] entries: the masked-LM head costs what BERT's does), at
#      phase 1 and 2, BERT-Base and BERT-Large, against transformers on a batch of that data's
#      padding in the same run (benchmarks/bert_train.py --fill);
#   4. the NCF ladder's fastest rung (rung 5 of benchmarks/ncf_ladder.py: batch 196,608, LARS,
#      warmup, bf16) on one GPU through `hvd-bert ncf`, to HR@10 0.78 on synthetic ml-1m data;
#   5. activation checkpointing (train.activation_checkpointing off, layers, layers:2, attention)
#      on BERT-Large at sequence 512: peak device memory per sequence against the memory plan's
#      activations (core.activations, fused attention), the largest batch in 80 GB and the step
#      time (benchmarks/activation_checkpointing.py);
#   6. packed attention at sequence 512, BERT-Large's heads: the same sequences padded, packed
#      through the dense bias and packed through varlen attention (packed_attention=varlen:
#      SDPA's flash or memory-efficient kernels on nested jagged tensors), time and peak device
#      memory (benchmarks/packed_attention.py; under a minute);
#   7. the step with no host synchronisation: BERT-Base steps through the engine (Horovod, 1
#      rank, NVLAMB) in bf16, in bf16 weights over fp32 masters (train.precision.weights=bf16)
#      and in fp16 at ZeRO 0 and 1 under torch.cuda.set_sync_debug_mode("error"), then read
#      after every step against read once at the end, with each one's peak device memory
#      (benchmarks/step_sync.py; about 2 minutes; it needs Horovod).
# Results: $OUT (default benchmarks/results/gpu/; a temporary folder with --smoke): one JSON per
# measurement and summary.txt.
#
#   bash benchmarks/gpu_check.sh            # on the GPU machine
#   bash benchmarks/gpu_check.sh --smoke    # the same plumbing on the CPU, tiny sizes (a check
#                                           # of this script, not a measurement)
#   bash benchmarks/gpu_check.sh --horovod-sdist horovod-0.28.1.tar.gz
#       # on a GPU machine whose Python has PyTorch but no Horovod (an image without this
#       # project's set-up, no network): benchmarks/gpu_horovod.sh builds a PyTorch-only
#       # Horovod from the sdist while the BERT steps run, for the NCF run through hvd-bert
#   --only LIST runs those parts only, comma-separated: bert (1), profile (2), job (3), ncf (4),
#   ckpt (5; about 2 minutes), attn (6; under a minute), sync (7; about 2 minutes);
#   all four take about 12-15 minutes on an H200, so a 15-minute lease runs them in two calls,
#   e.g. `--only profile,job` then `--only bert,ncf` (each under 8 minutes).
#   --ncf-only and --job-only are --only ncf and --only job.
# PYTHON picks the interpreter (default .venv/bin/python, else python3).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-.venv/bin/python}
[[ -x $PY ]] || command -v "$PY" >/dev/null || PY=python3
SMOKE=0 SDIST= SDIST_GIVEN=0 PARTS=bert,profile,job,ncf,ckpt,attn,sync
while (($#)); do
    case $1 in
        --smoke) SMOKE=1 ;;
        --ncf-only) PARTS=ncf ;;
        --job-only) PARTS=job ;;
        --only) PARTS=${2:-}; shift $(($# > 1)) ;;
        --horovod-sdist) SDIST_GIVEN=1 SDIST=${2:-}; shift $(($# > 1)) ;;
        *) echo "gpu_check: unknown argument $1 (known: --smoke, --only LIST, --ncf-only, --job-only," \
                "--horovod-sdist FILE)" >&2
           exit 2 ;;
    esac
    shift
done
for part in ${PARTS//,/ }; do
    [[ $part =~ ^(bert|profile|job|ncf|ckpt|attn|sync)$ ]] ||
        { echo "gpu_check: --only takes bert, profile, job, ncf, ckpt, attn and sync, comma-separated, not '$part'" >&2
          exit 2; }
done
[[ -n ${PARTS//,/} ]] || { echo "gpu_check: --only needs a part: bert, profile, job, ncf, ckpt, attn or sync" >&2; exit 2; }
want() { [[ ,$PARTS, == *",$1,"* ]]; }
if ((SDIST_GIVEN)) && [[ ! -f $SDIST ]]; then
    echo "gpu_check: --horovod-sdist '$SDIST' is not a file: pass the Horovod 0.28.1 sdist" \
        "(pip download --no-deps --no-binary :all: horovod==0.28.1)" >&2
    exit 2
fi
# the committed GPU results stay out of reach of a smoke run
OUT=${OUT:-$( ((SMOKE)) && mktemp -d -t gpu_check_smoke.XXXX || echo benchmarks/results/gpu)}
export TF_USE_LEGACY_KERAS=1 TF_CPP_MIN_LOG_LEVEL=3
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # hvd_bert from this checkout, installed or not
mkdir -p "$OUT"
summary=$OUT/summary.txt
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }

if [[ $SMOKE == 1 ]]; then
    device=cpu precision=bf16
    # preset, phase, seq, predictions, batch, the fraction of real tokens
    configs=("tiny 1 128 20 8 0.92" "tiny 2 512 80 4 0.78")
    ncf_batch=16384 ncf_limit=60
    say "gpu_check --smoke: CPU, tiny sizes (plumbing only, not a measurement)"
else
    command -v nvidia-smi >/dev/null || { echo "gpu_check: no nvidia-smi: this needs an NVIDIA GPU" >&2; exit 2; }
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$summary"
    "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" ||
        { echo "gpu_check: torch sees no CUDA device (a CPU build of torch? set up with HVD_BERT_GPU=1)" >&2; exit 2; }
    device=cuda
    precision=$("$PY" -c "import torch; print('bf16' if torch.cuda.is_bf16_supported() else 'fp16')")
    # NVIDIA's per-GPU batches for an 80 GB GPU (phase 1 / phase 2)
    configs=("base 1 128 20 128 0.92" "base 2 512 80 32 0.78" "large 1 128 20 64 0.92" "large 2 512 80 16 0.78")
    ncf_batch=196608 ncf_limit=150
fi
# Horovod for the NCF run: built in the background while the BERT steps run, if asked for
build_pid=
if [[ -n $SDIST ]] && ! "$PY" -c "import horovod.torch" 2>/dev/null; then
    HVD_SITE=$(mktemp -d)
    PYTHON=$PY bash benchmarks/gpu_horovod.sh "$SDIST" "$HVD_SITE" >"$OUT/horovod-build.log" 2>&1 &
    build_pid=$!
fi
say "device $device, precision $precision, $(date -u +%FT%TZ), $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

say ""
say "BERT pretraining step (forward, MLM + NSP loss, backward, AdamW), sequences/s:"
say "$(printf '%-6s %-6s %5s %6s %5s %10s %10s %13s %7s %7s' model phase seq batch fill hvd_bert packed transformers ratio packed)"
want bert || configs=()
for c in "${configs[@]}"; do
    read -r preset phase seq pred batch fill <<<"$c"
    json=$OUT/bert-$preset-phase$phase.json
    if timeout 200 "$PY" benchmarks/bert_train.py --device "$device" --precision "$precision" \
        --preset "$preset" --seq "$seq" --predictions "$pred" --batch "$batch" --fill "$fill" --steps 8 \
        --warmup 3 --repeats 1 --variants hvd_bert hvd_bert-packed transformers --json "$json" \
        >"$OUT/bert-$preset-phase$phase.log" 2>&1; then
        say "$("$PY" - "$json" "$preset" "$phase" "$seq" "$batch" "$fill" <<'PYEOF'
import json, sys
path, preset, phase, seq, batch, fill = sys.argv[1:]
rows = {r["variant"]: r for r in json.load(open(path))["rows"]}
ours, packed = rows["hvd_bert"]["sequences_per_s"], rows["hvd_bert-packed"]["sequences_per_s"]
peer = rows["transformers"]["sequences_per_s"]
print(f"{preset:<6} {phase:<6} {seq:>5} {batch:>6} {fill:>5} {ours:>10.1f} {packed:>10.1f} {peer:>13.1f} "
      f"{ours / peer:>6.2f}x {packed / peer:>6.2f}x")
PYEOF
)"
    else
        say "$(printf '%-6s %-6s %5s %6s' "$preset" "$phase" "$seq" "$batch") failed or timed out: see $OUT/bert-$preset-phase$phase.log"
    fi
done

say ""
say "Where the step's time goes (benchmarks/gpu_profile.py: torch.profiler, NVLAMB, $precision):"
if ((SMOKE)); then profiles=("tiny 128 8 0.92"); else profiles=("large 128 64 0.92" "large 512 16 0.78"); fi
want profile || profiles=()
for p in "${profiles[@]}"; do
    read -r preset seq batch fill <<<"$p"
    for how in "" --pack --compile; do
        name=profile-$preset-$seq${how:+-${how#--}}
        if timeout 150 "$PY" benchmarks/gpu_profile.py --device "$device" --precision "$precision" \
            --preset "$preset" --seq "$seq" --batch "$batch" --fill "$fill" $how \
            $( ((SMOKE)) && echo --smoke) --json "$OUT/$name.json" >"$OUT/$name.log" 2>&1; then
            while IFS= read -r line; do say "$line"; done < <(grep -A8 '^BERT-' "$OUT/$name.log")
        else
            say "$name failed or timed out: see $OUT/$name.log"
        fi
    done
done

if [[ -n $build_pid ]]; then
    if wait "$build_pid"; then
        export PYTHONPATH=$HVD_SITE${PYTHONPATH:+:$PYTHONPATH}
        nccl_dir=$(sed -n 's/.*LD_LIBRARY_PATH: \(.*\))$/\1/p' "$OUT/horovod-build.log")
        export LD_LIBRARY_PATH=$nccl_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        say "Horovod built for this run from $SDIST: $(grep -m 1 '^gpu_horovod: torch' "$OUT/horovod-build.log")"
    else
        say "the Horovod build failed: see $OUT/horovod-build.log"
    fi
fi

say ""
say "The job's own step: hvd-bert pretrain, PyTorch, 1 rank, NVLAMB, $precision, against transformers"
say "(bert_train.py, AdamW) on a batch with the data's padding; sequences/s, median of the logged intervals:"
say "$(printf '%-6s %-6s %5s %6s %5s %12s %13s %7s' model phase seq batch fill 'hvd-bert job' transformers ratio)"
if ((SMOKE)); then jobs=("tiny 1 128 20 8" "tiny 2 512 80 4"); job_steps=6 job_every=2
else jobs=("base 1 128 20 128" "base 2 512 80 32" "large 1 128 20 64" "large 2 512 80 16"); job_steps=40 job_every=10; fi
want job || jobs=()
if ((${#jobs[@]})); then  # BERT's vocabulary size: the corpus's tokens, then [unused] entries
    work=$(mktemp -d)
    "$PY" -m hvd_bert prepare-bert --output "$work/p0" --max-seq-length 128 >"$work/prepare.log" 2>&1 || true
    { cat "$work/p0/vocab.txt"; for ((i = $(wc -l <"$work/p0/vocab.txt"); i < 30522; i++)); do echo "[unused$i]"; done; } \
        >"$work/vocab.txt"
fi
for c in "${jobs[@]}"; do
    read -r preset phase seq pred batch <<<"$c"
    data=$work/p$seq name=job-$preset-phase$phase
    [[ -d $data ]] || "$PY" -m hvd_bert prepare-bert --output "$data" --vocab "$work/vocab.txt" --max-seq-length "$seq" \
        --max-predictions-per-seq "$pred" >>"$work/prepare.log" 2>&1 || { say "preparing $data failed: $work/prepare.log"; continue; }
    fill=$("$PY" - "$data" <<'PYEOF'
import sys
from hvd_bert.pt.data import ShardedDataset
s = ShardedDataset(sys.argv[1], "bert-pretraining", 0, 1, 64).stream(0)
masks = [next(s)["input_mask"] for _ in range(16)]
print(round(sum(float(m.float().mean()) for m in masks) / len(masks), 2))
PYEOF
)
    rm -rf "$OUT/$name"
    timeout 240 "$PY" -m hvd_bert pretrain --framework pt --set data="$data" --set model="$preset" \
        --set max_seq_length="$seq" --set max_predictions_per_seq="$pred" --set train.output_dir="$OUT/$name" \
        --set train.batch.local_batch_size="$batch" --set train.batch.backward_passes_per_step=1 \
        --set train.schedule.total_steps="$job_steps" --set train.log_every="$job_every" \
        --set train.checkpoint_every=0 --set train.precision.mode="$precision" --set progress=false \
        --set train.check_memory=false >"$OUT/$name.log" 2>&1 || true
    timeout 200 "$PY" benchmarks/bert_train.py --device "$device" --precision "$precision" --preset "$preset" \
        --vocab 30522 --seq "$seq" --predictions "$pred" --batch "$batch" --fill "$fill" --steps 8 --warmup 3 \
        --repeats 1 --variants transformers --json "$OUT/$name-peer.json" >"$OUT/$name-peer.log" 2>&1 || true
    say "$("$PY" - "$OUT/$name/metrics.jsonl" "$OUT/$name-peer.json" "$preset" "$phase" "$seq" "$batch" "$fill" <<'PYEOF'
import json, statistics, sys
metrics, peer, preset, phase, seq, batch, fill = sys.argv[1:]
try:
    rates = [r["sequences_per_s"] for r in map(json.loads, open(metrics)) if "sequences_per_s" in r][1:]
    ours = statistics.median(rates)
except (OSError, statistics.StatisticsError):
    ours = float("nan")
try:
    theirs = json.load(open(peer))["rows"][0]["sequences_per_s"]
except (OSError, KeyError, IndexError):
    theirs = float("nan")
print(f"{preset:<6} {phase:<6} {seq:>5} {batch:>6} {fill:>5} {ours:>12.1f} {theirs:>13.1f} {ours / theirs:>6.2f}x"
      + ("" if ours == ours and theirs == theirs else "  (a run failed: see its log)"))
PYEOF
)"
done
if want ckpt; then
    say ""
    say "Activation checkpointing (benchmarks/activation_checkpointing.py, $precision): peak memory per sequence"
    say "measured and planned (core.activations), the largest batch in the budget, step time against off:"
    if ((SMOKE)); then ck=(tiny 128 "1 2" 1); else ck=(large 512 "8 16" 80); fi
    if timeout 300 "$PY" benchmarks/activation_checkpointing.py --device "$device" --precision "$precision" \
        --preset "${ck[0]}" --seq "${ck[1]}" --batches ${ck[2]} --budget-gib "${ck[3]}" --steps 3 \
        --json "$OUT/activation-checkpointing.json" >"$OUT/activation-checkpointing.log" 2>&1; then
        say "$("$PY" - "$OUT/activation-checkpointing.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
for policy, s in d["summary"].items():
    print(f"  {policy:<10} {s['bytes_per_sequence'] / 2**20:9.1f} MiB/seq (plan {s['planned_bytes_per_sequence'] / 2**20:9.1f}), "
          f"largest batch {s['largest_batch_in_budget']}, step {s['step_time_vs_off']:.2f}x off")
PYEOF
)"
    else
        say "activation checkpointing failed or timed out: see $OUT/activation-checkpointing.log"
    fi
fi
if want attn; then
    say ""
    say "Packed attention (benchmarks/packed_attention.py, $precision, BERT-Large's 16 heads of 64): time and"
    say "peak memory of the attention's forward and backward, against the same sequences padded:"
    if ((SMOKE)); then pa=(64 4 2 16); else pa=(512 64 16 64); fi
    if timeout 240 "$PY" benchmarks/packed_attention.py --device "$device" --precision "$precision" \
        --seq "${pa[0]}" --batch "${pa[1]}" --heads "${pa[2]}" --head-size "${pa[3]}" --repeats 5 \
        --json "$OUT/packed-attention.json" >"$OUT/packed-attention.log" 2>&1; then
        say "$("$PY" - "$OUT/packed-attention.json" <<'PYEOF'
import json, sys
for r in json.load(open(sys.argv[1]))["runs"]:
    print(f"  {r['variant']:<14} {r['rows']:>4} rows  {r['seconds'] * 1e3:9.2f} ms ({r['time_vs_first']:.2f}x)  "
          f"{r['peak_bytes_over_baseline'] / 2**20:9.1f} MiB ({r['memory_vs_first']:.2f}x)")
PYEOF
)"
    else
        say "packed attention failed or timed out: see $OUT/packed-attention.log"
    fi
fi
if want sync; then
    say ""
    say "The step with no host synchronisation (benchmarks/step_sync.py; CUDA's sync debug mode at error):"
    if ! "$PY" -c "import horovod.torch" 2>/dev/null; then
        say "  skipped: no Horovod here (give --horovod-sdist)"
    elif timeout 240 "$PY" benchmarks/step_sync.py --device "$device" $( ((SMOKE)) && echo --smoke) \
        --json "$OUT/step-sync.json" >"$OUT/step-sync.log" 2>&1; then
        say "$("$PY" - "$OUT/step-sync.json" <<'PYEOF'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    peak = f"; peak {r['peak_bytes'] / 2**30:.2f} GiB" if r.get("peak_bytes") else ""
    print(f"  {r['precision']} ZeRO {r['zero_stage']}: {r['host_reads_in_3_steps']} host reads in 3 steps; "
          f"{r['step_s_read_at_the_end'] * 1e3:.1f} ms/step read at the end, read every step "
          f"{r['every_step_vs_end']:.3f}x{peak}")
PYEOF
)"
    else
        say "  a host read inside the step, or a failure: see $OUT/step-sync.log"
    fi
fi
want ncf || { say ""; say "results: $OUT"; exit 0; }

say ""
say "NCF, the ladder's fastest rung (LARS lr 10, warmup 25 steps, bf16, batch $ncf_batch), 1 process:"
run=$OUT/ncf-rung5
rm -rf "$run"
status=0
timeout "$ncf_limit" "$PY" -m hvd_bert ncf --framework pt --set train.output_dir="$run" \
    --set target_hr=0.78 --set eval_every=0.25 --set train.log_every=1000 \
    --set model.factors=32 --set "model.layers=[64, 32]" --set epochs=30 \
    --set train.batch.local_batch_size="$ncf_batch" --set train.optim.name=lars --set train.optim.lr=10 \
    --set train.optim.weight_decay=0 --set train.precision.mode=bf16 \
    --set train.schedule.name=linear_warmup --set train.schedule.warmup_steps=25 >"$run.log" 2>&1 || status=$?
if [[ -s $run/metrics.jsonl ]]; then
    say "$("$PY" - "$run/metrics.jsonl" "$status" "$ncf_limit" <<'PYEOF'
import json, sys
evals = [e for e in map(json.loads, open(sys.argv[1])) if "hr@10" in e]
status, limit = int(sys.argv[2]), sys.argv[3]
hit = next((e for e in evals if e["hr@10"] >= 0.78), None)
if hit:
    print(f"HR@10 {hit['hr@10']:.4f} at epoch {hit['epoch']:g}: {hit['train_s']:.1f} s of training to target")
elif evals:
    why = f"stopped at the {limit} s limit" if status in (124, 3) else f"exit status {status}"
    print(f"target not reached ({why}): best HR@10 {max(e['hr@10'] for e in evals):.4f}, "
          f"{evals[-1]['epoch']:g} epochs in {evals[-1]['train_s']:.1f} s of training")
else:
    print(f"no evaluation recorded (exit status {status})")
PYEOF
)"
else
    say "NCF run failed (exit status $status): see $run.log"
fi
say ""
say "results: $OUT"
