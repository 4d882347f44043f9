"""What `sage run` says: the type of the error where a FAILED iteration began (never a value), and where the
model was pushed.

TFX's launcher raises a clean-up error (a NotFoundError on the run's output folder) while handling the module's own;
naming only the last error sent a user looking for a missing file when their run_fn had raised TypeError.
"""

import pytest

from sage_tfx.pipelines.check import describe_failure
from sage_tfx.privacy import RecordError, error_chain, public_error_text


class NotFoundError(Exception):
    """Stands for tf.errors.NotFoundError, raised by TFX while handling the module's error."""


def _cleanup_after(first):
    try:
        try:
            raise first
        except Exception:
            raise NotFoundError("/tmp/run/model_run: no such file")  # noqa: B904
    except NotFoundError as exc:
        return exc


def test_the_first_error_of_the_chain_is_named_then_the_clean_up_error():
    exc = _cleanup_after(TypeError("unhashable type: 'numpy.ndarray' at value 17.25"))
    text = public_error_text(exc)
    assert text == ("TypeError (message withheld: it may hold data values), then NotFoundError while handling it")
    assert "17.25" not in text and "/tmp" not in text
    assert [type(e).__name__ for e in error_chain(exc)] == ["NotFoundError", "TypeError"]


def test_a_record_error_keeps_its_value_free_message_in_the_chain():
    exc = _cleanup_after(RecordError("rain", 3, "is not 0 or 1"))
    assert public_error_text(exc) == ("RecordError: column 'rain': is not 0 or 1, then NotFoundError while handling it")


def test_a_single_error_reads_as_before():
    assert public_error_text(ValueError("x=3")) == "ValueError (message withheld: it may hold data values)"
    with pytest.raises(ValueError) as caught:
        raise ValueError("x=3")
    assert error_chain(caught.value) == [caught.value]


def test_the_check_shows_the_first_errors_traceback_and_the_last():
    text = describe_failure(_cleanup_after(TypeError("bad feature dict")))
    assert text.startswith("Traceback") and "TypeError: bad feature dict" in text
    assert text.endswith("(then, while handling it: NotFoundError: /tmp/run/model_run: no such file)")


def test_the_pushed_path_is_the_version_folder_tf_loads(tmp_path):
    """`sage run` said "model pushed to SERVING_DIR", where tf.saved_model.load fails: TFX's Pusher writes
    SERVING_DIR/VERSION. The last line now names the newest version folder."""
    from sage_tfx.cli.run import pushed_model_path

    assert pushed_model_path(str(tmp_path / "none")) == str(tmp_path / "none")
    for version in ("1795833936", "1795833999", "tmp"):  # "tmp": not a version
        (tmp_path / version).mkdir()
    assert pushed_model_path(str(tmp_path)) == str(tmp_path / "1795833999")
