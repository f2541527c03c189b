"""Does every worker of the group see the same MWJ_CHECKPOINT_DIR? Found at start, in words.

Only the chief writes checkpoints and every worker restores from them, so a directory the
workers do not share (a node-local hostPath, a local-path volume on each node) otherwise fails
late, or not at all: a restart finds the checkpoint on some workers only, or on none (the
chief moved nodes) and silently starts over. So each worker leaves a marker,
`markers/g<generation>/worker-<i>.json`, and looks for every other worker's marker of its
generation; a worker that cannot see them all names the ones it misses and its node.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Iterable

from multiworker.api.contract import MWJ_CHECKPOINT_DIR
from multiworker.runtime.files import read_json, write_json

MARKERS_DIR = "markers"
# How long a worker looks for the others' markers once all have written theirs. A shared
# file system may show another client's new file late (NFS caches directory attributes and
# failed lookups for seconds); a node-local directory never shows it, however long we wait.
MARKER_WAIT_SECONDS = 15.0
POLL_SECONDS = 0.25
NAMED_AT_MOST = 8  # workers named in a message; the rest are counted


def markers_dir(checkpoint_dir: str, generation: int) -> str:
    return os.path.join(checkpoint_dir, MARKERS_DIR, f"g{generation}")


def marker_path(checkpoint_dir: str, generation: int, worker: int) -> str:
    return os.path.join(markers_dir(checkpoint_dir, generation), f"worker-{worker}.json")


def write_marker(
    checkpoint_dir: str, generation: int, worker: int, node: str | None, pod: str
) -> None:
    write_json(marker_path(checkpoint_dir, generation, worker),
               {"worker": worker, "node": node, "pod": pod})


def unseen_markers(checkpoint_dir: str, generation: int, workers: Iterable[int]) -> list[int]:
    """The workers among `workers` whose marker this worker cannot see. A listing may be
    cached, so what it lacks is looked up by name too."""
    folder = markers_dir(checkpoint_dir, generation)
    try:
        listed = set(os.listdir(folder))
    except OSError:
        listed = set()
    return [w for w in workers
            if f"worker-{w}.json" not in listed
            and not os.path.exists(marker_path(checkpoint_dir, generation, w))]


def wait_for_markers(
    checkpoint_dir: str,
    generation: int,
    num_workers: int,
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[int]:
    """Polls until every worker's marker is visible or `timeout` passed; the unseen ones."""
    deadline = clock() + timeout
    unseen = unseen_markers(checkpoint_dir, generation, range(num_workers))
    while unseen and clock() < deadline:
        sleep(POLL_SECONDS)
        unseen = unseen_markers(checkpoint_dir, generation, unseen)
    return unseen


def marker_nodes(checkpoint_dir: str, generation: int, workers: Iterable[int]) -> dict[int, str]:
    """The nodes that `workers` recorded in their markers, where visible and known."""
    nodes = {}
    for worker in workers:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            node = read_json(marker_path(checkpoint_dir, generation, worker)).get("node")
            if isinstance(node, str) and node:
                nodes[worker] = node
    return nodes


def remove_older_markers(checkpoint_dir: str, generation: int) -> None:
    """Best effort: the chief drops the markers of earlier generations once its group agreed."""
    folder = os.path.join(checkpoint_dir, MARKERS_DIR)
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            number = name.removeprefix("g")
            if name.startswith("g") and number.isdigit() and int(number) < generation:
                shutil.rmtree(os.path.join(folder, name), ignore_errors=True)


def unshared_message(
    directory: str,
    worker: int,
    node: str | None,
    unseen: list[int],
    blind: list[int],
    nodes: dict[int, str],
    waited: float,
) -> str:
    """Why the group stops: this worker's view (the markers it cannot see), or, when it sees
    them all, the workers that do not (`blind`, with their nodes from `nodes`)."""
    if unseen:
        view = (f"{_who(worker, node)} cannot see what {_names(unseen, {})} wrote there "
                f"within {waited:g}s")
    else:
        view = (f"{_who(worker, node)} sees every worker's marker there, but "
                f"{len(blind)} worker(s) do not within {waited:g}s: {_names(blind, nodes)}")
    return (f"{MWJ_CHECKPOINT_DIR} {directory} is not shared by all workers: {view}; it must "
            "be storage every worker shares (ReadWriteMany; on kind, the folder every node "
            "mounts), not node-local")


def _who(worker: int, node: str | None) -> str:
    return f"worker-{worker} (node {node})" if node else f"worker-{worker}"


def _names(workers: list[int], nodes: dict[int, str]) -> str:
    named = ", ".join(_who(w, nodes.get(w)) for w in sorted(workers)[:NAMED_AT_MOST])
    more = len(workers) - NAMED_AT_MOST
    return f"{named} and {more} more" if more > 0 else named
