"""TensorFlow's "Multi-worker training with Keras" tutorial, as its readers write it: a
Sequential model compiled in `strategy.scope()`, `model.fit` with `BackupAndRestore`, and the
model saved by every worker at the end (the chief's copy is the one kept). It imports nothing
of multiworker: TF_CONFIG, which the operator injects, is all it reads.

Keras 3 (tf.keras since TensorFlow 2.16) cannot run `model.fit` under
MultiWorkerMirroredStrategy; run it with Keras 2: TF_USE_LEGACY_KERAS=1 and tf-keras, which
the worker images carry (docs/keras.md).

The data are the handwritten digits beside this script (data/digits.csv.gz), not the
tutorial's MNIST download: the pods have no internet. Settings come from the environment:
BACKUP_DIR (default: $MWJ_CHECKPOINT_DIR/backup — on the volume every worker mounts, as
Keras 2 restores every worker from the chief's backup), MODEL_DIR, EPOCHS, STEPS_PER_EPOCH,
BATCH_PER_WORKER.
"""

import gzip
import json
import os
import tempfile

import numpy as np
import tensorflow as tf

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "digits.csv.gz")


def digits_dataset(global_batch_size):
    with gzip.open(DATA, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    images, labels = table[:, :64] / 16.0, table[:, 64].astype(np.int64)
    return (tf.data.Dataset.from_tensor_slices((images, labels))
            .shuffle(len(images), seed=1).repeat().batch(global_batch_size))


def build_and_compile_model():
    model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(64,)),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.1),
        metrics=["accuracy"],
    )
    return model


def is_chief(task_type, task_id):
    return task_type == "chief" or (task_type == "worker" and task_id == 0)


def main():
    tf_config = json.loads(os.environ["TF_CONFIG"])
    num_workers = len(tf_config["cluster"]["worker"])
    task_type, task_id = tf_config["task"]["type"], tf_config["task"]["index"]

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    global_batch_size = int(os.environ.get("BATCH_PER_WORKER", "32")) * num_workers
    dataset = digits_dataset(global_batch_size)
    with strategy.scope():
        model = build_and_compile_model()

    backup_dir = os.environ.get("BACKUP_DIR") or os.path.join(
        os.environ["MWJ_CHECKPOINT_DIR"], "backup")
    model.fit(
        dataset,
        epochs=int(os.environ.get("EPOCHS", "20")),
        steps_per_epoch=int(os.environ.get("STEPS_PER_EPOCH", "20")),
        callbacks=[tf.keras.callbacks.BackupAndRestore(backup_dir=backup_dir)],
        verbose=2,
    )

    # Every worker saves (the save runs collectives); only the chief's copy is kept.
    model_dir = os.environ.get("MODEL_DIR") or os.path.join(
        os.environ["MWJ_CHECKPOINT_DIR"], "model")
    path = model_dir if is_chief(task_type, task_id) else os.path.join(
        tempfile.mkdtemp(), f"worker-{task_id}")
    model.save(path)
    print(f"saved the model to {path}", flush=True)


if __name__ == "__main__":
    main()
