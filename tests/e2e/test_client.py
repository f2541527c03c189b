"""The Python client and `kubectl mwj` on a real job, as a notebook and a shell use them: one run
of the CPU example (two workers, restarted in place once) serves both, to keep the tier short.

`kubectl mwj submit -f examples/cpu-job.yaml ... --wait` runs in the background while Python
follows the job's progress, kills the chief's trainer, waits for the end and reads the logs of
both generations and the history; then `kubectl mwj status` and `logs` must say the same as the
job's status. Bad input and an unreachable cluster come first: they create nothing.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from multiworker.client import Client, ClientError

from tests.cluster import REPO, Cluster
from tests.e2e.test_in_place import kill_trainer, launcher_report
from tests.integration.jobs import BASE, Jobs
from tests.support import wait_for

pytestmark = pytest.mark.usefixtures("images", "worker_image", "operator")

EXAMPLE = REPO / "examples" / "cpu-job.yaml"
NAME = "digits-cpu"  # the example's
# A run long enough to be killed mid-way (40 epochs of 90 steps: ~20 s at this machine's
# 200 steps/s, unloaded) that a restart does not fail: frequent checkpoints, and no accuracy
# target (the example's 0.9 holds, but a test of the client need not depend on it).
TRAINING = {"TRAIN_EPOCHS": "40", "TRAIN_BATCH_SIZE": "8", "TRAIN_CHECKPOINT_EVERY": "20",
            "TRAIN_TARGET_ACCURACY": "0"}
KILL_AFTER_STEP = 200
RESTART_REASONS_NOT = {None, "ChiefSucceeded", "AllWorkersSucceeded"}


def kubectl_mwj(cluster: Cluster) -> tuple[list[str], dict[str, str]]:
    """How kubectl runs the plugin: `kubectl mwj` with this venv's bin on PATH, where the
    cluster's kubectl is found; else the console script itself."""
    venv_bin = Path(sys.executable).parent
    env = {**cluster.env, "PATH": f"{venv_bin}{os.pathsep}{cluster.env['PATH']}"}
    kubectl = cluster.kubectl_path()
    if Path(kubectl).is_file() and (venv_bin / "kubectl-mwj").exists():
        return [kubectl, "mwj"], env
    return [str(venv_bin / "kubectl-mwj")], env


def run_mwj(cluster: Cluster, *args: str, env: dict[str, str] | None = None,
            ) -> subprocess.CompletedProcess[str]:
    command, plugin_env = kubectl_mwj(cluster)
    proc = subprocess.run([*command, *args], capture_output=True, text=True, timeout=300,
                          env={**plugin_env, **(env or {})}, check=False)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def one_error(proc: subprocess.CompletedProcess[str], code: int) -> str:
    lines = proc.stderr.splitlines()
    assert proc.returncode == code and len(lines) == 1 and lines[0].startswith("error: "), \
        (proc.returncode, proc.stderr)
    return lines[0]


def assert_bad_input_is_refused_in_one_line(cluster: Cluster, namespace: str,
                                            tmp_path: Path) -> None:
    missing = run_mwj(cluster, "-n", namespace, "submit", "--name", "nothing", "--image",
                      "multiworker.local/worker:dev", "--claim", "no-such-claim", "--command",
                      "python3", "-c", "pass")
    assert "PersistentVolumeClaim 'no-such-claim' does not exist" in one_error(missing, 2)
    (manifest,) = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    manifest["metadata"]["name"] = "unknown-field"
    manifest["spec"]["bogusField"] = 1  # the API models ignore it; the API server may not
    path = tmp_path / "unknown-field.yaml"
    path.write_text(yaml.safe_dump(manifest))
    unknown = run_mwj(cluster, "-n", namespace, "submit", "-f", str(path))
    assert "bogusField" in one_error(unknown, 2)
    nowhere = tmp_path / "unreachable-kubeconfig"
    nowhere.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "x", "user": {}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}]}))
    unreachable = run_mwj(cluster, "list", env={"KUBECONFIG": str(nowhere)})
    assert "cannot reach the cluster at https://127.0.0.1:1" in one_error(unreachable, 5)


def kill_the_chief_once_it_trained(client: Client, jobs: Jobs, done: list[str]) -> None:
    """From beside the notebook: SIGKILL the chief's trainer once it passed KILL_AFTER_STEP."""
    try:
        for update in client.get(NAME).progress(timeout=300):
            if (update.step or 0) >= KILL_AFTER_STEP:
                break
        chief = f"{NAME}-worker-0"
        wait_for(lambda: launcher_report(jobs, chief).get("trainerPid"), 60,
                 describe="the chief's launcher running its trainer")
        kill_trainer(jobs, chief)
        done.append("killed")
    except (AssertionError, ClientError, OSError, subprocess.SubprocessError) as e:
        # said to the test's own thread, which asserts `done`
        done.append(f"{type(e).__name__}: {e}")


