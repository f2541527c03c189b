"""A Lease renewal that comes back late: etcd frozen past the leader's deadline (10 s) under
the operator's renewal, then a worker hangs. While the Lease had lapsed the operator skipped
its passes and stopped polling; once it is renewed every such job must be looked at again, so
the hang is still caught. (Before: the renewal flipped nothing the elector announced, the
job was left with no timer and no poller, and the hang never restarted anything.)"""

from __future__ import annotations

import time

import pytest

from tests.chaos.config import Chaos
from tests.chaos.conftest import Figures, operator_log
from tests.chaos.control import ControlPlane
from tests.chaos.progress_servers import HONEST
from tests.chaos.test_progress_abuse import TIMEOUT_SECONDS, serving
from tests.chaos.workers import stop_and_await_hang
from tests.integration.conftest import OperatorProcess
from tests.integration.jobs import Jobs
from tests.support import alone, wait_for

pytestmark = [pytest.mark.usefixtures("images"), pytest.mark.timeout(600),
              alone("it freezes etcd")]

WORKERS = 3
FREEZE_SECONDS = 13.0  # past the leader's deadline (leader.DEADLINE_SECONDS, 10 s)
LAPSED = "no longer handling the jobs of namespace"


def test_a_late_lease_renewal_leaves_hang_detection_on(
    chaos: Chaos, control: ControlPlane, jobs: Jobs, operator: OperatorProcess,
    shared_dir: str, figures: Figures,
) -> None:
    pacemaker = chaos.rng("lease-hiccup").randrange(WORKERS)
    jobs.apply(serving("hiccup", HONEST, WORKERS, {"PACEMAKER": str(pacemaker)},
                       {"hostPath": {"path": shared_dir, "type": "DirectoryOrCreate"}}))
    wait_for(lambda: (jobs.status("hiccup").get("progress") or {}).get("step"), 120, 0.5,
             lambda: f"the job's progress in status\n{jobs.describe('hiccup')}")

    frozen, thawed = control.freeze("etcd", FREEZE_SECONDS)
    # The lapse is said, and so is the new start once the Lease is renewed.
    wait_for(lambda: LAPSED in operator_log(operator.log_path) and
             operator_log(operator.log_path).rsplit(LAPSED, 1)[1].count(
                 "handling the jobs of namespace") >= 1,
             60, 0.5, lambda: f"the lapse and the renewal in the operator's log\n"
             f"{operator_log(operator.log_path)[-3000:]}")
    renewed = time.monotonic()

    status, detected = stop_and_await_hang(jobs, "hiccup", pacemaker)
    failure = status["lastFailure"]
    figures(f"etcd SIGSTOPped for {thawed - frozen:.1f}s; the operator said it handles the "
            f"namespace again {renewed - thawed:.1f}s after SIGCONT; worker-{pacemaker} then "
            f"SIGSTOPped, declared hung after {detected:.1f}s (progressTimeoutSeconds "
            f"{TIMEOUT_SECONDS})")
    assert (failure["reason"], failure["worker"]) == ("ProgressStalled", pacemaker)
    assert status["restarts"] == 1 and status["disruptions"] == 0
