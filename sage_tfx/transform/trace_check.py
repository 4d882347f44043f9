"""Every trace of a preprocessing_fn is the checked one, and every row is transformed on its own.

`TracedFn` wraps the function handed to tf.Transform and compares each trace's `TraceSignature` (outputs, DP
spends, analyzers, operation types, constants) with the checked trace's, raising `TraceMismatch` before any
output is written or used. `check_row_local` runs the checked trace on synthetic batches (no private data) and
refuses (`RowMixing`) code whose output or DP-analyzer input for one row depends on the other rows of its batch
or on randomness. A function that mixes rows only for values the synthetic rows never take passes.

Why, and what each check compares: docs/dp_preprocessing.md ("The DPTransform component": "Every trace is the
checked one" and the row check).
"""

import collections
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .budget import call_preprocessing_fn, requested_spends
from .errors import DPTransformError, RowMixing, TraceMismatch

TraceSignature = collections.namedtuple("TraceSignature", ["outputs", "spends", "analyzers", "ops", "constants"])

# Operations that differ between traces of the same function (the inputs' plumbing, the analyzers'
# placeholders and their constants in the last trace, captures) and say nothing about the computation.
_PLUMBING = frozenset({"Placeholder", "PlaceholderWithDefault", "Identity", "NoOp"})
_ANALYZER_OUTPUT_SCOPE = "temporary_analyzer_output"
ANALYZER_INPUT_PREFIX = "\x00analyzer input "  # keys of the analyzer inputs the checked trace also returns
SYNTHETIC_ROWS = 6
_SEED = 20261127  # fixed: the synthetic batches are public and the same on every run
_RTOL, _ATOL = 1e-5, 1e-6  # float outputs: kernels may round differently for another batch size


# ---------------------------------------------------------------- the signature of one trace


def _sinks(graph) -> list:
    from tensorflow_transform import analyzer_nodes

    return graph.get_collection(analyzer_nodes.ALL_REPLACEMENTS)


def _analyzer_labels(sinks) -> tuple:
    """(label, is a Sage DP analyzer) of tf.Transform analyzers (their sinks), evaluated or not."""
    from tensorflow_transform import analyzer_nodes

    from .analyzers import _NoiseOnce  # noqa: PLC0415

    labels = []
    for sink in sinks:
        op = sink.future.parent_operation.operation_def
        dp = isinstance(op, analyzer_nodes.PTransform) and isinstance(getattr(op, "ptransform", None), _NoiseOnce)
        labels.append((str(op.label), dp))
    return tuple(labels)


def _describe_outputs(outputs) -> tuple:
    return tuple(sorted((str(key), type(value).__name__, value.dtype.name) for key, value in outputs.items()))


def _constant_key(op):
    import tensorflow as tf

    value = tf.make_ndarray(op.get_attr("value"))
    return (str(value.dtype), value.shape, value.tobytes() if value.dtype != object else repr(value.tolist()))


def _replacement_keys(replacements) -> set:
    """The constants tf.Transform substitutes for evaluated analyzers in this trace (the noisy tables)."""
    keys = set()
    for value in (replacements or {}).values():
        array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
        keys.add((str(array.dtype), array.shape, array.tobytes() if array.dtype != object else repr(array.tolist())))
    return keys


def trace_signature(graph, before: tuple, outputs: dict, replacements=None) -> TraceSignature:
    """The signature of what the preprocessing_fn added to `graph` since `before` (`_marks(graph)` before the call:
    a graph traced inside another one starts with a copy of its collections)."""
    new_ops = graph.get_operations()[before[0] :]
    ops, constants = collections.Counter(), collections.Counter()
    replaced = _replacement_keys(replacements)
    for op in new_ops:
        if op.type in _PLUMBING or _ANALYZER_OUTPUT_SCOPE in op.name:
            continue
        if op.type == "Const":
            key = _constant_key(op)
            if key not in replaced:
                constants[key] += 1
            continue
        ops[op.type] += 1
    spends = tuple((s.analyzer, s.epsilon, s.delta) for s in requested_spends(graph)[before[1] :])
    return TraceSignature(
        _describe_outputs(outputs),
        spends,
        _analyzer_labels(_sinks(graph)[before[2] :]),
        tuple(sorted(ops.items())),
        tuple(sorted(constants.items(), key=repr)),
    )


