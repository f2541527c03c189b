"""A worker that only reads: `steps` steps of a global-batch dataset of sample ids through
runtime/inputs.distribute(skip=...), one collective per step as training has, and writes the
ids it got at each step to a JSON file. Run by test_resize_inputs.py, one process per worker.

usage: resize_reader.py WORKERS INDEX SKIP STEPS GLOBAL_BATCH OUT PORT...

With MODE=examples in the environment, it reads a dataset of single sample ids through
inputs.distribute_examples from sample SKIP instead (the input of runtime.fit(global_batch=)).
"""

import json
import os
import sys

workers, index, skip, steps, global_batch = (int(a) for a in sys.argv[1:6])
out, ports = sys.argv[6], sys.argv[7:]
os.environ["TF_CONFIG"] = json.dumps({
    "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
    "task": {"type": "worker", "index": index}})

import tensorflow as tf
from multiworker.runtime.inputs import distribute, distribute_examples

strategy = tf.distribute.MultiWorkerMirroredStrategy()
if os.environ.get("MODE") == "examples":
    examples = tf.data.Dataset.range(10**6).repeat()
    stream = iter(distribute_examples(strategy, examples, skip, global_batch))
else:
    dataset = tf.data.Dataset.range(10**6).batch(global_batch).repeat()
    stream = iter(distribute(strategy, dataset, skip=skip))


@tf.function
def step(x: tf.Tensor) -> tf.Tensor:
    return strategy.run(tf.reduce_sum, args=(x,))


seen = []
for _ in range(steps):
    batch = next(stream)
    seen.append([int(v) for t in strategy.experimental_local_results(batch)
                 for v in t.numpy().tolist()])
    strategy.reduce("SUM", step(batch), axis=None)
with open(out, "w") as f:
    json.dump(seen, f)
