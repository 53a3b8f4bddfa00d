#!/usr/bin/env bash
# Issues 28's, 35's and 46's GPU checks, in one run of under 11 minutes on one H100/H200 with 16 cores (each stage has its
# own time limit; what a stage printed stays printed if a later one runs out of time):
#   1. the CUDA tests (pytest -m gpu): dequantization bit-identical on the GPU, eager and compiled; pinned batches
#      reaching the GPU one step ahead; training, evaluation and prediction on the GPU.
#   2. NeXtVLADModel and NetVLADModel, --compile --mixed_precision, frame level (300-frame synthetic videos, uint8
#      batches, one reader process per core but one): the trainer's videos/s against the bare step's on the same
#      batches (target: trainer_over_bare_loop >= 0.80) and the trainer's input wait.
#   3. MoeModel, video level, streamed from the shards (no RAM cache), readers as `--num_readers auto` picks them:
#      input_wait_fraction (target: <= 0.10).
#   4. Out of GPU memory at the first training step (issue 35): an MoE of 200 mixtures at batch 65,536 (its gates'
#      and experts' logits alone are 200 GB) must end in one line naming --batch_size, with no traceback. (The
#      validation case is the same handler around the evaluation batch: tests/training/test_train_faults.py.)
#   5. `yt8m tune --n_jobs auto` (issue 46): a study of 2 short trials on the video-level data, with
#      CUDA_VISIBLE_DEVICES=0,1 where the machine has 2 GPUs or more (2 jobs, each on its GPU), else on its one GPU
#      (1 job); prints what --n_jobs auto chose and each trial's recorded devices.
# Usage, from the repository root with its venv built (make .venv/.installed):
#   bash bench/gpu_check.sh [WORK_DIR]        # WORK_DIR (default /tmp/yt8m-gpu-check) keeps the synthetic data
# Prints the nvidia-smi line, each stage's JSON, then a summary of each target: met or not, with the figure.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
WORK=${1:-/tmp/yt8m-gpu-check}
READERS=$(( $(nproc) > 1 ? $(nproc) - 1 : 1 ))
mkdir -p "$WORK"
LOG="$WORK/results.jsonl"
: > "$LOG"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "cpus $(nproc); readers $READERS; work dir $WORK"

# The data first, in the background while the tests run: 1,500 frame-level videos of 300 frames in 16 shards, and
# 65,536 video-level videos in 8 (bench_train.py's layout: WORK/data/frame, WORK/data/video).
if [ ! -d "$WORK/data/frame" ]; then
  (timeout 240 .venv/bin/yt8m synth --output_dir "$WORK/data" --kind frame --train_videos 1500 --validate_videos 0 \
     --test_videos 0 --shards 16 --min_frames 300 --max_frames 300 > "$WORK/synth_frame.log" 2>&1) &
  SYNTH_FRAME=$!
fi
if [ ! -d "$WORK/data/video" ]; then
  (timeout 240 .venv/bin/yt8m synth --output_dir "$WORK/data" --kind video --train_videos 65536 --validate_videos 0 \
     --test_videos 0 --shards 8 > "$WORK/synth_video.log" 2>&1) &
  SYNTH_VIDEO=$!
fi

echo "== 1. CUDA tests (pytest -m gpu)"
timeout 150 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py tests/data/test_uint8_frames.py \
  tests/models/test_models_on_gpu.py 2>&1 | tail -5
echo "pytest_exit ${PIPESTATUS[0]}"

[ -n "${SYNTH_FRAME:-}" ] && wait "$SYNTH_FRAME"
echo "== 2. compiled bf16 frame models: trainer vs bare step"
timeout 200 $PY bench/bench_train.py --models NeXtVLADModel,NetVLADModel --compile --mixed_precision \
  --frame_batch_size 256 --steps 40 --rounds 1 --num_readers "$READERS" --work_dir "$WORK" 2>"$WORK/frame.log" \
  | tee -a "$LOG"