def _difference(expected: TraceSignature, got: TraceSignature) -> str:
    """What differs, in words (the first field that differs)."""
    for field in TraceSignature._fields:
        want, have = getattr(expected, field), getattr(got, field)
        if want == have:
            continue
        if field in ("ops", "constants"):
            want, have = collections.Counter(dict(want)), collections.Counter(dict(have))
            extra, missing = have - want, want - have
            show = (lambda c: sorted(c.items())[:5]) if field == "ops" else (lambda c: f"{sum(c.values())}")
            return f"{field}: {show(extra)} added, {show(missing)} gone"
        return f"{field}: {list(have)} instead of {list(want)}"
    return "nothing"


def check_analyzers_are_dp(signature: TraceSignature) -> None:
    """Raise TraceMismatch naming the first analyzer of the trace that is not a Sage DP analyzer."""
    for label, dp in signature.analyzers:
        if not dp:
            raise TraceMismatch(
                f"a trace of the preprocessing_fn uses the tf.Transform analyzer {label!r}, which is "
                "not differentially private: use sage_tfx.transform's DP analyzers"
            )


# ---------------------------------------------------------------- the wrapper handed to tf.Transform


class TracedFn:
    """``preprocessing_fn(inputs)`` for tf.Transform: the user's function, every call checked against `expected`.

    ``expected`` None makes the call the reference: it returns, besides the outputs, the per-row inputs of
    the DP analyzers (keys starting with ANALYZER_INPUT_PREFIX) and keeps its signature in ``recorded``.

    A trace with the analyzers still unevaluated (tf.Transform's analysis and schema traces, built while
    the pipeline is) must have exactly the expected signature. A trace with evaluated analyzers (the
    transform graph, with the noisy tables as constants) may differ where TensorFlow folds shapes of those
    constants; it must have the expected outputs, spends and analyzers, and exactly the signature of a
    check trace made here under the same constants, which `check_row_local` runs on synthetic rows.
    ``kinds`` ({feature: int / float / bytes}) describes the raw features. Picklable (tf.Transform ships it
    to a Beam step for its last trace) when the user's function is.
    """

    def __init__(
        self,
        preprocessing_fn: Callable,
        custom_config: dict,
        kinds: dict[str, str],
        expected: TraceSignature | None = None,
    ):
        self.preprocessing_fn = preprocessing_fn
        self.custom_config = custom_config
        self.kinds = dict(kinds)
        self.expected = expected
        self.recorded = None

    def __call__(self, inputs):
        import tensorflow as tf
        from tensorflow_transform import graph_context

        graph = tf.compat.v1.get_default_graph()
        before = (len(graph.get_operations()), len(requested_spends(graph)), len(_sinks(graph)))
        outputs = call_preprocessing_fn(self.preprocessing_fn, inputs, self.custom_config)
        if not isinstance(outputs, dict):
            return outputs  # tf.Transform refuses it, naming the type
        replacements = graph_context.TFGraphContext.get_evaluated_replacements()
        signature = trace_signature(graph, before, outputs, replacements)
        check_analyzers_are_dp(signature)
        if self.expected is None:
            self.recorded = signature
            return dict(outputs, **_analyzer_inputs(graph, graph.get_operations()[before[0] :], signature.spends))
        if not replacements:
            _require_same(self.expected, signature, "the trace DPTransform checked")
        else:
            _require_same(self.expected[:3], signature[:3], "the trace DPTransform checked")
            checked = _in_own_thread(self._checked_trace, replacements)
            _require_same(checked, signature, "a check trace under the same analyzer outputs")
        return outputs

    def _checked_trace(self, replacements) -> TraceSignature:
        """A check trace under `replacements`, run on synthetic rows (`check_row_local`); its signature."""
        checked, concrete = reference_trace(self.preprocessing_fn, self.custom_config, self.kinds, replacements)
        check_row_local(concrete, self.kinds)
        return checked


