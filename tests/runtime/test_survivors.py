"""Survivor saves (runtime/survivors.py): how the state is cut into parts, how survivors share
the writing of one copy (a dead writer's part written by another, a copy whose weights moved
never kept), which copy the next group restores, and the step a survivor's weights reflect
after a failed step."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
from multiworker.runtime import survivors
from multiworker.runtime.config import RuntimeConfig, load_config
from multiworker.runtime.files import write_json

UID = "uid-1"


@pytest.mark.parametrize(("sizes", "count", "parts"), [
    ([10, 10, 10, 10], 2, [(0, 1), (2, 3)]),
    ([10, 10, 10, 10], 4, [(0,), (1,), (2,), (3,)]),
    ([10, 10, 10, 10], 8, [(0,), (1,), (2,), (3,)]),      # no more parts than variables
    ([100, 1, 1, 1], 2, [(0,), (1, 2, 3)]),               # a large variable is a part of its own
    ([1, 1, 1, 100], 2, [(0, 1, 2), (3,)]),
    ([1, 100, 1, 1], 3, [(0,), (1,), (2, 3)]),
    ([1, 1, 1, 1, 1, 100], 4, [(0, 1, 2), (3,), (4,), (5,)]),  # a variable for each part
    ([5], 3, [(0,)]),
    ([], 4, []),
    ([4, 4, 4, 4, 4, 4], 1, [(0, 1, 2, 3, 4, 5)]),
])
def test_the_state_is_cut_into_parts_of_about_equal_bytes(
    sizes: list[int], count: int, parts: list[tuple[int, ...]]
) -> None:
    assert survivors.plan_parts(sizes, count) == parts


@pytest.mark.parametrize(("worker", "workers", "count", "order"), [
    (0, 4, 6, [0, 1, 2, 3, 4, 5]),
    (1, 4, 6, [1, 2, 3, 4, 5, 0]),
    (3, 4, 6, [4, 5, 0, 1, 2, 3]),
    (2, 3, 4, [2, 3, 0, 1]),
])
def test_survivors_start_claiming_apart(worker: int, workers: int, count: int,
                                        order: list[int]) -> None:
    assert survivors.claim_order(worker, workers, count) == order


X, Y = np.ones((4, 2), "float32"), np.zeros((4, 1), "float32")


def trained(steps: int = 1, seed: int = 1) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.1), loss="mse")
    for _ in range(steps):
        model.train_on_batch(X, Y)
    return model


def witnessed(model: keras.Model, step: int = 1) -> survivors.Witness:
    witness = survivors.Witness(model)
    witness.step_done(step)
    return witness


def config(tmp_path: Path, worker: int, workers: int = 3, generation: int = 0) -> RuntimeConfig:
    peers = [f"localhost:{2000 + i}" for i in range(workers)]
    tf_config = {"cluster": {"worker": peers}, "task": {"type": "worker", "index": worker}}
    return load_config({"MWJ_JOB_UID": UID, "MWJ_CHECKPOINT_DIR": str(tmp_path),
                        "TF_CONFIG": json.dumps(tf_config), "MWJ_WORKER_INDEX": str(worker),
                        "MWJ_NUM_WORKERS": str(workers), "MWJ_RESTART_COUNT": str(generation)})


def state(model: keras.Model) -> list[np.ndarray]:
    return [np.asarray(v.numpy()) for v in survivors.state_variables(model, None)]


def restored_into_a_fresh_model(tmp_path: Path) -> keras.Model:
    copy = survivors.newest(str(tmp_path), UID)
    assert copy is not None
    fresh = trained(seed=2)  # other weights, the same structure (its optimizer built)
    survivors.restore(copy, survivors.state_variables(fresh, None), UID)
    return fresh


def test_one_survivor_alone_writes_the_whole_copy_which_restores_bit_for_bit(
    tmp_path: Path
) -> None:
    model = trained()
    saved = survivors.save(model, config(tmp_path, 1), witnessed(model))
    assert saved is not None and (saved.step, saved.generation, saved.writers) == (1, 0, (1,))
    assert saved.parts_written == len(os.listdir(tmp_path / "survivors" / "g0-s1")) // 3
    assert saved.describe() == "survivors of generation 0 (workers 1)"
    fresh = restored_into_a_fresh_model(tmp_path)
    for a, b in zip(state(fresh), state(model), strict=True):
        np.testing.assert_array_equal(a, b)


def test_survivors_saving_together_write_one_copy_between_them(tmp_path: Path) -> None:
    """Workers 1, 2 and 3 of 4 (worker 0 died): each claims parts; the bytes written are
    the state's once, not three times."""
    model = trained()
    witnesses = {w: witnessed(model) for w in (1, 2, 3)}
    results: dict[int, survivors.SurvivorSave | None] = {}
    barrier = threading.Barrier(3)

    def survive(worker: int) -> None:
        barrier.wait()
        results[worker] = survivors.save(model, config(tmp_path, worker, workers=4),
                                         witnesses[worker])

    threads = [threading.Thread(target=survive, args=(w,)) for w in (1, 2, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    saves = [s for s in results.values() if s is not None]
    assert len(saves) == 3
    assert sum(s.parts_written for s in saves) == 6  # 2 a survivor
    size = survivors.state_bytes(survivors.state_variables(model, None))
    written = sum(s.bytes_written for s in saves)
    assert size <= written <= 1.1 * size + 6 * 4096, (written, size)  # and each part's index
    for a, b in zip(state(restored_into_a_fresh_model(tmp_path)), state(model), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_part_whose_writer_died_after_claiming_it_is_written_by_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(survivors, "MIN_STEAL_SECONDS", 0.2)
    model = trained()
    copy = tmp_path / "survivors" / "g0-s1"
    copy.mkdir(parents=True)
    # Worker 2's claim of part 2, and nothing more: it was killed before it wrote.
    (copy / "part-2-of-4.claim").write_text("2\n")
    saved = survivors.save(model, config(tmp_path, 1, workers=3), witnessed(model))
    assert saved is not None and saved.parts_written == 4
    assert survivors.newest(str(tmp_path), UID) is not None


def test_a_copy_not_complete_is_never_chosen(tmp_path: Path) -> None:
    model = trained()
    assert survivors.save(model, config(tmp_path, 1), witnessed(model)) is not None
    copy = tmp_path / "survivors" / "g0-s1"
    (copy / "part-1-of-4.done").unlink()  # a writer killed before it published its part
    assert survivors.newest(str(tmp_path), UID) is None


def put_copy(root: Path, generation: int, step: int, *, uid: str = UID, parts: int = 2,
             done: int | None = None, poisoned: bool = False, other_format: bool = False,
             ) -> None:
    """A copy of `parts` parts of one variable each, `done` of them published
    (`other_format`: markers without the layout of raw parts, never read)."""
    copy = root / survivors.SURVIVORS_DIR / f"g{generation}-s{step}"
    copy.mkdir(parents=True)
    for index in range(parts if done is None else done):
        name = f"part-{index}-of-{parts}.w1"
        (copy / name).write_bytes(np.float32(index).tobytes())
        where = {"dir": name} if other_format else {"file": name, "layout": [["float32", []]]}
        write_json(str(copy / f"part-{index}-of-{parts}.done"),
                   {"jobUid": uid, "generation": generation, "step": step, "part": index,
                    "count": parts, **where, "variables": [index], "writer": 1,
                    "seconds": 0.1})
    if poisoned:
        write_json(str(copy / survivors.POISONED), {"worker": 2})


def test_the_newest_complete_copy_of_this_job_is_chosen(tmp_path: Path) -> None:
    put_copy(tmp_path, 3, 353)
    put_copy(tmp_path, 3, 354)
    put_copy(tmp_path, 3, 360, done=1)  # a part never published
    put_copy(tmp_path, 3, 370, uid="another-job")  # another job's, in a hand-set directory
    put_copy(tmp_path, 3, 380, poisoned=True)  # weights moved while it was written
    put_copy(tmp_path, 3, 385, other_format=True)  # parts of another format: not read
    (tmp_path / "survivors" / "g3-w1-s390").mkdir()  # not a copy's name
    newest = survivors.newest(str(tmp_path), UID)
    assert newest is not None
    assert (newest.step, newest.writers, newest.describe()) == \
        (354, (1,), "survivors of generation 3 (workers 1)")
    assert newest.path == os.path.join(tmp_path, "survivors", "g3-s354")


def test_among_equal_steps_the_later_generation_wins(tmp_path: Path) -> None:
    put_copy(tmp_path, 2, 100)
    put_copy(tmp_path, 4, 100)
    newest = survivors.newest(str(tmp_path), UID)
    assert newest is not None and newest.generation == 4


def test_no_survivors_directory_means_none(tmp_path: Path) -> None:
    assert survivors.newest(str(tmp_path), UID) is None


def test_a_periodic_checkpoint_prunes_the_copies_it_covers(tmp_path: Path) -> None:
    put_copy(tmp_path, 1, 90)
    put_copy(tmp_path, 1, 100)
    put_copy(tmp_path, 1, 101)
    (tmp_path / "survivors" / "g0-w2-s80").mkdir()  # an earlier runtime's replica
    survivors.prune(str(tmp_path), 100)
    assert sorted(os.listdir(tmp_path / "survivors")) == ["g1-s101"]


def test_a_copy_of_another_model_does_not_restore(tmp_path: Path) -> None:
    model = trained()
    assert survivors.save(model, config(tmp_path, 1), witnessed(model)) is not None
    copy = survivors.newest(str(tmp_path), UID)
    assert copy is not None
    other = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    other.compile(optimizer=keras.optimizers.Adam(0.1), loss="mse")
    other.train_on_batch(X, Y)
    with pytest.raises(ValueError, match="holds 14 variables, this model has 8"):
        survivors.restore(copy, survivors.state_variables(other, None), UID)


def test_a_part_cut_short_or_of_other_shapes_does_not_restore(tmp_path: Path) -> None:
    model = trained()
    assert survivors.save(model, config(tmp_path, 1), witnessed(model)) is not None
    copy = survivors.newest(str(tmp_path), UID)
    assert copy is not None
    wider = keras.Sequential([keras.Input((2,)), keras.layers.Dense(4),
                              keras.layers.Dense(1)])  # as many variables, other shapes
    wider.compile(optimizer=keras.optimizers.Adam(0.1), loss="mse")
    wider.train_on_batch(X, Y)
    with pytest.raises(ValueError, match="does not hold this model's variables"):
        survivors.restore(copy, survivors.state_variables(wider, None), UID)
    part = max(Path(copy.path).glob("part-*.w1"), key=lambda p: p.stat().st_size)
    part.write_bytes(part.read_bytes()[:-4])  # torn: what the sync before publishing prevents
    with pytest.raises(ValueError, match="does not hold this model's variables"):
        survivors.restore(copy, survivors.state_variables(trained(), None), UID)


@pytest.mark.parametrize("updated", [False, True])
def test_the_witness_tells_whether_the_failed_step_moved_the_weights(updated: bool) -> None:
    """Keras may count a step whose gradients never arrived (weights at N, iterations N+1),
    and a collective after the update may fail once the weights moved (N+1)."""
    model = trained()
    witness = witnessed(model)
    model.optimizer.iterations.assign_add(1)  # counted either way
    if updated:
        model.train_on_batch(X, Y)
    assert witness.reflected()[0] == (2 if updated else 1)


def test_the_witness_samples_a_large_variable_and_sees_any_update_of_it() -> None:
    """A step's update moves every element of a trained variable it reaches: a sample of a
    few thousand elements tells, at a cost that does not grow with the variable."""
    model = keras.Sequential([keras.Input((512,)), keras.layers.Dense(256, use_bias=False)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    x, y = np.ones((2, 512), "float32"), np.zeros((2, 256), "float32")
    model.train_on_batch(x, y)
    witness = witnessed(model)
    assert witness.reflected()[0] == 1
    model.train_on_batch(x, y)
    assert witness.reflected()[0] == 2


def test_a_step_counts_as_stuck_from_the_usual_step_not_the_start_up(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a 25 s start-up and 0.2 s steps, a stopped peer's survivors counted as stuck only
    after 10.7 s, beyond survivorSaveSeconds (10): killed before they saved."""
    clock = [0.0]
    monkeypatch.setattr(survivors.time, "monotonic", lambda: clock[0])
    witness = survivors.Witness(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))
    clock[0] = 25.0  # the first step, after markers, restore and tracing
    witness.step_done(1)
    for step in range(2, 6):
        clock[0] += 0.2
        witness.step_done(step)
    clock[0] += survivors.STUCK_SECONDS + 0.1
    assert witness.stuck()


@pytest.mark.parametrize("lands_during_the_write", [False, True])
def test_a_copy_whose_weights_move_while_it_is_written_is_never_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lands_during_the_write: bool,
) -> None:
    """A save from the SIGTERM thread while the main thread waits in its all-reduce: if the
    peer was slow rather than gone, the all-reduce completes and the update lands during the
    write. The copy, labelled with the step judged before it, would hold the next one or a
    mix of both: it is poisoned for every survivor, and never restored."""
    model = trained()
    witness = witnessed(model)
    real = survivors._write_part
    writes = [0]

    def write_part(*args: Any) -> Any:
        written = real(*args)
        writes[0] += 1
        if lands_during_the_write and writes[0] == 2:
            model.train_on_batch(X, Y)  # the main thread's update, mid-save
        return written

    monkeypatch.setattr(survivors, "_write_part", write_part)
    saved = survivors.save(model, config(tmp_path, 1), witness)
    if lands_during_the_write:
        assert saved is None
        assert survivors.newest(str(tmp_path), UID) is None
        assert (tmp_path / "survivors" / "g0-s1" / survivors.POISONED).exists()
    else:
        assert saved is not None and saved.step == 1
        assert survivors.newest(str(tmp_path), UID) == survivors.SurvivorSave(
            saved.path, 1, 0, (1,))
