#!/usr/bin/env bash
# Build the wheel and test it from a clean environment: a fresh venv with the base install only (no extras, none of
# the repository's files on the path), where synth, train, eval, predict and tune must run, and export must name
# the extra it needs. Run by `make wheel-test` (and .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$work/dist" .
"$PYTHON" -m venv "$work/venv"
bin="$work/venv/bin"
"$bin/pip" install --quiet -c constraints.txt torch  # pinned first: the CPU build (see the Makefile)
"$bin/pip" install --quiet -c constraints.txt "$work"/dist/yt8m-*.whl
cd "$work"  # nothing of the repository on the path
if "$bin/python" -c "import tensorboard" 2>/dev/null || "$bin/python" -c "import onnx" 2>/dev/null; then
  echo "wheel test: the base install pulled in an extra" >&2; exit 1
fi
"$bin/yt8m" synth --output_dir data --num_classes 12 --train_videos 240 --validate_videos 64 --test_videos 48 \
  --shards 2 --feature_sizes 16,8 >/dev/null
common=(--feature_names mean_rgb,mean_audio --feature_sizes 16,8 --num_classes 12)
"$bin/yt8m" train --train_data_pattern 'data/video/train-*' --eval_data_pattern 'data/video/validate-*' \
  --train_dir run --model MoeModel "${common[@]}" --batch_size 64 --num_epochs 2 >/dev/null
"$bin/yt8m" eval --train_dir run --eval_data_pattern 'data/video/validate-*' --run_once >/dev/null
"$bin/yt8m" predict --train_dir run --input_data_pattern 'data/video/test-*' --output_file p.csv >/dev/null
"$bin/yt8m" score --predictions p.csv --labels data/video/test_labels.csv >/dev/null
cat > tune.yaml <<YAML
train: {train_data_pattern: "data/video/train-*", eval_data_pattern: "data/video/validate-*",
        feature_names: "mean_rgb,mean_audio", feature_sizes: "16,8", num_classes: 12, batch_size: 64, num_epochs: 1}
search: {base_learning_rate: {type: float, low: 0.01, high: 0.1, log: true}}
tune: {study_dir: study, n_trials: 2}
YAML
"$bin/yt8m" tune --config tune.yaml >/dev/null 2>tune.log
test -f study/best.yaml
if "$bin/yt8m" export --train_dir run --output serving 2>export.log; then
  echo "wheel test: export ran without the onnx extra" >&2; exit 1
fi
grep -q "needs the onnx extra: pip install 'yt8m\[onnx\]'" export.log
echo "wheel test: $(basename "$work"/dist/yt8m-*.whl) installs and runs synth, train, eval, predict, score and tune without extras"
