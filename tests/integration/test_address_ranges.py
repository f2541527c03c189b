"""No packet to an address the project hands out leaves this machine.

Every range a project cluster gives to pods, services and nodes (kwok's fake ones included) is
served on this machine or locally unreachable while the cluster is up (hack/cluster/ranges.sh):
a connection to an address with nothing behind it ends here, with "No route to host" or a
refusal, never through the default route. On a local bridge that error comes from the
kernel's own neighbour resolution, and a machine busy failing many other connections can lose
it (the global ICMP rate limit, icmp_msgs_per_sec, drops the error; a full neighbour table,
gc_thresh3, drops the SYN): the connection then times out. Seen once in CI; reproduced here
with a UDP flood to a thousand absent neighbours. The neighbour table tells the two apart:
FAILED, INCOMPLETE or no entry at all means no host on the bridge gave a link-layer
address, so the SYN was never sent; a resolved neighbour (one that answered) still fails.
The scripts that hand the ranges out list them in .cluster/ranges-<cluster>; these tests
check each listed range, and that every address the cluster actually reports lies in one of
them (a range the scripts forgot fails here).
"""

from __future__ import annotations

import errno
import ipaddress
import json
import socket
import subprocess
import time
from typing import Any

import pytest

from tests.cluster import REPO, Cluster
from tests.support import wait_for

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
# What a local end looks like: no route (an unreachable route, or no neighbour on a local
# bridge) or a refusal. A timeout to a resolved neighbour: the SYN went somewhere silent.
LOCAL_ENDS = {errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ECONNREFUSED}
UNRESOLVED = "timeout, neighbour unresolved"  # see the module docstring
NO_LINK_ADDRESS = ("FAILED", "INCOMPLETE", "NONE")  # neighbour states: the SYN was never sent
CONNECT_TIMEOUT = 8.0  # a bridge gives up on an absent neighbour after ~3 s
PROGRESS_PORT = 8471   # what the operator's poller dials on every worker


def listed_ranges(cluster: Cluster) -> list[tuple[Network, str]]:
    if cluster.kind not in ("local", "kind"):
        pytest.skip("an existing cluster's address plan is not this project's to guard")
    path = REPO / ".cluster" / f"ranges-{cluster.kind}"
    assert path.exists(), f"{path} is missing: the {cluster.kind} cluster's scripts guard no range"
    ranges = []
    for line in path.read_text().splitlines():
        cidr, _, what = line.partition(" ")
        ranges.append((ipaddress.ip_network(cidr), what))
    assert ranges, f"{path} lists no range"
    return ranges


def default_route(version: int) -> tuple[str | None, str | None]:
    """The default route's gateway and device for IPv`version`, if the machine has one."""
    out = subprocess.run(["ip", f"-{version}", "route", "show", "default"], capture_output=True,
                         text=True, check=False).stdout.split()
    gateway = out[out.index("via") + 1] if "via" in out else None
    device = out[out.index("dev") + 1] if "dev" in out else None
    return gateway, device


def route_to(address: Address) -> str:
    """`ip route get`'s answer, or its refusal (an unreachable route answers with an error)."""
    proc = subprocess.run(["ip", "route", "get", str(address)], capture_output=True, text=True,
                          check=False)
    return (proc.stdout + proc.stderr).strip()


def connect_end(address: Address, port: int) -> tuple[str, float]:
    """How a TCP connection from this host to address:port ends, and after how long."""
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    started = time.monotonic()
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(CONNECT_TIMEOUT)
        try:
            s.connect((str(address), port))
        except TimeoutError:
            return "timeout", time.monotonic() - started
        except OSError as e:
            name = errno.errorcode.get(e.errno or 0, str(e.errno))
            return (name if e.errno in LOCAL_ENDS else f"other {name}"), time.monotonic() - started
    return "connected", time.monotonic() - started


def neighbour_state(address: Address) -> str:
    """The neighbour table's state for `address` (FAILED, INCOMPLETE, REACHABLE...), or NONE."""
    out = subprocess.run(["ip", "neigh", "show", str(address)], capture_output=True, text=True,
                         check=False).stdout.split()
    return out[-1] if out else "NONE"


