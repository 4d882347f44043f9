"""The preprocessing budget: the grant reaches a preprocessing_fn, and no DP analyzer can spend past it.

Every DP analyzer records its (epsilon, delta) in the graph being traced before it reads data; the
preprocessing_fn spends the sum (basic composition). TensorFlow is imported only when tracing. The rule and its
proof: docs/dp_preprocessing.md, "The budget".
"""

import inspect
import math
import sys
from typing import NamedTuple

from sage_tfx.privacy.checks import probability

from .errors import BudgetExceeded, DPTransformError, MissingBudget
from .noise import check_epsilon

BUDGET_KEY = "sage"
EPSILON_FIELD = "preprocessing_epsilon"
DELTA_FIELD = "preprocessing_delta"

SPEND_COLLECTION = "sage_tfx.transform/spends"
GRANT_COLLECTION = "sage_tfx.transform/grants"


class Spend(NamedTuple):
    """What one DP analyzer asks of the preprocessing grant, as recorded in the traced graph.

    Args:
        analyzer: the analyzer's graph scope, e.g. ``"dp_mean"``.
        epsilon: the epsilon it spends.
        delta: the delta it spends (0 but for the DP vocabularies).
    """

    analyzer: str
    epsilon: float
    delta: float = 0.0


def check_budget_delta(delta, what: str = "preprocessing delta") -> float:
    """Return delta as a float; raise naming it unless 0 <= delta < 1."""
    return probability(
        delta,
        what,
        error=DPTransformError,
        zero=True,
        message="{what} must be {rule}, got {value!r}",
        not_number="{what} must be a number {rule}, got {value!r}",
    )


def budget_custom_config(epsilon, custom_config=None, *, delta=0.0):
    """A copy of custom_config with the preprocessing grant set where `PreprocessingBudget` reads it.

    Args:
        epsilon: the grant's preprocessing epsilon, > 0.
        custom_config: the pipeline's custom_config, or None; it is not changed.
        delta: the grant's preprocessing delta, in [0, 1); set only when > 0.

    Returns:
        A new dict whose ``[BUDGET_KEY]`` section holds ``EPSILON_FIELD`` (and ``DELTA_FIELD``).

    Raises:
        DPTransformError: epsilon or delta out of range.
    """
    out = dict(custom_config or {})
    section = dict(out.get(BUDGET_KEY) or {})
    section[EPSILON_FIELD] = check_epsilon(epsilon, "preprocessing epsilon")
    delta = check_budget_delta(delta)
    if delta > 0:
        section[DELTA_FIELD] = delta
    out[BUDGET_KEY] = section
    return out


def _current_graph():
    """The graph being built, or None when TensorFlow is not loaded or runs eagerly."""
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return None
    graph = tf.compat.v1.get_default_graph()
    if tf.executing_eagerly() and not getattr(graph, "building_function", False):
        return None
    return graph


def requested_spends(graph=None):
    """The spends DP analyzers recorded in a graph.

    Args:
        graph: the traced graph; None for the graph being built.

    Returns:
        The list of `Spend`, in the order the analyzers were built; empty outside a traced graph.
    """
    graph = graph if graph is not None else _current_graph()
    return list(graph.get_collection(SPEND_COLLECTION)) if graph is not None else []


def requested_epsilon(graph=None):
    """Total epsilon the DP analyzers in a graph spend (basic composition).

    Args:
        graph: the traced graph; None for the graph being built.

    Returns:
        The sum of the recorded epsilons (0.0 outside a traced graph).
    """
    return math.fsum(s.epsilon for s in requested_spends(graph))


def requested_delta(graph=None):
    """Total delta the DP analyzers in `graph` spend (basic composition: the deltas add)."""
    return math.fsum(s.delta for s in requested_spends(graph))


