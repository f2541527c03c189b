"""≥ 1,000 MultiWorkerJobs generated from the CRD's schema (generate.py), valid and invalid,
server-side applied to the real API server (not a dry run: the operator sees every accepted
one). Each must be refused with a message naming the field the oracle expects (oracle.py),
or accepted and then reconciled by the operator without an exception.

Accepted jobs are deleted once the operator has done what it can — a steady phase (Running,
Suspended, finished), or the whole group created and waiting (for a claim, say) —, in
batches of 50, so the namespace never
holds more than a batch of them. Two explicit examples put every number at its schema maximum.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, Phase, example, given, seed, settings

from tests.chaos.config import Chaos
from tests.chaos.conftest import Figures, operator_log
from tests.chaos.generate import Case, Generator, boundary_cases
from tests.chaos.oracle import RULES, names, unknown_rules, use_schema
from tests.chaos.recorder import Event, Recorder, to_event
from tests.chaos.rest import Rest, apply, jobs_path
from tests.chaos.schema import crd_schema
from tests.cluster import REPO, Cluster
from tests.integration.conftest import OperatorProcess
from tests.support import wait_for

pytestmark = [pytest.mark.usefixtures("fake_nodes", "crds"), pytest.mark.timeout(1800)]

BATCH = 50
STEADY = ("Running", "Suspended", "Succeeded", "Failed")


# Why the operator may hold a group back before creating it, saying so in the Running
# condition (creation.py): the job is reconciled, and waits for the cluster to change.
HELD_BACK = ("GangSchedulingUnavailable", "NoGpuProductWithRoom", "QuotaExceeded")


def done(job: Event) -> bool:
    """Steady, or its group created and waiting (for a claim, a node, an image), or held back
    with the reason in its Running condition (no PodGroup API, no GPU product with room)."""
    running = next((c for c in job.status.get("conditions") or []
                    if c.get("type") == "Running"), {})
    return job.phase in STEADY or bool(job.phase and job.status.get("groupStartTime")) \
        or (running.get("status") == "False" and running.get("reason") in HELD_BACK)


@dataclass
class Campaign:
    rest: Rest
    namespace: str
    recorder: Recorder
    unknown: list[str]
    outcomes: Counter[str] = field(default_factory=Counter)
    pending: dict[str, float] = field(default_factory=dict)  # accepted, by name: applied at
    first_status: list[float] = field(default_factory=list)  # seconds to a steady phase
    phases: Counter[str] = field(default_factory=Counter)
    samples: dict[str, str] = field(default_factory=dict)  # a refusal message per kind
    read_directly: int = 0  # jobs seen done by GET before the recorder's watch showed it

    def run(self, case: Case) -> None:
        name = case.job["metadata"]["name"]
        answer = apply(self.rest, self.namespace, case.job)
        kind = f"{case.treatment}/{'running' if case.running else 'suspended'}"
        if answer.ok:
            assert not case.expected, (f"{name} was accepted although it breaks "
                                       f"{case.broken or case.expected}: {case.job}")
            self.outcomes[f"accepted {kind}"] += 1
            self.pending[name] = time.monotonic()
            if len(self.pending) >= BATCH:
                self.flush()
            return
        message = answer.message
        by_unknown_rule = any(u.split(": ", 1)[1] in message for u in self.unknown)
        if not case.expected:
            assert by_unknown_rule, f"{name} was refused ({answer.status}): {message}\n{case.job}"
            self.outcomes["refused by a rule the oracle does not know"] += 1
            return
        named = [p for p in case.expected if names(message, p)]
        assert named or by_unknown_rule, (
            f"{name} ({case.broken}) was refused without naming {' or '.join(case.expected)}: "
            f"{message}")
        self.outcomes[f"refused {kind}"] += 1
        self.samples.setdefault(case.broken.split(" at ")[0], message[:200])

    def flush(self) -> None:
        """Wait until the operator has done what it can for every pending job — a steady
        phase, or its whole group created (it may wait for a claim or a node), then delete
        them. The recorder's watch is the clock; a job it has not shown done for 10 s is read
        from the API server itself (a watch can lag behind an API server that a control-plane
        case restarted; the operator is judged, not the watch)."""
        read: dict[str, tuple[float, str]] = {}  # done as read by GET: when, phase

        def waiting() -> list[str]:
            _, history = self.recorder.snapshot()
            seen_done = {e.name for e in history if done(e)}
            late = [n for n in self.pending if n not in read and n not in seen_done]
            for name in late:
                if time.monotonic() - self.pending[name] > 10:
                    answer = self.rest.request("GET", jobs_path(self.namespace, name))
                    if answer.status == 404:  # finished and deleted (ttlSecondsAfterFinished)
                        read[name] = (time.monotonic(), "Deleted")
                    elif answer.ok and done(event := to_event("GET", answer.body,
                                                              time.monotonic())):
                        read[name] = (event.at, event.phase)
            return [n for n in late if n not in read]

        wait_for(lambda: not waiting(), 180, 0.2,
                 lambda: f"the operator to finish with {', '.join(waiting())}")
        _, jobs = self.recorder.snapshot()
        first: dict[str, tuple[float, str]] = {}
        for event in jobs:
            if done(event) and event.name in self.pending and event.name not in first:
                first[event.name] = (event.at, event.phase)
        self.read_directly += len(set(read) - set(first))
        for name, applied in self.pending.items():
            at, phase = first.get(name) or read[name]
            self.first_status.append(at - applied)
            self.phases[phase] += 1
            self.rest.request("DELETE", jobs_path(self.namespace, name))  # 404: TTL did it
        self.pending.clear()


def test_generated_specs_are_refused_naming_the_field_or_reconciled(
    chaos: Chaos, cluster: Cluster, namespace: str, operator: OperatorProcess,
    recorder: Recorder, figures: Figures,
) -> None:
    openapi = crd_schema(REPO / "crds")
    use_schema(openapi)
    unknown = unknown_rules(openapi)
    generator = Generator(openapi)
    campaign = Campaign(Rest(cluster.api_client()), namespace, recorder, unknown)
    started = time.monotonic()

    @seed(chaos.seed)
    @settings(max_examples=chaos.specs, database=None, deadline=None, derandomize=False,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=generator.cases())
    def each(case: Case) -> None:
        campaign.run(case)

    for case in boundary_cases(generator):
        each = example(case=case)(each)

    each()
    campaign.flush()
    wait_for(lambda: not recorder.live_jobs() and not recorder.live_pods(), 180, 0.5,
             "every generated job and its pods to be gone")
    took = time.monotonic() - started
    errors = operator.metric("multiworker_reconcile_errors_total")
    log = operator_log(operator.log_path)
    total = sum(campaign.outcomes.values())
    figures(f"seed {chaos.seed}: {total} specs applied in {took:.0f}s: " + ", ".join(
        f"{k} {v}" for k, v in sorted(campaign.outcomes.items())))
    figures(f"CEL rules known to the oracle {len(RULES)}, unknown {len(unknown)}"
            + (f" ({'; '.join(unknown)})" if unknown else ""))
    if campaign.first_status:
        figures(f"accepted jobs reconciled (steady, or the group created and waiting) after "
                f"median "
                f"{statistics.median(campaign.first_status):.2f}s, max "
                f"{max(campaign.first_status):.2f}s; phases then: " + ", ".join(
                    f"{k} {v}" for k, v in sorted(campaign.phases.items())))
    if campaign.read_directly:
        figures(f"{campaign.read_directly} jobs seen done by GET before the test's own watch "
                f"showed them (watch lag)")
    for what, message in sorted(campaign.samples.items()):
        figures(f"refusal for {what}: {message}")
    figures(f"operator: multiworker_reconcile_errors_total {errors:.0f}, "
            f"{log.count('reconcile failed')} failed passes logged, "
            f"{log.count('Traceback')} tracebacks")
    assert total >= chaos.specs
    assert errors == 0 and "Traceback" not in log, \
        "the operator raised while reconciling generated jobs (see its log)"
