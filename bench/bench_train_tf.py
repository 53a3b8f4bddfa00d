"""The starter kit's LogisticModel / MoeModel training step in TensorFlow 2, to time beside bench_train.py.

Reference only; yt8m never imports TensorFlow. Written from the starter kit's definitions (not its code, which
needs TF 1): a sigmoid fully connected layer (Logistic) or a softmax gate over 2 sigmoid experts plus a dummy
(MoE), L2 1e-8 on the weights, its CrossEntropyLoss on probabilities (epsilon 1e-5), Adam at 0.01, each
gradient clipped to norm 1.0 on its own, batch 1024 of mean_rgb+mean_audio over 3862 classes, one compiled
tf.function step. Input: TFRecordDataset -> batch -> parse_example -> cache() -> prefetch, so that reading is
out of the timing, as bench_train.py's RAM cache takes it out of yt8m's.
Usage: /tmp/tfvenv/bin/python bench/bench_train_tf.py --data 'DIR/video/train-*' [--models ...] [--steps 20]
With --validate PATTERN --epochs N it instead trains N shuffled epochs and writes, per model, a Kaggle CSV of
its top-20 predictions on the validation shards and their ground truth, for `yt8m score` to compute GAP.
"""

from __future__ import annotations

import argparse
import glob
import json
import time

import tensorflow as tf

NUM_CLASSES = 3862
FEATURES = {"mean_rgb": 1024, "mean_audio": 128}
L2_PENALTY = 1e-8
MIXTURES = 2


def _parse(serialized: tf.Tensor) -> dict:
    spec = {"id": tf.io.FixedLenFeature([], tf.string), "labels": tf.io.VarLenFeature(tf.int64)}
    spec.update({name: tf.io.FixedLenFeature([size], tf.float32) for name, size in FEATURES.items()})
    parsed = tf.io.parse_example(serialized, spec)
    return {"id": parsed["id"], "features": tf.concat([parsed[name] for name in FEATURES], axis=1),
            "labels": tf.cast(tf.sparse.to_indicator(parsed["labels"], NUM_CLASSES), tf.float32)}


def _batches(pattern: str, batch_size: int, shuffle: bool = False, whole: bool = True) -> tf.data.Dataset:
    """`whole`: only full batches (timing); shuffled: reshuffled every epoch, as the starter kit's
    shuffle_batch_join."""
    records = tf.data.TFRecordDataset([path for part in pattern.split(",") for path in sorted(glob.glob(part))])
    if shuffle:
        records = records.cache().shuffle(10_000, seed=0)
    batches = records.batch(batch_size, drop_remainder=whole).map(_parse)
    return batches if shuffle else batches.cache()


def _dense(units: int, bias: bool, name: str) -> tf.keras.layers.Dense:
    return tf.keras.layers.Dense(units, use_bias=bias, name=name, kernel_regularizer=tf.keras.regularizers.L2(L2_PENALTY / 2))


class Logistic(tf.keras.Model):
    def __init__(self) -> None:
        super().__init__()
        self.layer = _dense(NUM_CLASSES, True, "logistic")

    def call(self, features: tf.Tensor) -> tf.Tensor:
        return tf.nn.sigmoid(self.layer(features))


class Moe(tf.keras.Model):
    def __init__(self) -> None:
        super().__init__()
        self.gates = _dense(NUM_CLASSES * (MIXTURES + 1), False, "gates")
        self.experts = _dense(NUM_CLASSES * MIXTURES, True, "experts")

    def call(self, features: tf.Tensor) -> tf.Tensor:
        gating = tf.nn.softmax(tf.reshape(self.gates(features), [-1, MIXTURES + 1]))
        experts = tf.nn.sigmoid(tf.reshape(self.experts(features), [-1, MIXTURES]))
        return tf.reshape(tf.reduce_sum(gating[:, :MIXTURES] * experts, 1), [-1, NUM_CLASSES])


def _cross_entropy(labels: tf.Tensor, predictions: tf.Tensor) -> tf.Tensor:
    epsilon = 1e-5
    loss = labels * tf.math.log(predictions + epsilon) + (1 - labels) * tf.math.log(1 - predictions + epsilon)
    return tf.reduce_mean(tf.reduce_sum(-loss, 1))


def _train_step(model: tf.keras.Model) -> tf.types.experimental.GenericFunction:
    optimizer = tf.keras.optimizers.Adam(0.01)

    @tf.function
    def step(features: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = _cross_entropy(labels, model(features)) + tf.add_n(model.losses)
        gradients = [tf.clip_by_norm(g, 1.0) for g in tape.gradient(loss, model.trainable_variables)]
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    return step


def _time_model(model: tf.keras.Model, batches: tf.data.Dataset, steps: int, warmup: int) -> float:
    step = _train_step(model)
    examples, started = 0, None
    for index, batch in enumerate(batches.repeat().prefetch(2).take(warmup + steps)):
        if index == warmup:
            started = time.perf_counter()
        step(batch["features"], batch["labels"]).numpy()
        examples += int(batch["features"].shape[0]) if index >= warmup else 0
    return examples / (time.perf_counter() - started)


def _train_and_predict(model: tf.keras.Model, args: argparse.Namespace, prefix: str) -> None:
    """Train --epochs shuffled epochs, then write PREFIX-predictions.csv and PREFIX-labels.csv."""
    step = _train_step(model)
    for _ in range(args.epochs):
        for batch in _batches(args.data, args.batch_size, shuffle=True, whole=False).prefetch(2):
            step(batch["features"], batch["labels"])
    with open(f"{prefix}-predictions.csv", "w") as predictions, open(f"{prefix}-labels.csv", "w") as truth:
        predictions.write("VideoId,LabelConfidencePairs\n")
        truth.write("VideoId,Labels\n")
        for batch in _batches(args.validate, args.batch_size, whole=False):
            top = tf.math.top_k(model(batch["features"]), k=20)
            for video_id, classes, scores, labels in zip(batch["id"].numpy(), top.indices.numpy(), top.values.numpy(),
                                                         batch["labels"].numpy()):
                pairs = " ".join(f"{c} {s:f}" for c, s in zip(classes, scores))
                predictions.write(f"{video_id.decode()},{pairs}\n")
                truth.write(f"{video_id.decode()},{' '.join(str(c) for c in labels.nonzero()[0])}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="Video-level shards, e.g. the ones bench_train.py wrote.")
    parser.add_argument("--models", default="LogisticModel,MoeModel")
    parser.add_argument("--steps", type=int, default=20, help="Timed steps, after --warmup steps.")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=1024)
    parser.add_argument("--validate", default=None, help="Validation shards: train --epochs, then predict them.")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--output_prefix", default="/tmp/yt8m-tf", help="Where --validate writes its CSV files.")
    args = parser.parse_args()
    batches = _batches(args.data, args.batch_size)
    for name in args.models.split(","):
        model = {"LogisticModel": Logistic, "MoeModel": Moe}[name]()
        if args.validate:
            _train_and_predict(model, args, f"{args.output_prefix}-{name}")
            print(f"wrote {args.output_prefix}-{name}-predictions.csv and -labels.csv", flush=True)
            continue
        speed = _time_model(model, batches, args.steps, args.warmup)
        print(json.dumps({"model": name, "tensorflow": tf.__version__, "batch_size": args.batch_size,
                          "examples_per_sec": round(speed, 1), "threads": tf.config.threading.get_intra_op_parallelism_threads()}),
              flush=True)


if __name__ == "__main__":
    main()
