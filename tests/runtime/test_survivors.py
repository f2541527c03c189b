"""Survivor saves (runtime/survivors.py): which save the next group restores, and the step a
survivor's weights reflect after a failed step."""

from __future__ import annotations

import os
from pathlib import Path

import keras
import numpy as np
import pytest
from multiworker.runtime import survivors
from multiworker.runtime.config import load_config
from multiworker.runtime.files import write_json

UID = "uid-1"


def put(root: Path, generation: int, worker: int, step: int, *, complete: bool = True,
        uid: str = UID, state_step: int | None = None) -> None:
    where = root / survivors.SURVIVORS_DIR / f"g{generation}-w{worker}-s{step}"
    where.mkdir(parents=True)
    (where / "ckpt.index").write_text("")
    if complete:
        write_json(str(where / survivors.STATE_FILE),
                   {"step": step if state_step is None else state_step,
                    "generation": generation, "worker": worker, "jobUid": uid})


def test_the_newest_complete_save_of_this_job_is_chosen(tmp_path: Path) -> None:
    put(tmp_path, 3, 1, 353)
    put(tmp_path, 3, 2, 354)
    put(tmp_path, 3, 0, 360, complete=False)  # torn: its state.json never written
    put(tmp_path, 3, 1, 370, uid="another-job")  # another job's, in a hand-set directory
    put(tmp_path, 3, 2, 380, state_step=381)  # name and state disagree: not trusted
    newest = survivors.newest(str(tmp_path), UID)
    assert newest is not None
    assert (newest.step, newest.worker, newest.describe()) == \
        (354, 2, "survivor worker-2, generation 3")
    assert newest.path == os.path.join(tmp_path, "survivors", "g3-w2-s354", "ckpt")


def test_among_equal_steps_the_later_generation_wins(tmp_path: Path) -> None:
    put(tmp_path, 2, 0, 100)
    put(tmp_path, 4, 1, 100)
    newest = survivors.newest(str(tmp_path), UID)
    assert newest is not None and newest.generation == 4


def test_no_survivors_directory_means_none(tmp_path: Path) -> None:
    assert survivors.newest(str(tmp_path), UID) is None


def test_a_periodic_checkpoint_prunes_the_saves_it_covers(tmp_path: Path) -> None:
    put(tmp_path, 1, 0, 90)
    put(tmp_path, 1, 1, 100)
    put(tmp_path, 1, 2, 101)
    survivors.prune(str(tmp_path), 100)
    assert sorted(os.listdir(tmp_path / "survivors")) == ["g1-w2-s101"]


X, Y = np.ones((4, 2), "float32"), np.zeros((4, 1), "float32")


def trained_one_step() -> tuple[keras.Model, survivors.Witness]:
    """A model after one step, and its witness of that step."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.train_on_batch(X, Y)
    witness = survivors.Witness(model)
    witness.step_done(1)
    return model, witness


@pytest.mark.parametrize("updated", [False, True])
def test_the_witness_tells_whether_the_failed_step_moved_the_weights(updated: bool) -> None:
    """Keras may count a step whose gradients never arrived (weights at N, iterations N+1),
    and a collective after the update may fail once the weights moved (N+1)."""
    model, witness = trained_one_step()
    model.optimizer.iterations.assign_add(1)  # counted either way
    if updated:
        model.train_on_batch(X, Y)
    assert witness.reflected()[0] == (2 if updated else 1)


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
def test_a_save_whose_weights_move_while_it_is_written_is_never_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lands_during_the_write: bool,
) -> None:
    """A save from the SIGTERM thread while the main thread waits in its all-reduce: if the
    peer was slow rather than gone, the all-reduce completes and the update lands during the
    write. The save, labelled with the step judged before it, would hold the next one or a
    mix of both; it is dropped instead (no state.json: never restored)."""
    model, witness = trained_one_step()
    real = survivors.checkpointed

    def checkpointed(*args: object, **kwargs: object) -> object:
        made = real(*args, **kwargs)  # type: ignore[arg-type]
        write = made.write

        def writing(path: str) -> str:
            written = write(path)
            if lands_during_the_write:
                model.train_on_batch(X, Y)  # the main thread's update, mid-save
            return written
        made.write = writing
        return made

    monkeypatch.setattr(survivors, "checkpointed", checkpointed)
    config = load_config({"MWJ_JOB_UID": UID, "MWJ_CHECKPOINT_DIR": str(tmp_path)})
    saved = survivors.save(model, config, witness)
    if lands_during_the_write:
        assert saved is None
        assert survivors.newest(str(tmp_path), UID) is None
        assert not list((tmp_path / survivors.SURVIVORS_DIR).iterdir())
    else:
        assert saved is not None and saved.step == 1
        assert survivors.newest(str(tmp_path), UID) == saved
