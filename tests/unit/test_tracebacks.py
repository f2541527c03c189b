"""What a failed trainer's output says went wrong (decide/tracebacks.py): the exception and
where, data dumps elided, its shape and the hints for known causes."""

from __future__ import annotations

import pytest
from multiworker.decide.tracebacks import ELIDED, elide, readable, script_error

# What Keras 3's model.fit printed under MultiWorkerMirroredStrategy (TF 2.21, Keras 3.15.1).
KERAS3 = """\
W0000 00:00:1795946318.454481    7112 dataset.cc:997] Input of GeneratorDatasetOp::Dataset
Traceback (most recent call last):
  File "/opt/multiworker/examples/training/keras_tutorial.py", line 85, in <module>
    main()
  File "/opt/multiworker/examples/training/keras_tutorial.py", line 67, in main
    model.fit(
  File "/opt/venv/lib/python3.11/site-packages/keras/src/utils/traceback_utils.py", line 122, in error_handler
    raise e.with_traceback(filtered_tb) from None
  File "/opt/venv/lib/python3.11/site-packages/tensorflow/python/framework/constant_op.py", line 108, in convert_to_eager_tensor
    return ops.EagerTensor(value, ctx.device_name, dtype)
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
ValueError: Attempt to convert a value (PerReplica:{
  0: <tf.Tensor: shape=(32, 64), dtype=float32, numpy=
array([[0.    , 0.    , 0.    , ..., 0.9375, 1.    , 0.    ],
       [0.    , 0.5   , 0.8125, ..., 0.    , 0.    , 0.    ],
       ...,
       [0.    , 0.    , 0.125 , ..., 0.75  , 0.    , 0.    ]],
      shape=(32, 64), dtype=float32)>
}) with an unsupported type (<class 'tensorflow.python.distribute.values.PerReplica'>) to a Tensor.
"""
KERAS3_LINE = ("ValueError: Attempt to convert a value (PerReplica:{…}) with an unsupported type "
               "(<class 'tensorflow.python.distribute.values.PerReplica'>) to a Tensor.")

IMPORT = """\
Traceback (most recent call last):
  File "/app/train.py", line 3, in <module>
    import transformers
ModuleNotFoundError: No module named 'transformers'
"""

CHAINED = """\
Traceback (most recent call last):
  File "/app/train.py", line 9, in load
KeyError: 'path'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/app/train.py", line 12, in <module>
FileNotFoundError: [Errno 2] No such file or directory: '/data/train-00017.tfrecord'
"""


def test_keras_3s_error_is_its_line_with_the_batch_elided_and_the_scripts_own_frame() -> None:
    error = script_error(KERAS3)
    assert error is not None
    assert error.line == KERAS3_LINE
    assert error.frames == (
        'File "/opt/multiworker/examples/training/keras_tutorial.py", line 67, in main',
        ('File "/opt/venv/lib/python3.11/site-packages/tensorflow/python/framework/'
        'constant_op.py", line 108, in convert_to_eager_tensor'))
    assert error.summary().splitlines()[-1] == KERAS3_LINE
    assert "TF_USE_LEGACY_KERAS=1" in (error.hint() or "")


def test_a_traceback_cut_at_its_head_still_gives_the_exception() -> None:
    """Under FallbackToLogsOnError the kubelet keeps the log's last 2,048 bytes or 80 lines."""
    cut = KERAS3[KERAS3.index("  File \"/opt/venv/lib/python3.11/site-packages/tensorflow"):]
    error = script_error(cut)
    assert error is not None and error.line == KERAS3_LINE


@pytest.mark.parametrize(
    ("text", "line", "hint"),
    [
        (IMPORT, "ModuleNotFoundError: No module named 'transformers'", "lacks that module"),
        (CHAINED, ("FileNotFoundError: [Errno 2] No such file or directory: "
                  "'/data/train-00017.tfrecord'"), "not in the container"),
        (("tensorflow.python.framework.errors_impl.InvalidArgumentError: Incompatible shapes: "
         "[32,10] vs. [64,10]\n"), ("InvalidArgumentError: Incompatible shapes: [32,10] vs. "
         "[64,10]"), None),
        ("AssertionError\n", "AssertionError", None),
    ],
    ids=["import", "chained: the last", "module path dropped", "no message"],
)
def test_the_exception_line(text: str, line: str, hint: str | None) -> None:
    error = script_error(text)
    assert error is not None and error.line == line
    found = error.hint()
    assert (found is None) == (hint is None) and (hint or "") in (found or "")


@pytest.mark.parametrize("text", [
    "bad worker configuration: MWJ_CHECKPOINT_DIR: not shared (exit 2)",
    "", "Killed\n", "error: something went wrong (the runtime's own words)",
])
def test_no_exception_no_script_error(text: str) -> None:
    assert script_error(text) is None


def test_the_shape_blanks_numbers_and_keeps_the_rest() -> None:
    one = script_error("OSError: port 40123 in use by pid 17 at 0x7f3a\n")
    two = script_error("OSError: port 51999 in use by pid 912 at 0x1b2c\n")
    other = script_error("OSError: port 40123 refused\n")
    assert one and two and other
    assert one.shape(1) == two.shape(1) != other.shape(1)
    assert one.shape(1) != one.shape(2)


@pytest.mark.parametrize(("kind", "peers"), [
    ("UnavailableError", True), ("AbortedError", True), ("DeadlineExceededError", True),
    ("CancelledError", True), ("InvalidArgumentError", False), ("ValueError", False)])
def test_a_collectives_errors_are_the_peers(kind: str, peers: bool) -> None:
    error = script_error(f"tensorflow.python.framework.errors_impl.{kind}: Socket closed\n")
    assert error is not None and error.from_peers is peers


@pytest.mark.parametrize(
    ("text", "elided"),
    [
        ("shape (32, 64) kept", "shape (32, 64) kept"),
        ("a value (x:{\n 0: 1\n}) here", "a value (x:{…}) here"),
        ("list [" + "1, " * 100 + "1] long", "list […] long"),
        ("]], dtype=float32)>\n}) with a type (<class 'A'>)", "… with a type (<class 'A'>)"),
        ("ends in (an array([[1, 2],\n [3", "ends in (…"),
        ("mismatched (a] b) stays", "mismatched (a] b) stays"),
    ],
    ids=["short kept", "over lines", "long", "head cut", "tail cut", "mismatched"],
)
def test_elide(text: str, elided: str) -> None:
    assert elide(text) == elided
    assert ELIDED in elided or elided == text


def test_readable_is_the_summary_or_the_last_lines_elided() -> None:
    assert readable(KERAS3, 3, 600).splitlines()[-1] == KERAS3_LINE
    dump = "loss\n" + "x (" + "9 " * 300 + ")\nbye"
    assert readable(dump, 2, 600) == "x (…)\nbye"
    assert len(readable("y" * 900, 3, 600)) == 600


def test_a_failed_pods_message_is_the_exception_not_the_dump() -> None:
    """What lastFailure.message, the condition and the Event show (workers.tail)."""
    from multiworker.decide.observe import observe_group
    from multiworker.decide.workers import WorkerPhase

    from tests.unit.builders import JOB, JOB_UID, PodBuilder
    pod = PodBuilder(1).exited(1, message=KERAS3).build()
    [state] = observe_group([pod], job=JOB, job_uid=JOB_UID, workers=2, generation=0,
                            container="tensorflow").with_phase(WorkerPhase.FAILED)
    assert state.message.splitlines()[-1] == KERAS3_LINE
    assert "array(" not in state.message and "0.9375" not in state.message