def record_spend(analyzer, epsilon, delta=0.0):
    """Record that `analyzer` spends (`epsilon`, `delta`) in the graph being built.

    Called by every DP analyzer before it builds anything that reads data. Raises
    `BudgetExceeded` (naming the analyzer, its ask, the new total and the grant) if a
    `PreprocessingBudget` of this graph would be exceeded, in epsilon or in delta;
    nothing is recorded then.
    """
    epsilon = check_epsilon(epsilon, f"epsilon of {analyzer}")
    delta = check_budget_delta(delta, f"delta of {analyzer}")
    graph = _current_graph()
    if graph is None:
        raise RuntimeError(
            f"{analyzer} is a tf.Transform analyzer: call it inside a preprocessing_fn "
            "(while tf.Transform traces it), not eagerly"
        )
    total = math.fsum([requested_epsilon(graph), epsilon])
    total_delta = math.fsum([requested_delta(graph), delta])
    for grant_epsilon, grant_delta in graph.get_collection(GRANT_COLLECTION):
        if total > grant_epsilon:
            raise BudgetExceeded(
                f"{analyzer} asks epsilon={epsilon!r}, which brings this preprocessing_fn to "
                f"epsilon={total!r} in total, more than its grant of {grant_epsilon!r}"
            )
        if total_delta > grant_delta:
            raise BudgetExceeded(
                f"{analyzer} asks delta={delta!r}, which brings this preprocessing_fn to delta={total_delta!r} "
                f"in total, more than its grant of {grant_delta!r}"
                + (
                    ""
                    if grant_delta
                    else ": the grant gives preprocessing no delta; charge one with a split "
                    "that has preprocessing_delta (sage run: the pipeline default 'preprocessing_delta')"
                )
            )
    graph.add_to_collection(SPEND_COLLECTION, Spend(analyzer, epsilon, delta))
    return epsilon


def _shares(total, n, weights):
    """``total`` split into n even shares or in proportion to ``weights``, never summing above it by rounding."""
    if (n is None) == (weights is None):
        raise ValueError(f"give either n or weights, got n={n!r}, weights={weights!r}")
    if weights is None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n!r}")
        weights = [1.0] * n
    weights = list(weights)
    if not weights:
        raise ValueError(f"weights must not be empty, got {weights!r}")
    for w in weights:
        check_epsilon(w, f"weight {w!r} in weights={weights!r}")
    total_weight = math.fsum(weights)
    shares = [total * w / total_weight for w in weights]
    while math.fsum(shares) > total:
        shares[-1] = math.nextafter(shares[-1], 0.0)
    return tuple(shares)