def _in_own_thread(fn, *args):
    """fn(*args) in a new thread, which starts with TensorFlow's and tf.Transform's per-thread state empty (eager,
    no graph being built, no graph context): a graph traced inside another trace would copy that trace's
    collections (its spends and budget among them). tf.Transform's object tracker, a module global, is set
    aside meanwhile (this thread waits)."""

    from tensorflow_transform import annotators

    tracker, annotators._OBJECT_TRACKER = annotators._OBJECT_TRACKER, None
    try:
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(fn, *args).result()
    finally:
        annotators._OBJECT_TRACKER = tracker


def _require_same(expected, got, what: str) -> None:
    if tuple(got) != tuple(expected):
        raise TraceMismatch(
            f"the preprocessing_fn traced differently from {what} ({_difference(expected, got)}): tf.Transform "
            "calls it several times, and each call must build the same computation. Remove what changes between "
            "calls (a counter, a global flag, state kept across calls, a value read from outside the inputs)"
        )


def _analyzer_inputs(graph, new_ops, spends) -> dict:
    """{key: tensor} of the per-row tensors the DP analyzers read: built outside every analyzer scope, computed
    from the inputs, and consumed inside one."""
    scopes = tuple(f"{analyzer}/" for analyzer, _, _ in spends)
    inside = lambda op: op.name.startswith(scopes)  # noqa: E731
    data = {id(t.op) for t in graph.inputs}
    for op in graph.get_operations():  # creation order; the inputs' copies come before the function's own ops
        if any(id(t.op) in data for t in op.inputs):
            data.add(id(op))
    found = {}
    for op in new_ops:
        if not inside(op):
            continue
        scope = next(s for s in scopes if op.name.startswith(s))
        for tensor in op.inputs:
            if id(tensor.op) in data and not inside(tensor.op):
                found.setdefault(f"{ANALYZER_INPUT_PREFIX}{scope.rstrip('/')} <- {tensor.name}", tensor)
    return found


# ---------------------------------------------------------------- the checked trace, and its rows


def type_specs(kinds: dict[str, str]) -> dict:
    """The TypeSpecs tf.Transform gives the raw features (each a VarLenFeature: a [batch, n] SparseTensor)."""
    import tensorflow as tf

    dtypes = {"int": tf.int64, "float": tf.float32, "bytes": tf.string}
    return {name: tf.SparseTensorSpec([None, None], dtypes[kind]) for name, kind in kinds.items()}


def reference_trace(preprocessing_fn: Callable, custom_config: dict, kinds: dict[str, str], replacements=None):
    """Trace the function in TF2 mode as tf.Transform does (no data), with the analyzers unevaluated or, given
    ``replacements``, evaluated to those constants: (signature, concrete function returning the outputs and the
    analyzers' per-row inputs)."""
    import tensorflow as tf
    from tensorflow_transform import annotators, graph_context, impl_helper

    traced = TracedFn(preprocessing_fn, custom_config, kinds)
    context = graph_context.TFGraphContext(
        module_to_export=tf.Module(), temp_dir=None, evaluated_replacements=replacements
    )
    with annotators.object_tracker_scope(annotators.ObjectTracker()):
        concrete = impl_helper.get_traced_transform_fn(traced, type_specs(kinds), context).get_concrete_function()
    return traced.recorded, concrete


def synthetic_rows(kinds: dict[str, str], n: int = SYNTHETIC_ROWS) -> list[dict]:
    """n public rows {feature: value or None (missing)} of the given kinds (int / float / bytes)."""
    pools = {
        "int": [0, 1, 2, 3, 7, 12, 23, 5],
        "float": [0.0, 0.5, 3.25, 17.0, 99.5, 42.0, 1.0, 7.75],
        "bytes": [b"a", b"b", b"Cash", b"", b"zz", b"Credit Card", b"7"],
    }
    rng = np.random.default_rng(_SEED)
    rows = []
    for i in range(n):
        rows.append(
            {
                name: (None if i and rng.random() < 0.2 else pools[kind][rng.integers(len(pools[kind]))])
                for name, kind in sorted(kinds.items())
            }
        )
    return rows