def assert_stays_here(address: Address, what: str, port: int = 9) -> str:
    gateway, device = default_route(address.version)
    route = route_to(address)
    assert not (gateway and f"via {gateway} " in f"{route} "), (
        f"{what}: {address} is routed out through the default gateway: {route}")
    assert not (device and f"dev {device} " in f"{route} "), (
        f"{what}: {address} is routed out of {device}, the default route's device: {route}")
    end, seconds = connect_end(address, port)
    if end == "timeout" and neighbour_state(address) in NO_LINK_ADDRESS:
        end = UNRESOLVED
    assert end in {errno.errorcode[e] for e in LOCAL_ENDS} | {UNRESOLVED}, (
        f"{what}: a connection to {address}:{port} ended with {end} after {seconds:.2f}s "
        f"(route: {route}); expected no route to host or a refusal, here")
    print(f"{what}: {address}:{port} -> {end} in {seconds * 1000:.1f} ms ({route})")
    return end


def unused_address(network: Network) -> Address:
    """The last host address of the range: no script hands it out first."""
    return network.broadcast_address - 1


def test_every_range_the_cluster_hands_out_is_served_here_or_unreachable(
    cluster: Cluster,
) -> None:
    for network, what in listed_ranges(cluster):
        assert_stays_here(unused_address(network), f"{network} ({what})")


def reported_addresses(cluster: Cluster) -> list[tuple[str, str]]:
    """(address, whose) for every node address, pod IP, service IP and service range."""
    def items(*kind: str) -> list[dict[str, Any]]:
        out = cluster.kubectl("get", *kind, "-o", "json").stdout
        found: list[dict[str, Any]] = json.loads(out)["items"]
        return found

    found = []
    for node in items("nodes"):
        for a in node.get("status", {}).get("addresses", []):
            if a["type"] in ("InternalIP", "ExternalIP"):
                found.append((a["address"], f"node {node['metadata']['name']}"))
    for pod in items("pods", "-A"):
        meta = pod["metadata"]
        for ip in pod.get("status", {}).get("podIPs", []):
            found.append((ip["ip"], f"pod {meta['namespace']}/{meta['name']}"))
    for svc in items("services", "-A"):
        meta = svc["metadata"]
        for ip in svc["spec"].get("clusterIPs", []):
            if ip != "None":
                found.append((ip, f"service {meta['namespace']}/{meta['name']}"))
    for cidr in items("servicecidrs"):
        for c in cidr["spec"].get("cidrs", []):
            found.append((c, f"ServiceCIDR {cidr['metadata']['name']}"))
    return found


def test_every_address_the_cluster_reports_lies_in_a_guarded_range(cluster: Cluster) -> None:
    ranges = listed_ranges(cluster)
    outside = []
    for text, whose in reported_addresses(cluster):
        net = ipaddress.ip_network(text, strict=False)
        if net.is_loopback:
            continue
        if not any(net.version == r.version and net.subnet_of(r) for r, _ in ranges):  # type: ignore[arg-type]
            outside.append(f"{text} ({whose})")
    assert not outside, (
        "addresses the cluster hands out outside every guarded range "
        f"({', '.join(str(r) for r, _ in ranges)}): {'; '.join(outside)}")


def test_a_kwok_pod_and_node_end_here_at_once(
    cluster: Cluster, fake_nodes: list[str], namespace: str,
) -> None:
    """What the progress poller and the preflight probes do to a pod on a fake node: dial its IP.
    Nothing is behind it, so the connection must fail here, at once, not leave the machine."""
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "fake"},
        "spec": {
            "nodeName": fake_nodes[0],
            "tolerations": [{"key": "multiworker.dev/fake-node", "operator": "Exists"}],
            "containers": [{"name": "c", "image": "multiworker.local/base:dev"}],
        },
    }))
    query = "jsonpath={.status.podIP}"
    wait_for(lambda: cluster.kubectl("-n", namespace, "get", "pod", "fake", "-o", query).stdout,
             60, describe="kwok to give the fake pod an IP")
    pod_ip = ipaddress.ip_address(
        cluster.kubectl("-n", namespace, "get", "pod", "fake", "-o", query).stdout)
    node_ip = ipaddress.ip_address(cluster.kubectl(
        "get", "node", fake_nodes[0], "-o",
        "jsonpath={.status.addresses[?(@.type=='InternalIP')].address}").stdout)
    ranges = listed_ranges(cluster)
    for address, what in ((pod_ip, "kwok pod"), (node_ip, "kwok node")):
        assert any(address in r for r, _ in ranges), f"{what} {address} is in no guarded range"
        # An unreachable route answers at once; no neighbour on a bridge would take ~3 s.
        assert assert_stays_here(address, what, PROGRESS_PORT) == "EHOSTUNREACH"