def test_a_job_restarted_in_place_through_the_client_and_kubectl_mwj(
    cluster: Cluster, jobs: Jobs, checkpoint_claim: str, tmp_path: Path,
) -> None:
    namespace = jobs.namespace
    assert_bad_input_is_refused_in_one_line(cluster, namespace, tmp_path)
    # kubectl mwj submits a job of its own and waits for it: a local script (shipped in a
    # ConfigMap the job owns), in the small image.
    script = tmp_path / "hello.py"
    script.write_text("import os\nprint('hello from worker', os.environ['MWJ_WORKER_INDEX'])\n")
    hello = run_mwj(cluster, "-n", namespace, "submit", "--name", "hello", "--image", BASE,
                    "--workers", "1", "--script", str(script), "--wait")
    assert hello.returncode == 0 and hello.stdout.endswith("job hello Succeeded\n"), \
        (hello.stdout, hello.stderr)
    said = run_mwj(cluster, "-n", namespace, "logs", "hello")
    assert said.stdout == "[worker-0 gen 0] hello from worker 0\n", (said.stdout, said.stderr)
    shipped = json.loads(jobs.kubectl("get", "configmap", "hello-script", "-o", "json").stdout)
    assert [o["name"] for o in shipped["metadata"]["ownerReferences"]] == ["hello"]
    # ... and the CPU example, followed to its end (3 epochs: a short run).
    plugin_run = run_mwj(cluster, "-n", namespace, "submit", "-f", str(EXAMPLE), "--name",
                         "digits-plugin", "--workers", "2", "--cpu", "200m", "--env",
                         "TRAIN_EPOCHS=3", "--follow")
    assert plugin_run.returncode == 0 and "Succeeded" in plugin_run.stdout, \
        (plugin_run.stdout[-2000:], plugin_run.stderr)
    assert jobs.status("digits-plugin")["phase"] == "Succeeded"

    # What a notebook does (the README's ten lines): submit, follow with a progress bar, read
    # the logs of every generation and the history. The kill comes from beside it.
    assert checkpoint_claim == "checkpoints"  # the example's claim
    killed: list[str] = []
    client = Client(namespace=namespace, kubeconfig=str(cluster.kubeconfig))
    job = client.submit(EXAMPLE, workers=2, restart_mode="InPlace", cpu="200m", env=TRAINING)
    threading.Thread(target=kill_the_chief_once_it_trained, args=(client, jobs, killed),
                     daemon=True).start()
    bar = io.StringIO()
    status = job.follow(progress_bar=True, timeout=400, out=bar)
    lines = list(job.logs(generation="all"))
    history = job.history()
    assert killed == ["killed"], killed
    assert status.phase == "Succeeded", (status, bar.getvalue()[-2000:])
    assert "step/s" in bar.getvalue() or "step" in bar.getvalue(), bar.getvalue()[-500:]

    assert (status.restarts, status.restart_path, status.group_generation) == \
        (1, "InPlace", 1), status
    # The chief's lines of both generations, labelled: its pod lived through the restart.
    assert {line.generation for line in lines if line.worker == 0} >= {0, 1}, lines[-20:]
    headers = [line for line in lines if line.worker == 0 and line.text.startswith("==== ")]
    assert [(h.generation, str(h)[:17]) for h in headers] == [
        (0, "[worker-0 gen 0] "), (1, "[worker-0 gen 1] ")], headers
    assert [(r.generation, r.path) for r in history] == [(0, "Created"), (1, "InPlace")], \
        history
    first = history[0]
    assert first.reason not in RESTART_REASONS_NOT and first.ended is not None, first
    status = job.status()
    assert first.steps_lost is not None and status.last_failure is not None
    assert first.steps_lost == status.last_failure.steps_lost, (first, status.last_failure)

    # kubectl mwj on the same job: the same facts as the job's status (read again until the
    # operator's last write after the end, the workers' readiness, has landed).
    def shown_as_stored() -> bool:
        shown = run_mwj(cluster, "-n", namespace, "status", NAME, "-o", "json")
        return shown.returncode == 0 and json.loads(shown.stdout) == jobs.status(NAME)
    wait_for(shown_as_stored, 30, describe="kubectl mwj status -o json to equal the status")
    waited = run_mwj(cluster, "-n", namespace, "wait", NAME, "--for", "Succeeded",
                     "--timeout", "10s")
    assert waited.returncode == 0, (waited.stdout, waited.stderr)
    table = run_mwj(cluster, "-n", namespace, "status", NAME)
    rows = [line.split() for line in table.stdout.splitlines()]
    assert table.returncode == 0 and ["Restarts:", "1", "(disruptions", "0)"] in rows, \
        table.stdout
    generations = [row for row in rows if row[:1] in (["0"], ["1"])]
    assert [row[:3] for row in generations] == [["0", "2", "Created"], ["1", "2", "InPlace"]], \
        table.stdout
    assert first.reason in generations[0] and generations[0][-1] == str(first.steps_lost), \
        table.stdout
    logs = run_mwj(cluster, "-n", namespace, "logs", NAME, "--all")
    assert logs.returncode == 0, logs.stderr
    assert "[worker-0 gen 0] " in logs.stdout and "[worker-0 gen 1] " in logs.stdout
    print(bar.getvalue()[-1500:], table.stdout, sep="\n")  # the transcript, with -s
