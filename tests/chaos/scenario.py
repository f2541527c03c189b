"""Seeded job lifecycles for the operator-kill case: what each job goes through, in which
interleaving, and what its status must say after every step. Pure (no cluster).

A job is created, then goes through a worker failure (a counted restart), a disruption (a
deleted worker pod), a suspend and a resume — in a seeded order, some twice — and ends one of
three ways: its chief exits 0 (Succeeded), a worker fails with the restart budget spent
(Failed, RestartLimitExceeded), or the job is deleted. The expected counts follow from the
steps alone, so a restart counted twice (or lost) while the operator was being killed shows.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from enum import StrEnum


class Step(StrEnum):
    CREATE = "create"
    FAIL = "fail"  # a worker exits 1: restart, counted
    DISRUPT = "disrupt"  # a worker pod is deleted: restart, not counted
    SUSPEND = "suspend"
    RESUME = "resume"
    SUCCEED = "succeed"  # the chief exits 0
    EXHAUST = "exhaust"  # a worker exits 1 with no restart left: Failed
    DELETE = "delete"  # the job is deleted


FINALS = (Step.SUCCEED, Step.EXHAUST, Step.DELETE)


@dataclass(frozen=True)
class Expect:
    """A job's status after a step (phase None: the job is gone)."""

    phase: str | None
    generation: int = 0
    restarts: int = 0
    disruptions: int = 0
    reason: str = ""  # the terminal condition's reason


@dataclass(frozen=True)
class Action:
    job: str
    step: Step
    worker: int  # the worker a FAIL, DISRUPT or EXHAUST hits
    expect: Expect


@dataclass
class JobPlan:
    name: str
    workers: int
    steps: list[Step]
    targets: list[int] = field(default_factory=list)  # a worker per step

    @property
    def max_restarts(self) -> int:
        """Exactly the restarts its failures spend: one more failure exhausts the budget."""
        return self.steps.count(Step.FAIL)

    def actions(self) -> list[Action]:
        out, state = [], Expect("Running")
        for step, worker in zip(self.steps, self.targets, strict=True):
            state = after(state, step)
            out.append(Action(self.name, step, worker, state))
        return out


def after(state: Expect, step: Step) -> Expect:
    """The status a step leads to."""
    g = state.generation
    if step is Step.CREATE:
        return Expect("Running")
    if step is Step.FAIL:
        return replace(state, phase="Running", generation=g + 1, restarts=state.restarts + 1)
    if step is Step.DISRUPT:
        return replace(state, phase="Running", generation=g + 1,
                       disruptions=state.disruptions + 1)
    if step is Step.SUSPEND:  # the running group becomes stale: the generation moves on
        return replace(state, phase="Suspended", generation=g + 1)
    if step is Step.RESUME:
        return replace(state, phase="Running")
    if step is Step.SUCCEED:
        return replace(state, phase="Succeeded", reason="ChiefSucceeded")
    if step is Step.EXHAUST:
        return replace(state, phase="Failed", reason="RestartLimitExceeded")
    return Expect(None)


def plan_jobs(rng: random.Random, count: int, prefix: str = "kill") -> list[JobPlan]:
    """`count` jobs of 3-8 workers; every job fails, is disrupted and is suspended and resumed
    at least once; the three endings are dealt round-robin from a shuffled order."""
    finals = list(FINALS)
    rng.shuffle(finals)
    plans = []
    for n in range(count):
        middle = [Step.FAIL, Step.DISRUPT, Step.SUSPEND]
        middle += rng.sample([Step.FAIL, Step.DISRUPT, Step.SUSPEND], rng.randint(0, 1))
        rng.shuffle(middle)
        steps = [Step.CREATE]
        for step in middle:
            steps += [Step.SUSPEND, Step.RESUME] if step is Step.SUSPEND else [step]
        steps.append(finals[n % len(finals)])
        workers = rng.randint(3, 8)
        targets = [0 if s is Step.SUCCEED else rng.randrange(workers) for s in steps]
        plans.append(JobPlan(f"{prefix}-{n}", workers, steps, targets))
    return plans


def interleave(rng: random.Random, plans: list[JobPlan]) -> list[Action]:
    """One seeded order of every job's actions, each job's own order kept."""
    queues = [p.actions() for p in plans]
    order = [i for i, q in enumerate(queues) for _ in q]
    rng.shuffle(order)
    return [queues[i].pop(0) for i in order]


def schedule_kills(rng: random.Random, actions: int, kills: int) -> list[int]:
    """How many kills follow each action: every action gets one while there are enough; the
    rest land on random actions (a second kill then hits the restarted operator early)."""
    counts = [1 if n < kills else 0 for n in range(actions)]
    rng.shuffle(counts)
    for _ in range(max(0, kills - actions)):
        counts[rng.randrange(actions)] += 1
    return counts
