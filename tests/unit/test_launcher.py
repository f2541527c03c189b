"""The warm launcher as a trainer container runs it (pod/launcher.py, beside agent.py, with
python3): it runs each released generation's trainer, in a spare interpreter that imported the
preloads ahead where one is ready, reports where it stands, and stops, reaps and signals as
PID 1 of its container. The preload here is a tiny module that sleeps as it is imported."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from multiworker.reconcile.render import shipped_items, shipped_scripts

from tests.support import wait_for

TIMEOUT = 20  # for what takes a fraction of a second on an idle machine
STOP_SECONDS = 1.0

# The trainer: records how it was started, then does what plan.json says for its generation.
TRAINER = r'''
import json, os, signal, subprocess, sys, time
from pathlib import Path

here = Path(os.environ["TEST_DIR"])
generation = os.environ["MWJ_RESTART_COUNT"]
plans = here / "plan.json"
plan = json.loads(plans.read_text()).get(generation, "sleep") if plans.exists() else "sleep"
record = {"pid": os.getpid(), "generation": generation, "argv": sys.argv,
          "path0": sys.path[0], "cwd": os.getcwd(), "name": __name__,
          "user": os.environ.get("USER_VAR"), "unbuffered": os.environ.get("PYTHONUNBUFFERED"),
          "warm": "warmup" in sys.modules, "pythonpath": os.environ.get("PYTHONPATH"),
          "warm_fds": os.environ.get("MWJ_WARM_FDS"),
          "hook_on_path": any(p.endswith("/warm") for p in sys.path)}
with open(here / "runs.jsonl", "a") as f:
    f.write(json.dumps(record) + "\n")
print(f"trainer of generation {generation} starts", flush=True)


def stopped(code):
    def handler(*_):
        with open(here / "signals", "a") as f:
            f.write(f"SIGTERM {generation}\n")
        sys.exit(code)
    return handler


if plan.startswith("exit:"):
    _, code, *message = plan.split(":", 2)
    if message:
        Path(os.environ["MWJ_LAUNCHER_TERMINATION_LOG"]).write_text(message[0])
    sys.exit(int(code))
if plan == "raise":
    raise RuntimeError("the trainer's own bug")
if plan == "kill":
    print("about to be killed", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
if plan == "orphan":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"],
                             start_new_session=True, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    (here / "grandchild").write_text(str(child.pid))
    sys.exit(3)
if plan == "done-once-spare-ready":
    report = here / "state" / "launcher.json"
    while json.loads(report.read_text()).get("spare") != "ready":
        time.sleep(0.05)
    sys.exit(0)
if plan == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, stopped(int(plan[5:]) if plan.startswith("term:") else 143))
(here / f"ready-{generation}").write_text("")
while True:
    time.sleep(1)
'''

# The preload: slow to import, and says who imported it when.
WARMUP = r'''
import os, time
time.sleep(float(os.environ.get("WARMUP_SECONDS", "0.3")))
with open(os.path.join(os.environ["TEST_DIR"], "imports.log"), "a") as f:
    f.write(f"{os.getpid()} {time.time()}\n")
'''

ARGS = ["--epochs", "2"]


class Pod:
    """A worker pod's folders (downwardAPI, agent state, cgroup) and its launcher."""

    def __init__(self, root: Path) -> None:
        self.root, self.job = root, root / "job"
        self.proc: subprocess.Popen[bytes] | None = None
        for folder in ("pod", "state", "agent", "lib", "job", "cgroup"):
            (root / folder).mkdir()
        for item in shipped_items():  # as the job's ConfigMap volume lays them out
            path = root / "agent" / item["path"]
            path.parent.mkdir(exist_ok=True)
            path.write_text(shipped_scripts()[item["key"]])
        (root / "lib" / "warmup.py").write_text(WARMUP)
        (root / "lib" / "broken.py").write_text('raise RuntimeError("broken on purpose")\n')
        (self.job / "train.py").write_text(TRAINER)
        (self.job / "trainmod.py").write_text(TRAINER)
        (root / "termination-log").write_text("")

    def write(self, **files: int) -> None:
        for name, value in files.items():
            folder = self.root / ("state" if name == "opened" else "pod")
            (folder / name).write_text(str(value))

    def plan(self, **by_generation: str) -> None:
        """What the trainer of each generation (g0=..., g1=...) does; else it sleeps."""
        (self.root / "plan.json").write_text(json.dumps(
            {name[1:]: what for name, what in by_generation.items()}))

    def start(self, module: str | None = None, preload: str = "warmup",
              line: list[str] | None = None, **env: str) -> subprocess.Popen[bytes]:
        """The launcher, as the operator renders it: the user's own `line` (train.py, or
        `python -m module`, by default) in the environment."""
        target = ["-m", module] if module else [str(self.job / "train.py")]
        line = line or [sys.executable, *target, *ARGS]
        argv = [sys.executable, str(self.root / "agent" / "launcher.py")]
        words = {f"MWJ_LAUNCHER_ARG_{i}": word for i, word in enumerate(line)}
        env = {"MWJ_LAUNCHER_ARGC": str(len(line)), **words, "MWJ_LAUNCHER_PRELOAD": preload,
               "MWJ_LAUNCHER_HOOK": str(self.root / "agent" / "warm"), **env}
        environ = {"PATH": os.environ["PATH"], "TEST_DIR": str(self.root),
                   "PYTHONPATH": str(self.root / "lib"),
                   "MWJ_AGENT_POD_INFO": str(self.root / "pod"),
                   "MWJ_AGENT_STATE": str(self.root / "state"),
                   "MWJ_LAUNCHER_TERMINATION_LOG": str(self.root / "termination-log"),
                   "MWJ_LAUNCHER_CGROUP": str(self.root / "cgroup"),
                   "MWJ_LAUNCHER_SPARE_DELAY": "0",
                   "MWJ_LAUNCHER_STOP_SECONDS": str(STOP_SECONDS),
                   "MWJ_WORKER_INDEX": "1", "MWJ_RESTART_COUNT": "0", "USER_VAR": "kept",
                   **env}
        with open(self.root / "out.log", "wb") as out, open(self.root / "err.log", "wb") as err:
            self.proc = subprocess.Popen(argv, env=environ, cwd=self.job, stdout=out,
                                         stderr=err)
        return self.proc

    def report(self) -> dict[str, Any]:
        try:
            found = json.loads((self.root / "state" / "launcher.json").read_text())
        except (OSError, ValueError):
            return {}
        assert isinstance(found, dict)
        return found

    def wait_report(self, describe: str, **fields: Any) -> dict[str, Any]:
        """The report once it has `fields` (spareWhy and why: contained)."""
        def matches() -> dict[str, Any] | None:
            report = self.report()
            for key, value in fields.items():
                if key in ("why", "spareWhy") and value not in report.get(key, ""):
                    return None
                if key not in ("why", "spareWhy") and report.get(key) != value:
                    return None
            return report
        return wait_for(matches, TIMEOUT, 0.02,
                        lambda: f"{describe}; last report {self.report()}, {self.logs()}")

    def runs(self) -> list[dict[str, Any]]:
        path = self.root / "runs.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [json.loads(line) for line in lines]

    def run_of(self, generation: int) -> dict[str, Any]:
        return wait_for(lambda: next((r for r in self.runs()
                                      if r["generation"] == str(generation)), None),
                        TIMEOUT, 0.02,
                        lambda: f"generation {generation}'s trainer; {self.logs()}")

    def running(self, generation: int) -> None:
        """Wait until generation's trainer has its SIGTERM handler in place."""
        wait_for(lambda: (self.root / f"ready-{generation}").exists(), TIMEOUT, 0.02,
                 lambda: f"generation {generation}'s trainer to settle; {self.logs()}")

    def imports(self) -> list[tuple[int, float]]:
        path = self.root / "imports.log"
        lines = path.read_text().splitlines() if path.exists() else []
        return [(int(pid), float(at)) for pid, at in (line.split() for line in lines)]

    def out(self) -> str:
        return (self.root / "out.log").read_text()

    def logs(self) -> str:
        return f"stdout: {self.out()[-1500:]!r}; stderr: {(self.root / 'err.log').read_text()!r}"

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in {r["pid"] for r in self.runs()} | {pid for pid, _ in self.imports()}:
            if str(self.root).encode() in cmdline(pid):  # ours still, not a pid reused
                os.killpg(pid, signal.SIGKILL)


