"""The generation fence (fence.py) without TensorFlow: who may claim the checkpoint directory,
what stops a save, and what never does (no fence, a garbled one, another job's)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from multiworker.runtime.fence import (
    FENCE_FILE,
    Fence,
    check,
    claim,
    read_fence,
    superseded_message,
)

AT = 1_700_000_000.0  # 22:13:20 UTC


def fence(generation: int, uid: str = "uid-1", pod: str = "pod-a") -> Fence:
    return Fence(generation, uid, pod, AT)


def written(directory: Path) -> dict[str, object]:
    document: dict[str, object] = json.loads((directory / FENCE_FILE).read_text())
    return document


def test_a_claim_is_written_atomically_as_camel_case_json(tmp_path: Path) -> None:
    assert claim(str(tmp_path / "new"), fence(2)) is None
    assert written(tmp_path / "new") == {
        "generation": 2, "jobUid": "uid-1", "pod": "pod-a", "writtenAt": AT}
    assert [p.name for p in (tmp_path / "new").iterdir()] == [FENCE_FILE]  # no temp left
    assert read_fence(str(tmp_path / "new")) == fence(2)
    assert read_fence(str(tmp_path / "none")) is None


@pytest.mark.parametrize("earlier", [None, 1, 2])
def test_the_chief_claims_over_no_older_or_its_own_generation(
    tmp_path: Path, earlier: int | None
) -> None:
    if earlier is not None:
        claim(str(tmp_path), fence(earlier, pod="old"))
    assert claim(str(tmp_path), fence(2, pod="new")) is None
    assert written(tmp_path)["pod"] == "new"


def test_a_newer_generation_supersedes_and_is_left_in_place(tmp_path: Path) -> None:
    claim(str(tmp_path), fence(3, pod="newer"))
    assert claim(str(tmp_path), fence(2)) == fence(3, pod="newer")
    assert check(str(tmp_path), fence(2), reclaim=True) == fence(3, pod="newer")
    assert written(tmp_path)["generation"] == 3


def test_another_jobs_fence_is_not_this_jobs_to_obey(tmp_path: Path) -> None:
    claim(str(tmp_path), fence(7, uid="other-job"))
    assert check(str(tmp_path), fence(0), reclaim=False) is None
    assert claim(str(tmp_path), fence(0)) is None
    assert written(tmp_path)["jobUid"] == "uid-1"


def test_before_a_save_only_the_chief_writes_and_only_what_it_lost(tmp_path: Path) -> None:
    directory = str(tmp_path)
    assert check(directory, fence(2), reclaim=False) is None  # no fence: save
    assert not (tmp_path / FENCE_FILE).exists()
    assert check(directory, fence(2), reclaim=True) is None
    assert written(tmp_path)["generation"] == 2
    # Two chiefs claimed at once: the older one read no fence, then wrote its claim last.
    (tmp_path / FENCE_FILE).write_text(json.dumps(fence(1, pod="late-claim").document()))
    assert check(directory, fence(2, pod="chief"), reclaim=True) is None
    assert (written(tmp_path)["generation"], written(tmp_path)["pod"]) == (2, "chief")
    before = (tmp_path / FENCE_FILE).stat().st_mtime_ns
    assert check(directory, fence(2, pod="chief"), reclaim=True) is None
    assert (tmp_path / FENCE_FILE).stat().st_mtime_ns == before  # held: a read, no write


@pytest.mark.parametrize("content", [
    "{not json", "[]", '{"generation": "3", "jobUid": "uid-1", "pod": "p", "writtenAt": 1}',
    '{"generation": true, "jobUid": "uid-1", "pod": "p", "writtenAt": 1}',
    '{"generation": 3, "pod": "p", "writtenAt": 1}', "",
])
def test_a_garbled_fence_never_blocks_a_save_and_says_so(
    tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / FENCE_FILE).write_text(content)
    with caplog.at_level(logging.WARNING):
        assert read_fence(str(tmp_path)) is None
        assert check(str(tmp_path), fence(0), reclaim=False) is None
    assert f"{FENCE_FILE} is " in caplog.text and "ignored" in caplog.text
    assert check(str(tmp_path), fence(0), reclaim=True) is None  # the chief repairs it
    assert read_fence(str(tmp_path)) is not None


def test_the_message_says_who_claimed_the_directory_when_and_what_happens(
    tmp_path: Path,
) -> None:
    assert superseded_message("/ckpt/ns/job-uid", fence(3, pod="job-worker-0"), 2, None) == (
        "superseded: generation 3 of this job claimed MWJ_CHECKPOINT_DIR /ckpt/ns/job-uid "
        "(fence.json, pod job-worker-0, at 22:13:20 UTC); this trainer is generation 2 and "
        "stops before training without saving")
    assert superseded_message("/d", None, 0, 35).endswith(
        "another worker of this group found a newer generation in MWJ_CHECKPOINT_DIR /d "
        "(fence.json); this trainer is generation 0 and stops at step 35 without saving")
