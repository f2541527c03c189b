"""Every (API group, resource, verb) the operator calls, in four tables: what the chart's RBAC
grants, exactly (tests/unit/test_chart.py compares them), and what the e2e suite checks the
calls made stay inside. A new call starts here, with its reason.
"""

from __future__ import annotations

from multiworker.api import names

# Every job's calls, and the nodes'. multiworkerjobs/finalizers: update is what
# blockOwnerDeletion on owned objects requires.
FOOTPRINT: dict[tuple[str, str], frozenset[str]] = {
    (names.GROUP, names.PLURAL): frozenset({"list", "watch", "delete"}),
    (names.GROUP, f"{names.PLURAL}/status"): frozenset({"patch"}),
    (names.GROUP, f"{names.PLURAL}/finalizers"): frozenset({"update"}),
    ("", "pods"): frozenset({"get", "list", "watch", "create", "patch", "delete",
                             "deletecollection"}),
    ("", "services"): frozenset({"get", "create"}),
    ("", "configmaps"): frozenset({"create"}),  # never read: see render_cluster_config
    # In-place jobs' signing keys (reconcile/agent_keys.py): created, and read by name when a
    # pass signs notes; never listed or watched, so no other Secret reaches the operator.
    ("", "secrets"): frozenset({"create", "get"}),
    ("", "events"): frozenset({"create"}),
    ("coordination.k8s.io", "leases"): frozenset({"get", "create", "update"}),
    ("", "nodes"): frozenset({"get", "list", "watch"}),
    ("scheduling.x-k8s.io", "podgroups"): frozenset({"create", "get", "delete"}),
    ("networking.k8s.io", "networkpolicies"): frozenset({"create", "get"}),
}


# With --kueue (chart: kueue.enabled), beside FOOTPRINT: each job's Workload, watched,
# created, deleted once replaced, its finalizer dropped (merge patch) and its status written
# (admission cleared after an eviction, PodsReady, Finished); a waiting job's LocalQueue read
# (its ClusterQueue); the admitted flavors' and the priority classes' values read
# (reconcile/queueing.py).
KUEUE_FOOTPRINT: dict[tuple[str, str], frozenset[str]] = {
    ("kueue.x-k8s.io", "workloads"): frozenset({"list", "watch", "create", "delete", "patch"}),
    ("kueue.x-k8s.io", "workloads/status"): frozenset({"update"}),
    ("kueue.x-k8s.io", "localqueues"): frozenset({"get"}),
}


KUEUE_CLUSTER_FOOTPRINT: dict[tuple[str, str], frozenset[str]] = {
    ("kueue.x-k8s.io", "resourceflavors"): frozenset({"get"}),
    ("kueue.x-k8s.io", "workloadpriorityclasses"): frozenset({"get"}),
    ("scheduling.k8s.io", "priorityclasses"): frozenset({"get"}),
}


# In kube-node-lease alone (a Role there): the nodes' heartbeats (heartbeats.py).
NODE_LEASE_FOOTPRINT: dict[tuple[str, str], frozenset[str]] = {
    ("coordination.k8s.io", "leases"): frozenset({"get", "list", "watch"}),
}