def ours_alive(root: Path) -> list[int]:
    """Processes (not zombies: they have no command line) started for the test in `root`."""
    return [int(p.name) for p in Path("/proc").iterdir()
            if p.name.isdigit() and str(root).encode() in cmdline(int(p.name))]


def block(report: Path) -> bool:
    """Put a folder where the report goes: its next write fails (an error of the launcher's
    own)."""
    try:
        report.unlink(missing_ok=True)
        report.mkdir()
    except FileExistsError:  # written again in between
        return False
    (report / "in-the-way").write_text("")
    return True


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def gone(pid: int) -> bool:
    """Neither running nor a zombie waiting for its parent."""
    return not Path(f"/proc/{pid}").exists()


def still_running(proc: subprocess.Popen[bytes], seconds: float = 0.3) -> bool:
    time.sleep(seconds)
    return proc.poll() is None


@pytest.fixture
def pod(tmp_path: Path) -> Iterator[Pod]:
    made = Pod(tmp_path)
    try:
        yield made
    finally:
        made.close()


def test_the_first_generation_runs_the_script_with_its_arguments_and_environment(
    pod: Pod,
) -> None:
    """Started by the gate's opening of generation 2: the trainer runs at once, as `python
    train.py ARGS` would, in the generation's environment (the container's MWJ_RESTART_COUNT
    is stale), through a spare given its go at once (cold, one way to start)."""
    pod.write(generation=2, released=2, opened=2)
    pod.start()
    run = pod.run_of(2)
    assert run["argv"] == [str(pod.job / "train.py"), *ARGS]
    assert (run["name"], run["path0"], run["cwd"]) == ("__main__", str(pod.job), str(pod.job))
    assert (run["user"], run["unbuffered"]) == ("kept", "1")
    assert run["warm"]  # its spare imported the preload before running it
    report = pod.wait_report("generation 2 running", generation=2, state="running",
                             path="cold", why="first")
    assert pod.proc is not None and report["pid"] == pod.proc.pid
    assert report["exit"] is None
    wait_for(lambda: "trainer of generation 2 starts" in pod.out(), TIMEOUT, 0.02, pod.logs)
    out = pod.out()
    header = "==== multiworker: generation 2 of worker 1, cold start"
    assert header in out and out.index(header) < out.index("trainer of generation 2 starts")


