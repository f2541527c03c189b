"""The chaos suite's own checks can fail: the invariants on made-up event streams, and the
scenarios' expected counts. No cluster."""

from __future__ import annotations

import random
from itertools import count

from tests.chaos.invariants import check, leftovers
from tests.chaos.recorder import Event
from tests.chaos.scenario import (
    Expect,
    Step,
    after,
    interleave,
    plan_jobs,
    schedule_kills,
)

JOB = "job-uid"
_rv = count(1)


def pod(kind: str, uid: str, index: int, generation: int, deleting: bool = False,
        owner: str = JOB, gap: bool = False) -> Event:
    return Event(kind, next(_rv), 0.0, uid, f"train-worker-{index}", deleting, owner,
                 "MultiWorkerJob", index, generation, "Running", gap=gap)


def job(kind: str, uid: str = JOB, deleting: bool = False) -> Event:
    return Event(kind, next(_rv), 0.0, uid, "train", deleting)


def test_a_clean_restart_passes() -> None:
    pods = [pod("ADDED", "a", 0, 0), pod("ADDED", "b", 1, 0),
            pod("MODIFIED", "a", 0, 0, True), pod("MODIFIED", "b", 1, 0, True),
            pod("DELETED", "a", 0, 0, True), pod("DELETED", "b", 1, 0, True),
            pod("ADDED", "c", 0, 1), pod("ADDED", "d", 1, 1)]
    report = check(pods, [job("ADDED")])
    assert report.violations == []
    assert (report.pods, report.generations) == (4, {JOB: 2})


def test_two_alive_pods_of_one_worker_are_caught() -> None:
    pods = [pod("ADDED", "a", 0, 0), pod("ADDED", "b", 0, 1)]
    report = check(pods, [job("ADDED")])
    assert any("two pods of worker 0 alive at once" in v for v in report.violations)


def test_a_terminating_pod_is_not_alive_but_still_fences_the_next_group() -> None:
    pods = [pod("ADDED", "a", 0, 0), pod("MODIFIED", "a", 0, 0, deleting=True),
            pod("ADDED", "b", 0, 1)]
    report = check(pods, [job("ADDED")])
    assert not any("alive at once" in v for v in report.violations)
    assert any("train-worker-0 of generation 1 created" in v and "terminating" in v
               for v in report.violations)


def test_a_new_group_beside_another_worker_of_the_old_one_is_caught() -> None:
    pods = [pod("ADDED", "a", 0, 0), pod("ADDED", "b", 1, 0),
            pod("MODIFIED", "a", 0, 0, True), pod("DELETED", "a", 0, 0, True),
            pod("ADDED", "c", 0, 1)]
    report = check(pods, [job("ADDED")])
    expected = (f"train-worker-0 of generation 1 created at rv {pods[-1].rv} while "
                "train-worker-1 (generation 0) still existed")
    assert [v for v in report.violations if "still existed" in v] == [expected]


def test_a_worker_created_twice_in_one_generation_is_caught() -> None:
    pods = [pod("ADDED", "a", 0, 0), pod("DELETED", "a", 0, 0), pod("ADDED", "b", 0, 0)]
    report = check(pods, [job("ADDED")])
    assert any("was created 2 times" in v for v in report.violations)


def test_orphans_and_late_pods() -> None:
    stray = Event("ADDED", next(_rv), 0.0, "x", "stray", False, index=0, generation=0)
    unknown = pod("ADDED", "y", 0, 0, owner="nobody")
    deleted = job("DELETED")
    late = pod("ADDED", "z", 1, 0)
    report = check([stray, unknown, late], [job("ADDED"), deleted])
    assert len([v for v in report.violations if "controlled by" in v]) == 2
    assert len(report.late) == 1 and "after its job's deletion" in report.late[0]
    assert leftovers([late], []) and not leftovers([late], [JOB])


def test_scenario_counts_follow_the_steps() -> None:
    state = Expect("Running")
    for step in (Step.CREATE, Step.FAIL, Step.DISRUPT, Step.SUSPEND, Step.RESUME, Step.FAIL,
                 Step.EXHAUST):
        state = after(state, step)
    assert state == Expect("Failed", generation=4, restarts=2, disruptions=1,
                           reason="RestartLimitExceeded")
    assert after(state, Step.DELETE).phase is None


def test_plans_cover_every_step_and_keep_each_jobs_order() -> None:
    rng = random.Random(7)
    plans = plan_jobs(rng, 4)
    steps = {s for p in plans for s in p.steps}
    assert steps == set(Step)
    assert all(3 <= p.workers <= 8 and p.steps[0] is Step.CREATE for p in plans)
    actions = interleave(rng, plans)
    for plan in plans:
        assert [a.step for a in actions if a.job == plan.name] == plan.steps
    kills = schedule_kills(rng, len(actions), 40)
    assert sum(kills) == 40 and min(kills) >= 1
    assert plan_jobs(random.Random(7), 4)[0].steps == plans[0].steps  # seeded
