"""sage_tfx.privacy.checks: one numpy-free module of argument checks, each layer keeping its error class."""

import math
import re

import numpy as np
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


def test_integer_ranges_and_messages():

    from sage_tfx.privacy.checks import integer

    assert integer(3, "n", low=1) == 3 and integer(np.int64(7), "n", low=1) == 7 and integer(4.0, "n") == 4
    assert integer(None, "n", allow_none=True) is None and integer(0, "n", low=0, high=1, high_open=True) == 0
    # a fraction is refused, not truncated: int(2.5) == 2 would silently lower a noise scale or a cell count
    for bad in (2.5, 0, -3, True, "3", math.nan, math.inf, None):
        with pytest.raises(LayerError, match=rf"^cells {re.escape(repr(bad))} is invalid: must be an integer >= 1$"):
            integer(bad, "cells", low=1, error=LayerError)
    with pytest.raises(LedgerError, match=r"^s must be an integer in \[1, 8\), got 8$"):
        integer(8, "s", low=1, high=8, high_open=True, message="{what} must be {rule}, got {value!r}")
    with pytest.raises(LedgerError, match=r"must be an integer in \[1, 4\]$"):
        integer(5, "t", low=1, high=4)
    with pytest.raises(LedgerError, match=r"must be an integer <= 4$"):
        integer(5, "t", high=4)


def test_interval_is_a_finite_pair_low_below_high():
    from sage_tfx.privacy.checks import interval

    assert interval((-1, 2), "label_range") == (-1.0, 2.0) and interval([0, "0.5"], "r") == (0.0, 0.5)
    for bad in ((1, 1), (2, 1), (0, math.inf), (math.nan, 1), (1,), (1, 2, 3), 5, "ab", None):
        with pytest.raises(
            LayerError,
            match=rf"^label_range={re.escape(repr(bad))} is invalid: must be a pair "
            r"\(low, high\) of finite numbers, low < high$",
        ):
            interval(bad, "label_range", error=LayerError, message="{what}={value!r} is invalid: must be {rule}")


def test_converted_modules_raise_their_sage_error_naming_the_value():
    """filters / curves / split (LedgerError), samplers (SamplerError), adassp (AdaSSPConfigError): each bad
    argument named with its value and the rule, by a SageError that is still a ValueError."""
    from sage_tfx.privacy import adassp, curves, filters, randomness, samplers
    from sage_tfx.privacy.split import BudgetSplit

    cases = [
        # a bool is no budget: refused (it used to pass as 1.0)
        (lambda: filters.BasicFilter(True, 1e-6), LedgerError, r"^global epsilon True is not a number$"),
        (
            lambda: filters.BasicFilter(math.inf, 1e-6),
            LedgerError,
            r"^global epsilon inf is invalid: must be finite and > 0$",
        ),
        (lambda: filters.BasicFilter(1.0, "x"), LedgerError, r"^global delta 'x' is not a number$"),
        (lambda: filters.RdpFilter(1.0, 0.0), LedgerError, r"^global delta 0\.0 is invalid: need 0 < delta < 1$"),
        (lambda: filters.make_filter("moments", 1.0, 1e-6), LedgerError, r"accounting 'moments' is unknown"),
        (
            lambda: curves.check_orders([2.0, "x"]),
            LedgerError,
            r"^RDP order 'x' is invalid: orders must be finite and > 1\.01$",
        ),
        (
            lambda: curves.as_curve([0.1, -1.0], (2.0, 4.0)),
            LedgerError,
            r"^RDP curve value -1\.0 at order 4\.0 is invalid: must be finite and >= 0$",
        ),
        (lambda: curves.as_curve({2.0: "x"}, (2.0,)), LedgerError, r"^RDP curve value 'x' at order 2\.0 is invalid"),
        (lambda: BudgetSplit.for_epsilon("x", 1e-6), LedgerError, r"^iteration epsilon 'x' is invalid: must be finite"),
        (
            lambda: BudgetSplit.for_epsilon(1.0, 1e-6, preprocessing_share=0.5, count_share=0.5),
            LedgerError,
            r"^count_share 0\.5 is invalid: must be in \[0, 1 - preprocessing_share = 0\.5\)$",
        ),
        (
            lambda: BudgetSplit.for_epsilon(1.0, 1e-6, disjoint_split=False, validation_share=0),
            LedgerError,
            r"^validation_share 0 is invalid: must be in \(0, 1\)$",
        ),
        (
            lambda: samplers.discrete_laplace(2.5, 3, 0),
            randomness.SamplerError,
            r"^discrete_laplace: the scale t must be an integer in \[1, 4503599627370496\], got 2\.5$",
        ),
        (
            lambda: samplers.grid_laplace_params(1.0, 1.0, cells=2.5),
            randomness.SamplerError,
            r"^cells must be an integer >= 1, got 2\.5$",
        ),
        (
            lambda: samplers.grid_gaussian_params(1.0, math.inf),
            randomness.SamplerError,
            r"^sigma must be a finite number > 0, got inf$",
        ),
        (lambda: randomness.secure_rng(-1), randomness.SamplerError, r"^seed must be an integer >= 0, got -1$"),
        (
            lambda: adassp.noise_scales(1.0, 1e-6, 1.0, 1.0, 2.5),
            adassp.AdaSSPConfigError,
            r"^dim=2\.5 is invalid: need at least one feature \(an integer >= 1\)$",
        ),
        (
            lambda: adassp.noise_scales(1.0, "x", 1.0, 1.0, 1),
            adassp.AdaSSPConfigError,
            r"^delta='x' is invalid: must be in \(0, 1\)$",
        ),
    ]
    for call, error, match in cases:
        with pytest.raises(error, match=match) as info:
            call()
        assert isinstance(info.value, SageError) and isinstance(info.value, ValueError)