def test_a_module_runs_as_under_python_dash_m(pod: Pod) -> None:
    pod.write(generation=0, released=0, opened=0)
    pod.start(module="trainmod")
    run = pod.run_of(0)
    assert run["argv"] == [str(pod.job / "trainmod.py"), *ARGS]
    assert (run["name"], run["path0"]) == ("__main__", str(pod.job))


def test_the_report_beats_and_counts_its_changes(pod: Pod) -> None:
    """Rewritten every 0.5 s (the watch sidecar takes a silent launcher for gone); its version
    moves only when what it says does."""
    pod.write(generation=0, released=0, opened=0)
    pod.start()
    first = pod.wait_report("a spare ready", spare="ready")
    time.sleep(1.2)
    again = pod.report()
    assert again["version"] == first["version"] and again["beat"] > first["beat"] + 0.4
    pod.write(generation=1)
    assert pod.wait_report("generation 1 held", state="held")["version"] > first["version"]


def test_a_restarted_launcher_counts_its_report_on_from_the_last(pod: Pod) -> None:
    """The operator long-polls for a version other than the last it saw: a launcher restarted
    with its container (the pod's state survives it) that counted from 0 again would reach
    that version with news, and the poll would sit on it for 15 s."""
    pod.write(generation=0, released=0, opened=0)
    (pod.root / "state" / "launcher.json").write_text(json.dumps(
        {"pid": 1, "version": 41, "beat": 0, "generation": 0, "state": "running"}))
    proc = pod.start()
    assert pod.wait_report("the new launcher's report", pid=proc.pid)["version"] > 41


