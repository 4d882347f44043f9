"""sage_tfx.privacy.checks: one numpy-free module of argument checks, each layer keeping its error class."""
import math

import pytest

from sage_tfx.privacy.checks import finite, number, positive, probability, rule_text
from sage_tfx.privacy.errors import LedgerError, SageError


class LayerError(SageError, ValueError):
    pass


def test_number_ranges_and_messages():
    assert number("2.5", "x") == 2.5 and positive(3, "eps") == 3.0
    assert probability(0.0, "delta", zero=True) == 0.0 and probability(0.5, "delta") == 0.5
    for bad in (0, -1.0, math.nan, math.inf, True, "x", None):
        with pytest.raises(LayerError, match=r"eps .* is invalid: must be finite and > 0"):
            positive(bad, "eps", error=LayerError)
    for bad, zero in ((0.0, False), (1.0, True), (-0.1, True), (math.nan, True)):
        with pytest.raises(LedgerError, match=r"must be in \(0, 1\)" if not zero else r"must be in \[0, 1\)"):
            probability(bad, "delta", zero=zero)
    with pytest.raises(LayerError, match="^epsilon 'x' is not a number$"):
        number("x", "epsilon", error=LayerError, not_number="{what} {value!r} is not a number")
    with pytest.raises(LayerError, match=r"^scale=-1 must be a finite number > 0$"):
        positive(-1, "scale", error=LayerError, message="{what}={value!r} must be a finite number > 0")
    assert positive(None, "eps", allow_none=True) is None and positive(True, "b", allow_bool=True) == 1.0
    assert rule_text(0, 1, low_open=True) == "in (0, 1]" and rule_text(high=2) == "finite and <= 2"


def test_finite_keeps_the_ledgers_messages():
    assert finite(None, "eps") is None and finite(True, "eps") == 1.0
    with pytest.raises(LedgerError, match=r"^eps 'x' is not a number$"):
        finite("x", "eps")
    with pytest.raises(LedgerError, match=r"^eps inf is invalid: must be finite$"):
        finite(math.inf, "eps")
    with pytest.raises(LedgerError, match=r"^eps -1 is invalid: must be >= 0$"):
        finite(-1, "eps", nonnegative=True)
    with pytest.raises(ValueError, match=r"^eps 0 is invalid: must be > 0$"):
        finite(0, "eps", positive=True, error=ValueError)


def test_layers_keep_their_messages():
    """The callers converted to the module keep their error classes and the messages their tests assert."""
    from sage_tfx.transform.budget import check_budget_delta
    from sage_tfx.transform.errors import DPTransformError
    from sage_tfx.transform.noise import check_epsilon
    from sage_tfx.validation.core import ValidationInputError, check_positive

    with pytest.raises(DPTransformError, match=r"^epsilon must be a finite number > 0, got nan$"):
        check_epsilon(math.nan)
    with pytest.raises(DPTransformError, match=r"^epsilon must be a positive number, got 'x'$"):
        check_epsilon("x")
    with pytest.raises(DPTransformError, match=r"^d must be in \[0, 1\), got 1$"):
        check_budget_delta(1, "d")
    with pytest.raises(ValidationInputError, match=r"^eta True must be a positive number$"):
        check_positive("eta", True)
    with pytest.raises(ValidationInputError, match=r"^eta -1 must be finite and > 0$"):
        check_positive("eta", -1)
