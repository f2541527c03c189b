"""Keras users' own code in a MultiWorkerJob (docs/keras.md): the tutorial-shaped example
(examples/keras-job.yaml) survives a SIGKILL in both restart modes with Keras resuming from
its backup on the volume, and a script that fails the same way before training fails the job
after its second try with the error's own words (RepeatedStartupError)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import Cluster
from tests.e2e.test_examples import example
from tests.e2e.test_in_place import kill_trainer
from tests.e2e.test_recovery import MODES, SIGNAL_TRAINER, tf_job
from tests.integration.jobs import Jobs, condition
from tests.runtime.test_keras_users import SNIPPET
from tests.support import wait_for

pytestmark = pytest.mark.usefixtures("worker_image", "operator")


def started_epochs(log: str) -> list[int]:
    return [int(n) for n in re.findall(r"^Epoch (\d+)/\d+$", log, re.MULTILINE)]


def chief_log(jobs: Jobs, name: str) -> str:
    return str(jobs.kubectl("logs", f"{name}-worker-0", "-c", "tensorflow", check=False).stdout)


@MODES
def test_the_keras_example_resumes_from_its_backup_after_a_sigkill(
    jobs: Jobs, checkpoint_claim: str, cluster: Cluster, mode: str, record_property: Any
) -> None:
    (manifest,) = example("keras-job.yaml")
    manifest["spec"]["checkpoint"]["claimName"] = checkpoint_claim
    manifest["spec"]["restartPolicy"].update(backoffSeconds=1, mode=mode)
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    container["resources"] = {"requests": {"cpu": "100m", "memory": "256Mi"}}
    name = manifest["metadata"]["name"]
    jobs.apply(manifest)

    wait_for(lambda: max(started_epochs(chief_log(jobs, name)), default=0) >= 3, 300,
             describe=lambda: f"the chief in epoch 3\n{jobs.describe(name)}")
    if mode == "InPlace":
        kill_trainer(jobs, f"{name}-worker-1")
    else:
        out = jobs.kubectl("exec", f"{name}-worker-1", "-c", "tensorflow", "--", "python3",
                           "-c", SIGNAL_TRAINER.replace('b"train.py"', 'b"keras_tutorial.py"'),
                           "SIGKILL").stdout
        assert "signalled" in out, out
    killed_in = max(started_epochs(chief_log(jobs, name)))

    status = jobs.wait_phase(name, "Succeeded", timeout=420)
    # Recreated, the chief's pod is new; in place, its log holds both generations, the last
    # after the warm launcher's header.
    log = chief_log(jobs, name).rsplit("==== multiworker: generation", 1)[-1]
    epochs = started_epochs(log)
    resumed = epochs[0] if epochs else None
    record_property("figure: keras", f"keras example ({mode}): SIGKILL in epoch {killed_in} "
                    f"-> resumed at epoch {resumed}, restarts {status['restarts']}")
    assert status["restarts"] == 1 and status["lastFailure"]["worker"] == 1, status
    assert resumed is not None and 1 < resumed <= killed_in + 1, (killed_in, log[-3000:])
    assert epochs[-1] == 30 and "saved the model to" in log, log[-3000:]
    uid = jobs.get(name)["metadata"]["uid"]  # type: ignore[index]
    volume = Path(str(cluster.shared_dir)) / "e2e" / jobs.namespace / jobs.namespace
    assert (volume / f"{name}-{uid}" / "model" / "saved_model.pb").is_file()


@MODES
def test_a_script_that_fails_at_import_fails_the_job_after_its_second_try(
    jobs: Jobs, mode: str, record_property: Any
) -> None:
    manifest = tf_job("importerror", restartPolicy={"backoffSeconds": 1, "mode": mode})
    del manifest["spec"]["checkpoint"]
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    container["args"] = ["python3", "-c", "import numpy\nimport no_such_module_mwj\n"]
    jobs.apply(manifest)

    status = jobs.wait_phase("importerror", "Failed", timeout=240)
    failed = condition(status, "Failed")
    record_property("figure: keras", f"import error ({mode}): Failed after "
                    f"{status['restarts']} restart(s): {failed and failed['message']}")
    assert failed and failed["reason"] == "RepeatedStartupError", status
    assert status["restarts"] == 1, status
    assert "ModuleNotFoundError: No module named 'no_such_module_mwj'" in failed["message"]
    assert "hint: the image lacks that module" in failed["message"]
    assert "ModuleNotFoundError" in status["lastFailure"]["message"], status["lastFailure"]
    jobs.wait_event("importerror", "Warning", "RepeatedStartupError")  # after the status write
    events = [m for _, reason, m in jobs.events("importerror")
              if reason == "RepeatedStartupError"]
    assert events and "No module named 'no_such_module_mwj'" in events[0], jobs.events(
        "importerror")


def test_the_strategys_own_snippet_succeeds_on_the_image(jobs: Jobs) -> None:
    """MultiWorkerMirroredStrategy's documented `model.fit(dist_dataset)`, on Keras 2."""
    manifest = tf_job("snippet", env={"TF_USE_LEGACY_KERAS": "1"})
    del manifest["spec"]["checkpoint"]
    manifest["spec"]["template"]["spec"]["containers"][0]["args"] = ["python3", "-c", SNIPPET]
    jobs.apply(manifest)
    status = jobs.wait_phase("snippet", "Succeeded", timeout=240)
    assert status["restarts"] == 0, status
    assert "fit done on tf_keras" in chief_log(jobs, "snippet")