@pytest.mark.parametrize(("plan", "code", "signum", "message"), [
    ("exit:3:checkpoint store unreachable", 3, None, "checkpoint store unreachable"),
    ("kill", 137, 9, "trainer of generation 0 starts\nabout to be killed"),
    ("raise", 1, None, "RuntimeError: the trainer's own bug"),
])
def test_a_failed_trainer_is_recorded_and_the_launcher_stays(
    pod: Pod, plan: str, code: int, signum: int | None, message: str,
) -> None:
    """Its exit as the kubelet would report it, the message from the termination log (cleared
    before each go: a stale one is not taken) or else from the trainer's last output. The
    next generation then starts, warm."""
    pod.write(generation=0, released=0, opened=0)
    (pod.root / "termination-log").write_text("a message of the container before")
    pod.plan(g0=plan)
    proc = pod.start()
    report = pod.wait_report("the trainer's exit", state="exited")
    assert report["exit"]["exitCode"] == code
    assert report["exit"]["signal"] == signum
    assert report["exit"]["reason"] == "Error"
    assert report["exit"]["message"].endswith(message)
    assert report["exit"]["finishedAt"].endswith("Z")
    # When the trainer started: how the operator tells a failure at start-up (policy.py).
    assert report["exit"]["startedAt"] <= report["exit"]["finishedAt"]
    assert still_running(proc)
    pod.write(generation=1, released=1)
    assert pod.run_of(1)["warm"]
    pod.wait_report("generation 1 running", generation=1, state="running", path="warm",
                    exit=None)


def test_a_rise_holds_until_released_then_starts_warm(pod: Pod) -> None:
    """The new generation is held until released, then runs in the spare that imported the
    preload before the release, after its header in the output."""
    pod.write(generation=0, released=0, opened=0)
    proc = pod.start(WARMUP_SECONDS="1")
    first = pod.run_of(0)
    pod.running(0)
    pod.wait_report("a spare ready", spare="ready")
    pod.write(generation=1)
    pod.wait_report("generation 1 held", generation=1, state="held")
    assert (pod.root / "signals").read_text() == "SIGTERM 0\n"  # the old trainer's handler
    assert still_running(proc, 0.5) and pod.report()["state"] == "held"
    assert [r["generation"] for r in pod.runs()] == ["0"]
    released_at = time.time()
    pod.write(released=1)
    second = pod.run_of(1)
    (_, _), (spare_pid, imported_at) = pod.imports()  # the first trainer's, then the spare's
    assert second["pid"] == spare_pid != first["pid"]
    assert imported_at < released_at and second["warm"]
    assert len(pod.imports()) == 2  # not imported again
    report = pod.wait_report("generation 1 running", generation=1, state="running", path="warm")
    assert report["why"] == ""
    assert (pod.root / "state" / "opened").read_text() == "1"
    assert (pod.root / "state" / "pod-generation").read_text() == "1"
    wait_for(lambda: "trainer of generation 1 starts" in pod.out(), TIMEOUT, 0.02, pod.logs)
    out = pod.out()
    marks = ["==== multiworker: generation 0 of worker 1, cold start",
             "trainer of generation 0 starts",
             "==== multiworker: generation 1 of worker 1, warm start (spare ready for",
             "trainer of generation 1 starts"]
    assert [out.index(mark) for mark in marks] == sorted(out.index(mark) for mark in marks)


