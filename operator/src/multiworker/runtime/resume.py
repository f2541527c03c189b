"""Where a resumed run continues: pure arithmetic on steps, kept apart from TensorFlow."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Segment:
    """One `model.fit` call: epochs [initial_epoch, epochs) of `steps_per_epoch` steps."""

    initial_epoch: int
    epochs: int
    steps_per_epoch: int


def plan_segments(restored_step: int, steps_per_epoch: int, epochs: int) -> list[Segment]:
    """The fit calls that continue from `restored_step`: first the rest of a partly done
    epoch, then whole epochs, so no step is repeated and epoch numbers stay right."""
    epoch, done = divmod(restored_step, steps_per_epoch)
    segments = []
    if done and epoch < epochs:
        segments.append(Segment(epoch, epoch + 1, steps_per_epoch - done))
        epoch += 1
    if epoch < epochs:
        segments.append(Segment(epoch, epochs, steps_per_epoch))
    return segments
