"""The warm path of in-place restarts, operator side: which command lines the launcher can
run (decide/warm.py), how a pod is rendered around it, what the pod's launcher report makes of
the worker (observe.py), and the agent's side of the channel (GET /trainer, and the sidecar
leaving a new generation to a launcher that beats)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from multiworker.api import contract, names
from multiworker.clients.launchers import (
    Launchers,
    LauncherTarget,
    kept,
    launcher_targets,
    trainer_url,
)
from multiworker.decide.warm import WarmCommand, warm_command
from multiworker.decide.workers import WorkerPhase, classify
from multiworker.pod import children
from multiworker.reconcile.render import (
    owner_reference,
    pod_digest,
    render_worker_pod,
    shipped_scripts,
)

from tests.support import free_port
from tests.unit.builders import make_job
from tests.unit.test_agent import (
    first_poll_done,
    start,
    still_running,
    write,
)
from tests.unit.test_in_place import on_kubelet
from tests.unit.test_reconcile import make, step

Manifest = dict[str, Any]


@pytest.mark.parametrize(("container", "expected"), [
    ({"command": ["python3", "/app/train.py"]}, WarmCommand(("python3", "/app/train.py"),
                                                           "command")),
    ({"args": ["python3", "-u", "train.py", "--epochs", "3"]},
     WarmCommand(("python3", "-u", "train.py", "--epochs", "3"), "args")),
    ({"command": ["python"], "args": ["-m", "trainer.main", "-x"]},
     WarmCommand(("python", "-m", "trainer.main", "-x"), "command")),
    ({"command": ["/usr/bin/python3.11", "-X", "dev", "-c", "print(1)"]},
     WarmCommand(("/usr/bin/python3.11", "-X", "dev", "-c", "print(1)"), "command")),
    ({}, "the training container sets neither command nor args (the image's own runs)"),
    ({"command": ["bash", "-c", "python3 train.py"]},
     "its command runs 'bash', not a Python interpreter"),
    ({"args": ["python3", "-E", "train.py"]},
     "python -E ignores PYTHONPATH: a spare interpreter could not be prepared"),
    ({"args": ["python3", "-S", "train.py"]},
     "python -S skips the site module: a spare interpreter could not be prepared"),
    ({"args": ["python3", "-uB", "train.py"]},
     "python option '-uB' is not one the launcher understands"),
    ({"args": ["python3", "-m"]}, "python -m names nothing to run"),
    ({"args": ["python3", "-u"]},
     "python is started without a script, module or code (it would read stdin)"),
    ({"args": ["python3", "-"]}, "python option '-' is not one the launcher understands"),
])
def test_which_command_lines_the_launcher_runs(container: Manifest,
                                               expected: WarmCommand | str) -> None:
    assert warm_command(container) == expected


def _trainer(pod: Manifest) -> Manifest:
    return next(c for c in pod["spec"]["containers"] if c["name"] == "tensorflow")


def _template(**container: Any) -> Manifest:
    return {"spec": {"containers": [{"name": "tensorflow", "image": "w:1", **container}]}}


IN_PLACE = {"mode": "InPlace"}


def test_an_in_place_pod_runs_its_trainer_in_the_launcher_keeping_the_entrypoint() -> None:
    job = make_job(restartPolicy=IN_PLACE, template=_template(
        args=["python3", "train.py", "$(MWJ_CHECKPOINT_DIR)"],
        env=[{"name": "A", "value": "1"}]))
    pod = render_worker_pod(job, 0, 2, owner_reference(job), agent=True)
    trainer = _trainer(pod)
    assert "command" not in trainer  # the image's entrypoint (an init, say) stays
    assert trainer["args"] == ["python3", "/opt/multiworker-agent/launcher.py"]
    env = [e["name"] for e in trainer["env"]]
    # Last, a word each: the kubelet expands each word's $(VAR) from everything before.
    words = [f"{contract.MWJ_LAUNCHER_ARG_PREFIX}{i}" for i in range(3)]
    assert env[-4:] == [contract.MWJ_LAUNCHER_ARGC, *words] and env.index("A") < len(env) - 4
    values = {e["name"]: e.get("value") for e in trainer["env"]}
    assert values[contract.MWJ_LAUNCHER_ARGC] == "3"
    assert [values[w] for w in words] == ["python3", "train.py", "$(MWJ_CHECKPOINT_DIR)"]
    assert values[contract.MWJ_LAUNCHER_PRELOAD] == "tensorflow"
    assert values[contract.MWJ_LAUNCHER_HOOK] == "/opt/multiworker-agent/warm"
    mounts = {m["name"]: m.get("readOnly", False) for m in trainer["volumeMounts"]}
    assert mounts == {names.AGENT_POD_INFO_VOLUME: True, names.AGENT_STATE_VOLUME: False,
                      names.AGENT_SCRIPT_VOLUME: True}
    items = next(v for v in pod["spec"]["volumes"]
                 if v["name"] == names.AGENT_SCRIPT_VOLUME)["configMap"]["items"]
    # Every file of multiworker/pod/ beside the agent, the hook as the spares' sitecustomize.
    assert {i["path"] for i in items} == {"agent.py", "notes.py", "state.py", "launcher.py",
                                          "children.py", "warm/sitecustomize.py"}
    assert pod["metadata"]["annotations"][names.ANNOTATION_WARM_AGENT_PORT] == "8472"


def kubelet_expand(text: str, env: dict[str, str]) -> str:
    """What the kubelet does to a container's args and env values (Kubernetes'
    third_party/forked/golang/expansion): $(VAR) becomes VAR's value where VAR is defined,
    $$ a literal $, anything else stays."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("$(", i) and ")" in text[i:]:
            end = text.index(")", i)
            name = text[i + 2:end]
            out.append(env.get(name, text[i:end + 1]))
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