def _batch(rows: list[dict], kinds: dict[str, str]) -> dict:
    """VarLenFeature inputs ([batch, 1] SparseTensors; a missing value is absent) of `rows`."""
    import tensorflow as tf

    batch = {}
    for name, spec in type_specs(kinds).items():
        present = [(i, r[name]) for i, r in enumerate(rows) if r[name] is not None]
        indices = np.array([[i, 0] for i, _ in present], dtype=np.int64).reshape(-1, 2)
        values = tf.constant([v for _, v in present], dtype=spec.dtype) if present else tf.zeros([0], spec.dtype)
        batch[name] = tf.SparseTensor(indices, values, [len(rows), 1])
    return batch


def _rows_of(value, n: int, key: str) -> list:
    """Per-row parts of one output of a batch of n rows."""
    import tensorflow as tf

    if isinstance(value, tf.SparseTensor):
        indices, values = value.indices.numpy(), value.values.numpy()
        return [(indices[indices[:, 0] == i, 1:], values[indices[:, 0] == i]) for i in range(n)]
    if isinstance(value, tf.RaggedTensor):
        return [np.asarray(value[i].numpy()) for i in range(n)]
    array = np.asarray(value.numpy())
    if array.ndim == 0 or array.shape[0] != n:
        raise RowMixing(
            f"{_name(key)} has shape {list(array.shape)} for a batch of {n} rows: each output of a "
            "preprocessing_fn has one entry per row; a value for the whole batch mixes its rows"
        )
    return list(array)


def _same(a, b) -> bool:
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if a.dtype.kind == "f" or b.dtype.kind == "f":
        return bool(np.allclose(a, b, rtol=_RTOL, atol=_ATOL, equal_nan=True))
    return bool(np.array_equal(a, b))


def _name(key: str) -> str:
    if key.startswith(ANALYZER_INPUT_PREFIX):
        scope, tensor = key[len(ANALYZER_INPUT_PREFIX) :].split(" <- ", 1)
        return f"the input {tensor!r} of the DP analyzer {scope!r}"
    return f"the output {key!r}"


def check_row_local(concrete, kinds: dict[str, str], n: int = SYNTHETIC_ROWS) -> None:
    """Raise RowMixing unless every row's outputs (and DP analyzer inputs) of `concrete` are the same alone in
    a batch, in the whole synthetic batch, in that batch reversed, and on a second run of the batch."""
    rows = synthetic_rows(kinds, n)

    def run(batch_rows):
        import tensorflow as tf

        try:
            return concrete(_batch(batch_rows, kinds))
        except tf.errors.OpError as exc:
            raise DPTransformError(
                f"the preprocessing_fn failed on synthetic rows ({batch_rows!r}), on which DPTransform runs it to "
                f"check that it transforms each row on its own: {exc.message}. It must accept any value of each "
                "feature's kind, and missing values (fill them with fill_in_missing)"
            ) from None

    full = run(rows)
    views = {
        "the same batch run again": (run(rows), list(range(n))),
        "the batch in reverse order": (run(rows[::-1]), list(range(n))[::-1]),
    }
    for key in sorted(full):
        base = _rows_of(full[key], n, key)
        for what, (other, order) in views.items():
            got = _rows_of(other[key], n, key)
            for position, i in enumerate(order):
                if not _same(base[i], got[position]):
                    raise RowMixing(_mixing_message(key, what))
        for i in range(n):
            (alone,) = _rows_of(run([rows[i]])[key], 1, key)
            if not _same(base[i], alone):
                raise RowMixing(_mixing_message(key, f"the row alone in its batch (synthetic row {i})"))


def _mixing_message(key: str, what: str) -> str:
    if what.startswith("the same batch"):
        return (
            f"{_name(key)} differs between two runs of the same synthetic batch: the transform must be a function "
            "of each row (no random ops in a preprocessing_fn)"
        )
    return (
        f"{_name(key)} changes with the other rows of its batch (compared with {what}): the preprocessing_fn "
        "mixes the records of a batch outside a DP analyzer (e.g. x - tf.reduce_mean(x), a division by the batch "
        "size, tf.sort / tf.roll / tf.matmul over the batch). Compute statistics of the data with a DP analyzer "
        "(dp_mean, dp_scale_to_z_score, dp_group_by_mean, ...) and keep every other operation per row"
    )