@pytest.mark.parametrize("plan", ["sleep", "ignore"])
def test_a_running_trainer_is_stopped_on_a_rise(pod: Pod, plan: str) -> None:
    """SIGTERM to its process group (its handler runs), SIGKILL where it outlives
    STOP_SECONDS."""
    pod.write(generation=0, released=0, opened=0)
    pod.plan(g0=plan)
    pod.start()
    trainer = pod.run_of(0)["pid"]
    pod.running(0)
    rose_at = time.monotonic()
    pod.write(generation=1)
    pod.wait_report("generation 1 held", generation=1, state="held")
    assert gone(trainer)
    if plan == "sleep":
        assert (pod.root / "signals").read_text() == "SIGTERM 0\n"
    else:
        assert time.monotonic() - rose_at >= STOP_SECONDS
        assert "SIGKILL" in pod.out()


def test_exit_0_ends_the_launcher_and_its_spare(pod: Pod) -> None:
    pod.write(generation=0, released=0, opened=0)
    pod.plan(g0="done-once-spare-ready")
    proc = pod.start()
    assert proc.wait(TIMEOUT) == 0
    report = pod.report()
    assert (report["state"], report["exit"]["exitCode"]) == ("exited", 0)
    assert len(pod.imports()) == 2
    assert all(gone(pid) for pid, _ in pod.imports())


def test_sigterm_to_the_launcher_is_passed_on_and_so_is_the_trainers_exit(pod: Pod) -> None:
    pod.write(generation=0, released=0, opened=0)
    pod.plan(g0="term:42")
    proc = pod.start()
    pod.run_of(0)
    pod.running(0)
    pod.wait_report("a spare ready", spare="ready")
    proc.terminate()
    assert proc.wait(TIMEOUT) == 42
    assert (pod.root / "signals").read_text() == "SIGTERM 0\n"
    assert all(gone(pid) for pid, _ in pod.imports())
    assert pod.report()["exit"]["exitCode"] == 42


def test_a_spare_whose_preload_fails_gives_cold_starts(pod: Pod) -> None:
    """The first generation's spare fails: it starts cold, saying why. After two failures in
    a row no spare starts, and later generations start cold."""
    pod.write(generation=0, released=0, opened=0)
    pod.start(preload="broken")
    pod.run_of(0)
    pod.wait_report("a cold start", state="running", path="cold", why="broken on purpose")
    pod.wait_report("spares off", spare="off", spareWhy="failed twice")
    pod.write(generation=1, released=1)
    assert not pod.run_of(1)["warm"]
    report = pod.wait_report("generation 1 running", generation=1, state="running",
                             path="cold", why="no spare: failed twice")
    assert report["spare"] == "off"
    assert "multiworker launcher: spare failed (exit 70: failed importing broken: RuntimeError: " \
        "broken on purpose)" in pod.out()


def test_a_spare_waits_for_memory_to_fit(pod: Pod) -> None:
    """cgroup v2: with less free than 1.5 times the last spare took, no spare (said once);
    once memory is free, one starts."""
    pod.write(generation=0, released=0, opened=0)
    (pod.root / "cgroup" / "memory.max").write_text(f"{2 ** 30}\n")
    (pod.root / "cgroup" / "memory.current").write_text(f"{2 ** 30 - 2 ** 20}\n")
    proc = pod.start()
    report = pod.wait_report("spare off", spare="off", spareWhy="memory too tight")
    assert "1 MiB free of the container's 1024 MiB" in report["spareWhy"]
    assert still_running(proc)
    assert pod.out().count("multiworker launcher: no spare: memory too tight") == 1
    (pod.root / "cgroup" / "memory.current").write_text(f"{2 ** 29}\n")
    pod.wait_report("a spare once memory is free", spare="ready")


def test_an_orphaned_grandchild_is_reaped(pod: Pod) -> None:
    """The trainer leaves a child of its own session behind: it comes to the launcher (PID 1
    of the container; a subreaper here), which reaps it once it ends."""
    pod.write(generation=0, released=0, opened=0)
    pod.plan(g0="orphan")
    proc = pod.start()
    pod.wait_report("the trainer's exit", state="exited")
    grandchild = int((pod.root / "grandchild").read_text())
    status = Path(f"/proc/{grandchild}/status").read_text()
    assert f"PPid:\t{proc.pid}\n" in status
    wait_for(lambda: gone(grandchild), TIMEOUT, 0.05, "the orphan reaped, not a zombie")
    assert still_running(proc, 0)