class PreprocessingBudget:
    """The (epsilon, delta) granted to one preprocessing_fn, split among its DP analyzers.

    Create it inside the preprocessing_fn (``PreprocessingBudget.from_custom_config``):
    it then guards the graph tf.Transform is tracing, so an analyzer that would push the
    total past the grant (in epsilon or in delta) raises `BudgetExceeded` before any data
    is read. ``delta`` is 0 unless the grant's split gives preprocessing a delta (needed
    only by the DP vocabularies).

    >>> budget = PreprocessingBudget.from_custom_config(custom_config)
    >>> eps_speed, eps_fare, eps_vocab = budget.split(weights=[3, 1, 1])
    >>> speed = dp_group_by_mean(hour, speed, 24, eps_speed, 100.0)
    >>> ids = dp_compute_and_apply_vocabulary(company, eps_vocab, budget.delta)

    Args:
        epsilon: the grant's preprocessing epsilon, > 0.
        delta: the grant's preprocessing delta, in [0, 1).

    Raises:
        DPTransformError: epsilon or delta out of range.
    """

    def __init__(self, epsilon, delta=0.0):
        self.epsilon = check_epsilon(epsilon, "preprocessing epsilon")
        self.delta = check_budget_delta(delta)
        self._graph = _current_graph()
        if self._graph is not None:
            self._graph.add_to_collection(GRANT_COLLECTION, (self.epsilon, self.delta))

    @classmethod
    def from_custom_config(cls, custom_config):
        """The budget Sage put in a preprocessing_fn's custom_config (see `budget_custom_config`).

        Args:
            custom_config: the preprocessing_fn's custom_config.

        Returns:
            The `PreprocessingBudget` of ``custom_config[BUDGET_KEY]``: its ``EPSILON_FIELD``, and its
            ``DELTA_FIELD`` (0 when absent).

        Raises:
            MissingBudget: custom_config holds no preprocessing epsilon.
            DPTransformError: the epsilon or delta found is out of range.
        """
        section = custom_config.get(BUDGET_KEY) if isinstance(custom_config, dict) else None
        if not isinstance(section, dict) or EPSILON_FIELD not in section:
            raise MissingBudget(
                f"custom_config has no preprocessing budget at [{BUDGET_KEY!r}][{EPSILON_FIELD!r}] "
                f"(got {custom_config!r}); Sage sets it from the grant, see budget_custom_config()"
            )
        return cls(section[EPSILON_FIELD], section.get(DELTA_FIELD, 0.0))

    def split(self, n=None, weights=None):
        """Split the grant's epsilon into n even shares, or in proportion to `weights`.

        The shares never add up to more than the grant, not even by rounding: the last
        share is lowered by ulps until the float sum fits.

        Args:
            n: the number of even shares (give n or weights).
            weights: positive weights, one per share (give n or weights).

        Returns:
            A tuple of epsilons, one per share, whose float sum is at most the grant's epsilon.

        Raises:
            ValueError: both or neither of n and weights, n not an integer >= 1, or no weights.
            DPTransformError: a weight not a finite number > 0.
        """
        return _shares(self.epsilon, n, weights)

    def split_delta(self, n=None, weights=None):
        """Split the grant's delta as `split` splits its epsilon (for several DP vocabularies).

        Args:
            n: the number of even shares (give n or weights).
            weights: positive weights, one per share (give n or weights).

        Returns:
            A tuple of deltas, one per share, whose float sum is at most the grant's delta.

        Raises:
            BudgetExceeded: the grant gives preprocessing no delta.
            ValueError: as for `split`.
        """
        if not self.delta:
            raise BudgetExceeded(
                "this preprocessing grant has no delta to split: charge one with a split that has "
                "preprocessing_delta (sage run: the pipeline default 'preprocessing_delta')"
            )
        return _shares(self.delta, n, weights)

    @property
    def requested(self):
        """Epsilon the DP analyzers of this budget's graph have asked for so far."""
        return requested_epsilon(self._graph)

    @property
    def requested_delta(self):
        """Delta the DP analyzers of this budget's graph have asked for so far."""
        return requested_delta(self._graph)

    @property
    def remaining(self):
        return max(0.0, self.epsilon - self.requested)

    def __repr__(self):
        return f"PreprocessingBudget(epsilon={self.epsilon!r}, delta={self.delta!r}, requested={self.requested!r})"


def call_preprocessing_fn(preprocessing_fn, inputs, custom_config):
    """Call preprocessing_fn(inputs, custom_config), or preprocessing_fn(inputs) if it takes one argument.

    Args:
        preprocessing_fn: the user's preprocessing_fn.
        inputs: the feature tensors to pass.
        custom_config: the custom_config to pass, if the function takes it.

    Returns:
        What preprocessing_fn returns.
    """
    params = inspect.signature(preprocessing_fn).parameters
    if "custom_config" in params or len(params) >= 2:
        return preprocessing_fn(inputs, custom_config)
    return preprocessing_fn(inputs)


def trace_requested_epsilon(preprocessing_fn, feature_spec, custom_config=None):
    """What a preprocessing_fn's DP analyzers would spend, from one trace on placeholders (no data read).

    Args:
        preprocessing_fn: the user's preprocessing_fn.
        feature_spec: the raw feature spec to trace it on.
        custom_config: the custom_config it receives (e.g. from `budget_custom_config`), or None.

    Returns:
        ``(total epsilon, list of Spend)``; each `Spend` carries its delta too.

    Raises:
        BudgetExceeded: the function's own `PreprocessingBudget` is exceeded.
    """
    from tensorflow_transform import impl_helper

    import sage_tfx  # noqa: F401, PLC0415

    graph, _, _ = impl_helper.trace_preprocessing_function(
        lambda inputs: call_preprocessing_fn(preprocessing_fn, inputs, custom_config),
        feature_spec,
        use_tf_compat_v1=True,
    )
    spends = requested_spends(graph)
    return math.fsum(s.epsilon for s in spends), spends
