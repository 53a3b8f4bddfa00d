"""The starter kit's LogisticModel / MoeModel training step in TensorFlow 2, to time beside bench_train.py.

Reference only; yt8m never imports TensorFlow. Written from the starter kit's definitions (not its code, which
needs TF 1): a sigmoid fully connected layer (Logistic) or a softmax gate over 2 sigmoid experts plus a dummy
(MoE), L2 1e-8 on the weights, its CrossEntropyLoss on probabilities (epsilon 1e-5), Adam at 0.01, each
gradient clipped to norm 1.0 on its own, batch 1024 of mean_rgb+mean_audio over 3862 classes, one compiled
tf.function step. Input: TFRecordDataset -> batch -> parse_example -> cache() -> prefetch, so that reading is
out of the timing, as bench_train.py's RAM cache takes it out of yt8m's.
Usage: /tmp/tfvenv/bin/python bench/bench_train_tf.py --data 'DIR/video/train-*' [--models ...] [--steps 20]
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


def _batches(pattern: str, batch_size: int) -> tf.data.Dataset:
    spec = {"labels": tf.io.VarLenFeature(tf.int64)}
    spec.update({name: tf.io.FixedLenFeature([size], tf.float32) for name, size in FEATURES.items()})

    def parse(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        parsed = tf.io.parse_example(serialized, spec)
        features = tf.concat([parsed[name] for name in FEATURES], axis=1)
        labels = tf.cast(tf.sparse.to_indicator(parsed["labels"], NUM_CLASSES), tf.float32)
        return features, labels

    files = sorted(glob.glob(pattern))
    return tf.data.TFRecordDataset(files).batch(batch_size, drop_remainder=True).map(parse).cache()


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


def _time_model(model: tf.keras.Model, batches: tf.data.Dataset, steps: int, warmup: int) -> float:
    optimizer = tf.keras.optimizers.Adam(0.01)

    @tf.function
    def step(features: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = _cross_entropy(labels, model(features)) + tf.add_n(model.losses)
        gradients = [tf.clip_by_norm(g, 1.0) for g in tape.gradient(loss, model.trainable_variables)]
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    examples, started = 0, None
    for index, (features, labels) in enumerate(batches.repeat().prefetch(2).take(warmup + steps)):
        if index == warmup:
            started = time.perf_counter()
        step(features, labels).numpy()
        examples += int(features.shape[0]) if index >= warmup else 0
    return examples / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="Video-level shards, e.g. the ones bench_train.py wrote.")
    parser.add_argument("--models", default="LogisticModel,MoeModel")
    parser.add_argument("--steps", type=int, default=20, help="Timed steps, after --warmup steps.")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=1024)
    args = parser.parse_args()
    batches = _batches(args.data, args.batch_size)
    for name in args.models.split(","):
        model = {"LogisticModel": Logistic, "MoeModel": Moe}[name]()
        speed = _time_model(model, batches, args.steps, args.warmup)
        print(json.dumps({"model": name, "tensorflow": tf.__version__, "batch_size": args.batch_size,
                          "examples_per_sec": round(speed, 1), "threads": tf.config.threading.get_intra_op_parallelism_threads()}),
              flush=True)


if __name__ == "__main__":
    main()