def test_a_generation_rising_while_held_goes_straight_to_the_highest(pod: Pod) -> None:
    pod.write(generation=0, released=0, opened=0)
    pod.start()
    pod.run_of(0)
    pod.running(0)
    pod.write(generation=1)
    pod.wait_report("generation 1 held", generation=1, state="held")
    pod.write(generation=2, released=1)  # 1 released late: 2 is the pod's generation now
    pod.wait_report("generation 2 held", generation=2, state="held")
    pod.write(released=2)
    pod.run_of(2)
    assert [r["generation"] for r in pod.runs()] == ["0", "2"]
    pod.wait_report("generation 2 running", generation=2, state="running")


@pytest.mark.parametrize("how", [["train.py"], ["-m", "trainmod"]], ids=["script", "module"])
def test_the_users_own_line_runs_warm_through_the_hook(pod: Pod, how: list[str]) -> None:
    """As the operator renders it (MWJ_LAUNCHER_ARG_*): the spare is the user's own line,
    with the warm hook (warm_hook.py) on its PYTHONPATH, which leaves no trace once it goes."""
    pod.write(generation=0, released=0, opened=0)
    line = [sys.executable, *(str(pod.job / w) if w.endswith(".py") else w for w in how), *ARGS]
    pod.start(line=line)
    pod.running(0)
    pod.wait_report("a spare ready", spare="ready")
    pod.write(generation=1, released=1)
    run = pod.run_of(1)
    pod.wait_report("generation 1 running", generation=1, state="running", path="warm")
    (_, _), (spare_pid, _) = pod.imports()
    assert run["pid"] == spare_pid and run["warm"]
    script = str(pod.job / ("train.py" if how == ["train.py"] else "trainmod.py"))
    assert run["argv"] == [script, *ARGS] and run["name"] == "__main__"
    assert (run["path0"], run["pythonpath"]) == (str(pod.job), str(pod.root / "lib"))
    assert run["warm_fds"] is None and not run["hook_on_path"]
    assert run["unbuffered"] == "1"


@pytest.mark.parametrize(("wait", "path", "why"), [
    ("30", "warm", ""), ("0.3", "cold", "not ready 0.3s after the release")])
def test_a_released_generation_waits_a_while_for_a_spare_still_importing(
    pod: Pod, wait: str, path: str, why: str,
) -> None:
    """It is ahead of a cold start, up to MWJ_LAUNCHER_SPARE_WAIT."""
    pod.write(generation=0, released=0, opened=0)
    pod.start(WARMUP_SECONDS="2", MWJ_LAUNCHER_SPARE_WAIT=wait)
    pod.run_of(0)
    pod.wait_report("the next spare importing", spare="starting")
    pod.write(generation=1, released=1)
    pod.run_of(1)
    report = pod.wait_report("generation 1 running", generation=1, state="running", path=path,
                             why=why)
    assert report["why"] == (f"no spare: failed: {why}" if why else "")


def test_an_error_of_its_own_ends_the_launcher_and_its_trainer(pod: Pod) -> None:
    """Exit 1 (the pod's restart rule restarts all containers: cold), its children killed."""
    pod.write(generation=0, released=0, opened=0)
    proc = pod.start()
    pod.running(0)
    wait_for(lambda: block(pod.root / "state" / "launcher.json"), TIMEOUT, 0.01,
             "the report blocked")
    assert proc.wait(TIMEOUT) == 1
    assert "Traceback" in (pod.root / "err.log").read_text()
    wait_for(lambda: not ours_alive(pod.root), TIMEOUT, 0.05,
             lambda: f"the trainer killed: {ours_alive(pod.root)}")
