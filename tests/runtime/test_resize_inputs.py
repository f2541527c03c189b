"""The premise of `spec.elastic.batch: KeepGlobal`: a dataset of global batches, resumed at
the restored step by inputs.distribute(skip=step), continues the sample stream exactly across a
change of the group's size (3 workers, then 2, then 3 again), an uneven split included: no
sample skipped or seen twice, each step the same global batch an unresized run reads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import free_ports

READER = Path(__file__).with_name("resize_reader.py")
GLOBAL_BATCH = 10  # 4 + 3 + 3 on three workers, 5 + 5 on two


def read(tmp_path: Path, workers: int, skip: int, steps: int, global_batch: int = GLOBAL_BATCH,
         mode: str = "batches") -> list[list[int]]:
    """The samples of each step, the workers' shares in worker order."""
    ports = [str(port) for port in free_ports(workers)]
    outs = [tmp_path / f"skip{skip}-of{workers}-{i}.json" for i in range(workers)]
    processes = [subprocess.Popen([sys.executable, str(READER), str(workers), str(i), str(skip),
                                   str(steps), str(global_batch), str(out), *ports],
                                  env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin",
                                       "MODE": mode,
                                       "PYTHONPATH": ":".join(sys.path)})
                 for i, out in enumerate(outs)]
    assert [p.wait(timeout=240) for p in processes] == [0] * workers
    shares = [json.loads(out.read_text()) for out in outs]
    return [[v for share in shares for v in share[s]] for s in range(steps)]


@pytest.mark.timeout(900)
def test_a_resized_group_reads_on_from_the_sample_where_the_last_one_stopped(
    tmp_path: Path,
) -> None:
    steps = read(tmp_path, 3, 0, 4) + read(tmp_path, 2, 4, 3) + read(tmp_path, 3, 7, 3)
    assert steps == [list(range(s * GLOBAL_BATCH, (s + 1) * GLOBAL_BATCH)) for s in range(10)]


@pytest.mark.timeout(900)
def test_a_group_whose_global_batch_follows_its_size_reads_on_from_the_sample_it_stopped_at(
    tmp_path: Path,
) -> None:
    """ScaleLearningRate's input: 3 workers of 4 examples each (12 a step), then 2 (8), then 3;
    each generation starts at the sample count the last one saved (samples.py)."""
    steps = (read(tmp_path, 3, 0, 3, 12, "examples") + read(tmp_path, 2, 36, 3, 8, "examples")
             + read(tmp_path, 3, 60, 2, 12, "examples"))
    assert [s for step in steps for s in step] == list(range(84))
    assert [len(step) for step in steps] == [12, 12, 12, 8, 8, 8, 12, 12]
