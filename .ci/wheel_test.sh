#!/usr/bin/env bash
# Build the wheel and test it from a clean environment: a fresh venv with the base install only (no extras, none of
# the repository's files on the path), where synth, train, eval, predict and tune must run, and export must name
# the extra it needs. Then, in the same venv, the onnx extra and the example plugin package (examples/plugins,
# installed as a user would) must run the workflow by its entry-point names. Run by `make wheel-test` (and .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
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

# Second step: the onnx extra (for export) and the example plugin package, whose models, loss and metric every
# command then knows by their entry-point names (MLP, AttentionPooling, asymmetric_loss, micro_f1).
wheel=$(ls "$work"/dist/yt8m-*.whl)
cp -r "$repo/examples/plugins" "$work/example_plugins"  # built from a copy: setuptools leaves build/ in the tree
"$bin/pip" install --quiet -c "$repo/constraints.txt" "$wheel[onnx]" "$work/example_plugins"
"$bin/yt8m" synth --output_dir data --kind frame --num_classes 12 --train_videos 160 --validate_videos 48 \
  --test_videos 32 --shards 2 --feature_sizes 16,8 --min_frames 5 --max_frames 20 >/dev/null
plugins=(--label_loss asymmetric_loss --asl_gamma_neg 2 --metrics micro_f1 --best_metric micro_f1 --batch_size 64)
"$bin/yt8m" train --train_data_pattern 'data/video/train-*' --eval_data_pattern 'data/video/validate-*' \
  --train_dir mlp --model MLP --mlp_hidden 32 "${common[@]}" "${plugins[@]}" --num_epochs 2 >mlp.json
"$bin/yt8m" eval --train_dir mlp --eval_data_pattern 'data/video/validate-*' --run_once >mlp_eval.json
"$bin/yt8m" predict --train_dir mlp --input_data_pattern 'data/video/test-*' --output_file mlp.csv >/dev/null
"$bin/yt8m" export --train_dir mlp --output serving/mlp >/dev/null
"$bin/yt8m" predict --model serving/mlp --input_data_pattern 'data/video/test-*' --output_file mlp_onnx.csv >/dev/null
"$bin/yt8m" train --train_data_pattern 'data/frame/train-*' --eval_data_pattern 'data/frame/validate-*' \
  --train_dir attention --model AttentionPooling --attention_hidden 16 --frame_features --feature_names rgb,audio \
  --feature_sizes 16,8 --num_classes 12 "${plugins[@]}" --num_epochs 1 >attention.json
"$bin/yt8m" export --train_dir attention --output serving/attention >/dev/null
"$bin/yt8m" predict --model serving/attention --input_data_pattern 'data/frame/test-*' \
  --output_file attention_onnx.csv >/dev/null
cat > tune_plugins.yaml <<YAML
train: {train_data_pattern: "data/video/train-*", eval_data_pattern: "data/video/validate-*", model: MLP,
        label_loss: asymmetric_loss, feature_names: "mean_rgb,mean_audio", feature_sizes: "16,8", num_classes: 12,
        batch_size: 64, num_epochs: 1}
search: {mlp_hidden: {type: int, low: 8, high: 64, log: true}}
objective: {metric: micro_f1}
tune: {study_dir: study_plugins, n_trials: 2, n_jobs: 2}
YAML
"$bin/yt8m" tune --config tune_plugins.yaml >tune_plugins.json 2>tune_plugins.log
"$bin/yt8m" tune-report study_plugins >report.json 2>/dev/null
"$bin/yt8m" ensemble mlp study_plugins/trials/trial-0 --fit_weights_on 'data/video/validate-*' \
  --input_data_pattern 'data/video/test-*' --output_file ensemble.csv >ensemble.json
# What each step says it did: the names recorded, the metric reported, the exports matching the checkpoints.
"$bin/python" - <<'PY'
import csv, json
def load(name):
    with open(name) as fh:
        return json.loads(fh.read().splitlines()[-1])
def rows(name):
    with open(name) as fh:
        return {row[0]: dict(zip(row[1].split()[::2], map(float, row[1].split()[1::2])))
                for row in list(csv.reader(fh))[1:]}
mlp, evaluated, attention = load("mlp.json"), load("mlp_eval.json"), load("attention.json")
assert mlp["best_metric"] == attention["best_metric"] == "micro_f1", (mlp, attention)
assert abs(evaluated["micro_f1"] - mlp["best_value"]) < 1e-9, (evaluated, mlp)
checkpoint, onnx = rows("mlp.csv"), rows("mlp_onnx.csv")
assert checkpoint.keys() == onnx.keys() and len(checkpoint) == 48
assert max(abs(p - onnx[v][c]) for v in checkpoint for c, p in checkpoint[v].items()) < 1e-5
assert len(rows("attention_onnx.csv")) == 32
tune, report = load("tune_plugins.json"), load("report.json")
assert tune["metric"] == "micro_f1" and tune["n_trials"]["complete"] == 2 and not tune["failed_jobs"], tune
assert report["best_value"] == tune["best_value"] and "mlp_hidden" in tune["best_params"]
assert load("ensemble.json")["videos"] == 48
PY
echo "wheel test: with the onnx extra and examples/plugins installed, its entry points (MLP, AttentionPooling," \
  "asymmetric_loss, micro_f1) run train, eval, predict, export, tune (2 jobs), tune-report and ensemble"
