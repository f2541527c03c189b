"""Keras users' own code on loopback workers, as they write it (docs/keras.md): TensorFlow's
multi-worker Keras tutorial (examples/training/keras_tutorial.py: `model.fit` with
BackupAndRestore, no multiworker import) and the strategy's own two-line `model.fit` snippet.
Keras 3 cannot run them under MultiWorkerMirroredStrategy; Keras 2 (tf-keras,
TF_USE_LEGACY_KERAS=1) can, and resumes from its backup after a SIGKILL."""

from __future__ import annotations

import re
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from multiworker.decide.tracebacks import script_error

from tests.runtime.workers import REPO, Launcher, Worker, loopback_group, wait_exits
from tests.support import wait_for

TUTORIAL = REPO / "examples" / "training" / "keras_tutorial.py"
KERAS_2 = {"TF_USE_LEGACY_KERAS": "1"}

# The snippet in MultiWorkerMirroredStrategy's documentation, compiled and fitted. Keras 2
# needs the steps of a distributed dataset ("you must specify the number of steps to run").
SNIPPET = """
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(5,))])
    model.compile(optimizer=tf.keras.optimizers.SGD(learning_rate=0.1), loss="mse")
dataset = tf.data.Dataset.from_tensors(([1.0] * 5, [1.0, 1.0])).repeat(100).batch(10)
dist_dataset = strategy.experimental_distribute_dataset(dataset)
model.fit(dist_dataset, epochs=2, steps_per_epoch=5)
print("fit done on", tf.keras.Model.__module__.split(".")[0], flush=True)
"""

pytestmark = pytest.mark.timeout(300)


def tutorial(launcher: Launcher, tmp_path: Path, generation: int = 0, **env: str
             ) -> list[Worker]:
    peers, ports = loopback_group(2)
    return launcher.start(2, generation=generation, script=TUTORIAL, peers=peers,
                          progress_ports=ports,
                          env={"BACKUP_DIR": str(tmp_path / "backup"),
                               "MODEL_DIR": str(tmp_path / "model"), **env})


def epochs_started(worker: Worker) -> list[int]:
    return [int(n) for n in re.findall(r"^Epoch (\d+)/\d+$", worker.log(), re.MULTILINE)]


def test_the_tutorial_trains_on_keras_2_and_the_chief_saves_the_model(
    launcher: Launcher, tmp_path: Path, report: Any
) -> None:
    group = tutorial(launcher, tmp_path, EPOCHS="3", **KERAS_2)
    exits = wait_exits(group, 240, group[0].started)
    report(f"keras tutorial, 2 workers, 3 epochs on Keras 2 -> exits {exits}")
    assert {code for code, _ in exits.values()} == {0}, launcher.logs()
    assert epochs_started(group[0]) == [1, 2, 3]
    assert (tmp_path / "model" / "saved_model.pb").is_file()
    assert not (tmp_path / "model-worker-1").exists()  # the others save to temporary dirs


def test_the_strategys_own_snippet_fits_on_keras_2(launcher: Launcher, tmp_path: Path) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(SNIPPET)
    peers, ports = loopback_group(2)
    group = launcher.start(2, script=script, peers=peers, progress_ports=ports, env=KERAS_2)
    assert [w.wait(timeout=240) for w in group] == [0, 0], launcher.logs()
    assert all("fit done on tf_keras" in w.log() for w in group)


def test_keras_3_fails_with_an_error_the_operator_names_and_hints_at(
    launcher: Launcher, tmp_path: Path
) -> None:
    """What a user sees who does not select Keras 2: the upstream limitation, which the
    operator turns into one line and a hint (decide/tracebacks.py) instead of a NumPy dump."""
    group = tutorial(launcher, tmp_path, EPOCHS="1", TF_USE_LEGACY_KERAS="0")
    assert [w.wait(timeout=240) for w in group] == [1, 1], launcher.logs()
    error = script_error(group[0].log()[-2048:])  # what the kubelet keeps
    assert error is not None, group[0].log()[-2048:]
    assert error.type == "ValueError" and "PerReplica" in error.message
    assert "TF_USE_LEGACY_KERAS=1" in (error.hint() or "")
    assert 'keras_tutorial.py", line' in error.frames[0]


def test_a_sigkilled_group_resumes_from_keras_backup_at_a_later_epoch(
    launcher: Launcher, tmp_path: Path, report: Any
) -> None:
    """BackupAndRestore under MWMS: the chief writes the backup, every worker restores from it,
    so it lives where all of them see it (here one directory; in a job the checkpoint volume)."""
    slow = {"EPOCHS": "12", "STEPS_PER_EPOCH": "40", **KERAS_2}
    first = tutorial(launcher, tmp_path, **slow)
    wait_for(lambda: max(epochs_started(first[0]), default=0) >= 4, timeout=240,
             describe=launcher.logs)
    for worker in reversed(first):
        worker.signal(signal.SIGKILL)
    killed_in = max(epochs_started(first[0]))
    second = tutorial(launcher, tmp_path, generation=1, **slow)
    exits = wait_exits(second, 240, second[0].started)
    resumed = epochs_started(second[0])
    report(f"keras tutorial SIGKILLed in epoch {killed_in} -> resumed at epoch {resumed[:1]}, "
           f"exits {exits}")
    assert {code for code, _ in exits.values()} == {0}, launcher.logs()
    # The backup is written at an epoch's end, before the next epoch's "Epoch N/12" line: a
    # kill between the two resumes one epoch past the last line the chief printed.
    assert 1 < resumed[0] <= killed_in + 1, (resumed, killed_in)
    assert resumed[-1] == 12
    assert (tmp_path / "model" / "saved_model.pb").is_file()
    assert not any((tmp_path / "backup").iterdir())  # fit deletes it when it returns


def test_the_venv_has_both_kerases() -> None:
    """The images and `make venv` carry tf-keras at TensorFlow's version (requirements.py)."""
    from importlib import metadata

    tf = metadata.version("tensorflow-cpu").rsplit(".", 1)[0]
    assert metadata.version("tf-keras").startswith(tf + "."), sys.path
    assert metadata.version("keras").startswith("3.")


def test_the_runtimes_own_fit_keeps_working_with_keras_2_selected(
    launcher: Launcher, tmp_path: Path
) -> None:
    """TF_USE_LEGACY_KERAS=1 changes what tf.keras is; runtime.fit and a model built with
    `import keras` (Keras 3) are untouched by it."""
    group = launcher.start(2, checkpoint_dir=tmp_path / "checkpoints",
                           args=("--epochs", "2", "--steps-per-epoch", "10", "--target-loss", "1000"),
                           env=KERAS_2)
    assert [w.wait(timeout=240) for w in group] == [0, 0], launcher.logs()


LEGACY_MODEL = """
import tensorflow as tf
from multiworker import runtime

def main(ctx):
    strategy = runtime.make_strategy(ctx)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(4,))])
        model.compile(optimizer="sgd", loss="mse")
    data = tf.data.Dataset.from_tensors(([1.0] * 4, [1.0])).repeat().batch(8)
    runtime.fit(ctx, model, data, epochs=1, steps_per_epoch=2)

runtime.run(main)
"""


def test_the_runtimes_fit_refuses_a_keras_2_model_saying_why(
    launcher: Launcher, tmp_path: Path
) -> None:
    script = tmp_path / "legacy.py"
    script.write_text(LEGACY_MODEL)
    [worker] = launcher.start(1, script=script, env=KERAS_2)
    assert worker.wait(timeout=120) == 2, launcher.logs()
    assert "runtime.fit trains Keras 3 models; this one is a tf_keras." in worker.log()
