"""One line for an error: the error itself (not TensorFlow's listing of frames, not a Python
worker's traceback header), and the frame in the user's code, never a library's."""
import json
import os

import pytest

from sparkdeep.errors import error_line, user_frame

HERE = os.path.relpath(__file__, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def raising(fn, *args):
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - the error is the result
        return exc
    raise AssertionError("did not raise")


def line_of(fn, text: str) -> int:
    import inspect
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def missing_attribute(x):
    return x.dense_shape


def test_a_plain_error_is_its_first_line_or_all_of_it():
    exc = ValueError("\nshard 7 is corrupt\n  rows 10-20\n")
    assert error_line(exc) == "ValueError: shard 7 is corrupt"
    assert error_line(exc, whole=True) == "ValueError: shard 7 is corrupt | rows 10-20"
    assert error_line(ValueError()) == "ValueError"


def test_the_frame_is_the_innermost_in_own_code_not_in_the_library_it_called():
    def parse(text):
        return json.loads(text)
    exc = raising(parse, "{")
    assert user_frame(exc) == f"{HERE}:{line_of(parse, 'json.loads')} in parse"
    assert error_line(exc, where=True) == (f"JSONDecodeError: Expecting property name enclosed in double quotes: "
                                           f"line 1 column 2 (char 1) (at {HERE}:{line_of(parse, 'json.loads')} in parse)")


def test_the_projects_own_frames_count_and_are_shown_from_its_root(monkeypatch):
    from sparkdeep.transformers._faults import FAIL_AT_EPOCH_ENV, after_epoch_hook
    monkeypatch.setenv(FAIL_AT_EPOCH_ENV, "1:2")
    exc = raising(after_epoch_hook(), 1, 2)
    assert user_frame(exc).startswith("transformers/_faults.py:") and user_frame(exc).endswith(" in hook")


def test_an_error_whose_traceback_shows_no_own_frame_names_its_causes():
    def fails():
        return {}["key"]
    try:
        try:
            fails()
        except KeyError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as exc:
        outer = exc
    outer.__traceback__ = None  # as if raised where no frame of ours shows
    assert user_frame(outer) == f"{HERE}:{line_of(fails, 'return {}')} in fails"


def test_tensorflows_traced_code_names_the_error_and_the_source_line_not_the_listing():
    """An error while tracing a tf.function: TensorFlow's message lists the traced code's
    frames ("in user code:"), its traceback holds AutoGraph's generated copies."""
    tf = pytest.importorskip("tensorflow")

    @tf.function
    def fused(x):
        return missing_attribute(x * 2)
    exc = raising(fused, tf.constant([1.0]))
    assert str(exc).lstrip().startswith("in user code:")
    where = f"{HERE}:{line_of(missing_attribute, 'dense_shape')} in missing_attribute"
    assert error_line(exc, whole=True, where=True) == (
        f"AttributeError: 'SymbolicTensor' object has no attribute 'dense_shape' (at {where})")


def test_tensorflows_graph_execution_error_names_the_node_message_and_its_source_line():
    tf = pytest.importorskip("tensorflow")

    @tf.function
    def gather(x, i):
        return tf.gather(x, i)
    exc = raising(gather, tf.constant([1.0, 2.0]), tf.constant([5]))
    assert str(exc).startswith("Graph execution error:")
    assert error_line(exc, where=True) == (f"InvalidArgumentError: indices[0] = 5 is not in [0, 2) "
                                           f"(at {HERE}:{line_of(gather, 'tf.gather')} in gather)")


def test_a_python_workers_error_through_spark_is_its_own_line():
    """pyspark's PythonException begins with a header; the error is the traceback's last line."""
    text = ("\n  An exception was thrown from the Python worker. Please see the stack trace below.\n"
            "Traceback (most recent call last):\n  File \"job.py\", line 9, in boom\n    raise ValueError('x')\n"
            "ValueError: bad row in the UDF\n")
    assert error_line(RuntimeError(text), typed=False) == "ValueError: bad row in the UDF"


def test_no_frame_when_every_frame_is_a_librarys():
    exc = raising(json.loads, "{")
    exc.__traceback__ = exc.__traceback__.tb_next  # drop this test's own frame
    assert user_frame(exc) is None
    assert "(at " not in error_line(exc, where=True)