[ -n "${SYNTH_VIDEO:-}" ] && wait "$SYNTH_VIDEO"
echo "== 3. MoeModel, video level, streamed: input wait"
timeout 100 $PY bench/bench_train.py --models MoeModel --no-cache --batch_size 1024 --steps 60 --rounds 1 \
  --videos 65536 --num_readers "$READERS" --work_dir "$WORK" 2>"$WORK/video.log" | tee -a "$LOG"

echo "== 4. out of GPU memory at the first training step: one line"
timeout 120 .venv/bin/yt8m train --train_data_pattern "$WORK/data/video/train-*" --train_dir "$WORK/oom_run" \
  --model MoeModel --moe_num_mixtures 200 --batch_size 65536 --max_steps 1 --num_readers 0 --start_new_model \
  > "$WORK/oom.out" 2> "$WORK/oom.err"
echo "oom_exit $?"
tail -3 "$WORK/oom.err"
if grep -q "out of GPU memory in a training step" "$WORK/oom.err" && ! grep -q Traceback "$WORK/oom.err"; then
  echo '{"check": "cuda_oom_one_line", "met": true}' | tee -a "$LOG"
else
  echo '{"check": "cuda_oom_one_line", "met": false}' | tee -a "$LOG"
fi

echo "== 5. tune --n_jobs auto: each job on its own GPU"
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then export CUDA_VISIBLE_DEVICES=0,1; fi
cat > "$WORK/tune_devices.yaml" <<YAML
train:
  train_data_pattern: $WORK/data/video/train-0000[0-5]-of-00008.tfrecord
  eval_data_pattern: $WORK/data/video/train-00007-of-00008.tfrecord
  model: LogisticModel
  batch_size: 1024
  num_epochs: 1
  max_steps: 20
search:
  base_learning_rate: {type: float, low: 0.001, high: 0.1, log: true}
objective: {metric: gap}
tune: {study_dir: $WORK/tune_devices, n_trials: 2, pruner: none, n_jobs: auto}
YAML
rm -rf "$WORK/tune_devices"
timeout 120 .venv/bin/yt8m tune --config "$WORK/tune_devices.yaml" > "$WORK/tune_devices.out" 2> "$WORK/tune_devices.err"
echo "tune_exit $?"
grep -- "--n_jobs auto:" "$WORK/tune_devices.err"
$PY - "$WORK/tune_devices" <<'EOF'
import optuna, sys
study = optuna.load_study(study_name="tune_devices", storage=f"sqlite:///{sys.argv[1]}/study.db")
for trial in study.trials:
    print(f"trial {trial.number} {trial.state.name}: devices {trial.user_attrs.get('devices')}, worker pid "
          f"{trial.user_attrs.get('worker', {}).get('pid')}")
EOF
unset CUDA_VISIBLE_DEVICES

echo "== summary"
$PY - "$LOG" <<'EOF'
import json, sys
results = {r["model"]: r for r in map(json.loads, open(sys.argv[1])) if "model" in r}
for model in ("NeXtVLADModel", "NetVLADModel"):
    r = results.get(model)
    if r is None:
        print(f"{model}: no result (see frame.log)")
        continue
    ratio = r["trainer_over_bare_loop"]
    print(f"{model}: trainer {r['trainer_examples_per_sec']:.0f} videos/s, bare step {r['bare_loop_examples_per_sec']:.0f}"
          f" -> {ratio:.0%} (target >= 80%: {'met' if ratio >= 0.8 else 'NOT met'}); input wait "
          f"{r['input_wait_fraction']:.1%}")
r = results.get("MoeModel")
if r is None:
    print("MoeModel: no result (see video.log)")
else:
    wait = r["input_wait_fraction"]
    print(f"MoeModel (video level, streamed): {r['trainer_examples_per_sec']:.0f} examples/s, input wait {wait:.1%} "
          f"(target <= 10%: {'met' if wait <= 0.10 else 'NOT met'})")
oom = [r for r in map(json.loads, open(sys.argv[1])) if r.get("check") == "cuda_oom_one_line"]
print(f"out of GPU memory at the first step: {'one line (met)' if oom and oom[0]['met'] else 'NOT met (see oom.err)'}")
EOF