@pytest.mark.parametrize("value", ['{"lr": 0.1}', "C:\\temp\\new", "it's \"quoted\"", "$$(HOME)"])
def test_the_launcher_runs_exactly_the_line_the_kubelet_would_have(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each word of the line in its own variable: the kubelet's $(VAR) expansion cannot break
    it. Expanded inside one JSON text, a value with a quote broke the launcher at every start
    (JSONDecodeError) and one with backslashes turned into a tab and a newline."""
    args = ["python3", "train.py", "--config", "$(CFG)", "--dir=$(CFG)/x"]
    job = make_job(restartPolicy=IN_PLACE, template=_template(
        args=args, env=[{"name": "CFG", "value": value}]))
    trainer = _trainer(render_worker_pod(job, 0, 0, owner_reference(job), agent=True))
    environ: dict[str, str] = {}
    for var in trainer["env"]:  # in order: each sees the ones before it
        environ[var["name"]] = kubelet_expand(var.get("value", ""), environ)
    cold = [kubelet_expand(word, environ) for word in args]  # what the kubelet would run
    for name, word in environ.items():
        monkeypatch.setenv(name, word)
    assert children.rendered_command().line == cold
    assert cold[3] == kubelet_expand(value, {})


def test_a_command_is_replaced_by_the_launcher_and_more_modules_are_preloaded() -> None:
    job = make_job(restartPolicy={**IN_PLACE, "warmModules": ["tensorflow", "numpy"]},
                   template=_template(command=["python", "-m", "trainer"]))
    trainer = _trainer(render_worker_pod(job, 0, 0, owner_reference(job), agent=True))
    assert (trainer["command"], trainer["args"]) == \
        (["python", "/opt/multiworker-agent/launcher.py"], [])
    assert {e["name"]: e.get("value") for e in trainer["env"]}[
        contract.MWJ_LAUNCHER_PRELOAD] == "tensorflow,numpy"


@pytest.mark.parametrize(("restart", "container"), [
    ({**IN_PLACE, "warmStandby": False}, {"args": ["python3", "train.py"]}),
    (IN_PLACE, {"command": ["sh", "-c", "python3 train.py"]}),
])
def test_without_a_warm_standby_the_trainer_runs_its_own_command(restart: Manifest,
                                                                  container: Manifest) -> None:
    job = make_job(restartPolicy=restart, template=_template(**container))
    pod = render_worker_pod(job, 0, 0, owner_reference(job), agent=True)
    trainer = _trainer(pod)
    assert {k: trainer[k] for k in ("command", "args") if k in trainer} == container
    assert names.ANNOTATION_WARM_AGENT_PORT not in pod["metadata"]["annotations"]
    assert contract.MWJ_LAUNCHER_ARGC not in {e["name"] for e in trainer["env"]}


def test_switching_the_standby_leaves_the_pods_restartable_in_place() -> None:
    """Takes effect for pods created after: a pod restarts in place with or without the
    launcher (pods of an operator from before launchers, too)."""
    on = make_job(restartPolicy=IN_PLACE)
    off = make_job(restartPolicy={**IN_PLACE, "warmStandby": False})
    more = make_job(restartPolicy={**IN_PLACE, "warmModules": ["tensorflow", "numpy"]})
    assert len({pod_digest(on, None), pod_digest(off, None), pod_digest(more, None)}) == 1


# --- what a launcher's report on its pod makes of the worker (observe.py) ---

def _warm_pod(generation: int, released: int, report: Manifest | None) -> Manifest:
    job = make_job(restartPolicy=IN_PLACE, template=_template(args=["python3", "t.py"]))
    pod = render_worker_pod(job, 0, generation, owner_reference(job), agent=True)
    pod["metadata"] |= {"uid": "u", "creationTimestamp": "2026-01-01T11:00:00Z"}
    pod["metadata"]["annotations"][names.ANNOTATION_RELEASED] = str(released)
    if report is not None:
        pod["metadata"]["annotations"][names.ANNOTATION_LAUNCHER] = kept(report)
    pod["spec"]["nodeName"] = "n1"
    pod["status"] = {"phase": "Running", "hostIP": "10.0.0.1", "podIP": "10.1.0.5",
                     "conditions": [{"type": "PodScheduled", "status": "True"}],
                     "initContainerStatuses": [
                         {"name": names.AGENT_CONTAINER, "state": {"running": {}}},
                         {"name": names.GATE_CONTAINER, "state": {"terminated": {}}}],
                     "containerStatuses": [{"name": "tensorflow", "state": {"running": {}},
                                            "restartCount": 0}]}
    return pod


EXIT = {"exitCode": 137, "signal": 9, "reason": "Error", "message": "Killed",
        "finishedAt": "2026-01-01T12:00:05Z"}


@pytest.mark.parametrize(("pod", "phase", "reason", "exit_code"), [
    (_warm_pod(1, 1, None), WorkerPhase.RUNNING, "", None),
    (_warm_pod(1, 1, {"generation": 1, "state": "running", "path": "warm"}),
     WorkerPhase.RUNNING, "", None),
    # The launcher's trainer exited; its container runs on, so the kubelet says nothing.
    (_warm_pod(1, 1, {"generation": 1, "state": "exited", "exit": EXIT}),
     WorkerPhase.FAILED, "Error", 137),
    # Done: the launcher ends its container with 0, which the kubelet then reports.
    (_warm_pod(1, 1, {"generation": 1, "state": "exited", "exit": {**EXIT, "exitCode": 0}}),
     WorkerPhase.RUNNING, "", None),
    # A report of another generation says nothing of this one.
    (_warm_pod(2, 2, {"generation": 1, "state": "exited", "exit": EXIT}),
     WorkerPhase.RUNNING, "", None),
    # Moved on: held by the launcher (its old trainer stopped), or still stopping it.
    (_warm_pod(2, 1, {"generation": 2, "state": "held"}), WorkerPhase.STARTING,
     "WaitingForRelease", None),
    (_warm_pod(2, 1, {"generation": 1, "state": "running"}), WorkerPhase.STARTING,
     "StoppingOldTrainer", None),
])
def test_a_warm_pod_is_judged_by_its_launcher_s_report(
        pod: Manifest, phase: WorkerPhase, reason: str, exit_code: int | None) -> None:
    state = classify(pod, 0, "tensorflow")
    assert (state.phase, state.reason, state.exit_code) == (phase, reason, exit_code)
    if phase is WorkerPhase.FAILED:
        assert (state.message, state.since is not None) == ("Killed", True)


def test_the_pods_followed_are_those_running_the_launcher() -> None:
    warm = _warm_pod(0, 0, None)
    cold = _warm_pod(0, 0, None)
    del cold["metadata"]["annotations"][names.ANNOTATION_WARM_AGENT_PORT]
    going = _warm_pod(0, 0, None)
    going["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    assert launcher_targets([warm, cold, going]) == [
        LauncherTarget("ml", "demo-worker-0", "u", "10.1.0.5", 8472)]
    assert kept({"version": 3, "beat": 1.0, "pid": 7}) == ""
    assert json.loads(kept({"version": 3, "generation": 1, "state": "held", "pid": 7})) == {
        "generation": 1, "state": "held", "path": None, "why": None, "exit": None}


# --- the agent's side of the channel (pod/agent.py, run as the pods run it) ---

def _report(tmp_path: Path, **fields: Any) -> None:
    path = tmp_path / "state" / "launcher.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"beat": time.time(), **fields}))
    tmp.replace(path)


def _get(port: int, uid: str, **query: Any) -> tuple[int, Manifest]:
    target = LauncherTarget("ml", "p", uid, "127.0.0.1", port)
    url = trainer_url(target) + "?" + "&".join(f"{k}={v}" for k, v in
                                              {"uid": uid, **query}.items())
    deadline = time.monotonic() + 5
    while True:
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                return int(response.status), json.loads(response.read())
        except urllib.error.HTTPError as e:
            return e.code, {}
        except OSError:  # not listening yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.fixture(autouse=True)
def folders(tmp_path: Path) -> None:
    (tmp_path / "pod").mkdir()
    (tmp_path / "state").mkdir()


def test_the_agent_answers_for_its_pod_alone_and_holds_a_request_until_news(
        tmp_path: Path) -> None:
    port = free_port()
    write(tmp_path, generation=0, released=0)
    _report(tmp_path, version=1, generation=0, state="running")
    watch = start(tmp_path, "watch", port)
    try:
        assert _get(port, "uid-other")[0] == 409
        assert _get(port, "uid-1", version=0, wait=5) == \
            (200, json.loads((tmp_path / "state" / "launcher.json").read_text()))
        began = time.monotonic()
        assert _get(port, "uid-1", version=1, wait=0.5)[1]["version"] == 1  # no news
        assert time.monotonic() - began >= 0.5
        threading.Timer(0.5, _report, (tmp_path,), {"version": 2, "generation": 0,
                                                    "state": "exited"}).start()
        began = time.monotonic()
        assert _get(port, "uid-1", version=1, wait=10)[1]["state"] == "exited"
        assert 0.4 <= time.monotonic() - began < 5
    finally:
        watch.kill()


def test_the_operator_follows_a_launcher_and_hears_each_change_once(tmp_path: Path) -> None:
    port = free_port()
    write(tmp_path, generation=0, released=0)
    watch = start(tmp_path, "watch", port)
    heard: list[str] = []

    async def follow() -> None:
        async def on_report(target: LauncherTarget, report: str) -> None:
            heard.append(report)

        launchers = Launchers(on_report)
        launchers.follow(("ml", "demo"), [LauncherTarget("ml", "p", "uid-1", "127.0.0.1", port)])
        try:
            for version, state in ((1, "running"), (2, "running"), (3, "exited")):
                _report(tmp_path, version=version, generation=0, state=state)
                await asyncio.sleep(0.6)
        finally:
            await launchers.close()

    try:
        asyncio.run(follow())
        assert [json.loads(r)["state"] for r in heard] == ["running", "exited"]
    finally:
        watch.kill()


@contextlib.contextmanager
def beating_launcher(tmp_path: Path, generation: int, state: str) -> Iterator[threading.Event]:
    """A launcher's report rewritten every 0.2 s (its heartbeat) until the event is set."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            _report(tmp_path, version=5, generation=generation, state=state)
            time.sleep(0.2)

    beating = threading.Thread(target=beat)
    beating.start()
    try:
        yield stop
    finally:
        stop.set()
        beating.join()


def test_the_sidecar_leaves_a_new_generation_to_a_beating_launcher(tmp_path: Path) -> None:
    write(tmp_path, generation=0, released=0)
    watch = start(tmp_path, "watch")
    first_poll_done(tmp_path, watch)
    write(tmp_path, opened=0)  # the gate let generation 0's trainer start
    try:
        # The launcher stopped its trainer and holds generation 1.
        with beating_launcher(tmp_path, 1, "held") as silent:
            write(tmp_path, generation=1)
            assert still_running(watch, 1.0)
            write(tmp_path, released=1, opened=1)  # the launcher's go, as the gate's
            write(tmp_path, generation=2)
            silent.set()  # and it falls silent: the sidecar takes over
        assert watch.wait(10) == 86
    finally:
        watch.kill()


def test_the_sidecar_takes_over_from_a_launcher_that_does_not_stop_its_trainer(
        tmp_path: Path) -> None:
    write(tmp_path, generation=0, released=0)
    watch = start(tmp_path, "watch")
    first_poll_done(tmp_path, watch)
    write(tmp_path, opened=0)  # the gate let generation 0's trainer start
    try:
        with beating_launcher(tmp_path, 0, "stopping"):  # its trainer never stops
            write(tmp_path, generation=1)
            began = time.monotonic()
            assert watch.wait(15) == 86
            assert time.monotonic() - began >= 7  # LAUNCHER_STOP_SECONDS
    finally:
        watch.kill()


def test_a_spare_s_hook_runs_the_users_command_line_once_told_to(tmp_path: Path) -> None:
    """The spare interpreter (pod/warm_hook.py as sitecustomize): the user's own command
    line, the preloads imported before the go, the generation's environment after it."""
    hook = tmp_path / "warm"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(shipped_scripts()[names.WARM_HOOK_KEY])
    (tmp_path / "heavy.py").write_text("import time\nLOADED = time.time()\n")
    status_r, status_w = os.pipe()
    command_r, command_w = os.pipe()
    code = "import heavy, os, sys, time; print(heavy.LOADED, time.time(), os.environ['G'], sys.argv)"
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": f"{hook}:{tmp_path}",
           "MWJ_WARM_FDS": f"{status_w},{command_r}", "MWJ_LAUNCHER_PRELOAD": "heavy"}
    spare = subprocess.Popen([sys.executable, "-c", code, "x"], env=env, cwd=tmp_path,
                             pass_fds=(status_w, command_r), stdout=subprocess.PIPE, text=True)
    os.close(status_w)
    os.close(command_r)
    try:
        assert os.read(status_r, 100) == b"ready\n"
        time.sleep(0.3)
        told = time.time()
        os.write(command_w, json.dumps({"env": {"G": "7", "PATH": os.environ["PATH"]}}).encode())
        os.close(command_w)
        out, _ = spare.communicate(timeout=20)
        loaded, ran, generation, argv = out.split(" ", 3)
        assert float(loaded) < told <= float(ran)
        assert (generation, argv.strip()) == ("7", "['-c', 'x']")
    finally:
        spare.kill()
        os.close(status_r)


# --- what the group's creation says of it (creation.py) ---

@pytest.mark.parametrize(("restart", "container", "said"), [
    (IN_PLACE, {"command": ["sh", "-c", "python3 train.py"]},
     ("in-place restarts start the trainer cold: its command runs 'sh', not a Python "
     "interpreter")),
    (IN_PLACE, {"args": ["python3", "train.py"]}, None),
    ({**IN_PLACE, "warmStandby": False}, {"command": ["sh"]}, None),  # asked for nothing
])
def test_a_group_whose_trainers_restart_cold_says_why(restart: Manifest, container: Manifest,
                                                      said: str | None) -> None:
    cluster = on_kubelet(make(restartPolicy=restart, template=_template(**container)))
    step(cluster)
    warned = [m for _, reason, m in cluster.events if reason == "WarmStandbyOff"]
    assert warned == ([said] if said else [])
    wrapped = [names.ANNOTATION_WARM_AGENT_PORT in p["metadata"]["annotations"]
               for p in cluster.pods.values()]
    assert wrapped == [said is None and restart.get("warmStandby", True)] * len(wrapped)
