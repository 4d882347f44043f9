"""``make_private``: DP-SGD training of the user's own tf.keras model (Opacus-like, one call).

::

    from sage_tfx.models import make_private

    model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="relu"), tf.keras.layers.Dense(1)])
    private = make_private(model, privacy_budget=fn_args.privacy_budget, num_examples=fn_args.num_examples,
                           loss="mse", clip_norm=1.0, batch_size=256, epochs=2)
    private.fit(x, y)
    trainer_utils.export_model(fn_args, private)
    return trainer_utils.report_spent(fn_args, private)

Mechanism (DP-SGD, Abadi et al. 2016; docs/models.md "Your own Keras model: make_private"):

  * ``steps = ceil(epochs * num_examples / batch_size)``; at every step each training record is included
    independently with probability ``q = batch_size / num_examples`` (Poisson sampling; an empty batch still
    takes a noise-only step).
  * Each included record's gradient of its own loss, over ALL trainable variables together, is clipped to
    L2 norm ``clip_norm`` = C; a record whose gradient norm is not finite contributes 0 (a fixed function of
    the record, norm 0 <= C).
  * The clipped sum gets N(0, (sigma*C)^2) on every coordinate, is divided by the EXPECTED batch size
    ``batch_size`` (public), and is applied by SGD or Adam (post-processing).

Sensitivity: under add/remove-one-record adjacency the clipped sum changes by one clipped gradient, so its
L2 sensitivity is C. Each step is the Poisson-subsampled Gaussian mechanism with noise multiplier sigma, the
run is its self-composition over ``steps``; sigma is the smallest (to 1e-4 relative) whose composition is
(epsilon, delta)-DP under dp_accounting's RDP (default) or PLD accountant (sage_tfx.privacy.dpsgd, the same
calibration as the DP models). Proof sketch: the Gaussian mechanism of sensitivity C and std sigma*C,
amplified by Poisson sampling, composed ``steps`` times, is exactly the DpEvent
``SelfComposed(PoissonSampled(q, Gaussian(sigma)), steps)`` that the accountant bounds; the optimizer sees
only the noisy sums, so the weights (and the model's predictions) are post-processing. Whatever the true
row count, each present record is sampled with probability q, so the bound holds for any data size.

``num_examples`` MUST be public or a DP count (``fn_args.num_examples``, the ledger's DP row count), never
the exact private count: sigma depends on it and is published with the model.

Per-example gradients (``per_example=``: "auto" or one of the engines of sage_tfx.models.dpsgd_engine's
one registry, ``ENGINES``):
  * ``"ghost"``: ghost clipping per layer (sage_tfx.models.dpsgd_engine.LayerGhostEngine; Goodfellow 2015,
    Li et al. 2022, Bu et al. 2023) on any Keras graph network (Functional, or Sequential with a known input
    shape): one forward pass through the model's graph keeps each Dense and Embedding layer's input and
    output, one backward pass gives the output gradients g, and each record's squared gradient norm follows
    without materialising its gradient: Dense ||a_i||^2 ||g_i||^2 (+ ||g_i||^2 for the bias; a sequence
    input sums over pairs of positions), Embedding sum_{t,s} [id_t = id_s] g_t . g_s (repeated ids merged),
    a Dense fed by CategoryEncoding (through Concatenate) takes ||a_i||^2 from the ids. Layers without
    trainable weights (Normalization, CategoryEncoding, Concatenate, Reshape, ...) run as they are. Every
    other trainable variable (another layer type, a layer called twice, a nested model) gets exact
    per-example gradients (vmap, or the loop below): the clip factor uses the sum of both parts' squared
    norms, i.e. the norm of the record's whole gradient. ``"auto"`` (default) picks it whenever the model
    has a graph with at least one Dense or Embedding layer; ``privacy_spent["implementation"]`` says
    ``<name>/ghost`` or ``<name>/ghost+vmap`` / ``<name>/ghost+loop`` (with a fallback part).
  * ``"vmap"``: any model; per-example gradients by ``tf.vectorized_map`` over a GradientTape (sparse
    Embedding gradients made dense), then clip and sum. ``"auto"`` picks it for a model without a graph
    (subclassed) or without Dense / Embedding layers, and (for it and for a ghost engine's fallback part)
    falls back to ``"loop"`` if vectorisation fails when the step is first traced.
  * ``"loop"``: a per-example ``tf.map_fn`` loop: slowest, works for any differentiable model.
  * ``"tf_privacy"``: tensorflow-privacy's optimizer (optional; a fixed clip norm and sigma, noise from
    TensorFlow's global generator): refused with a noise schedule, an adaptive clip, and under DPTrainer.

The DP estimators (sage_tfx.models.dpsgd_models) train through ``make_private`` too: they pass a function
``init_seed -> network`` as ``model`` and their class name as ``name``.

Layers or losses that couple examples (any BatchNormalization in training mode, a batch mean, a loss
normalised over the batch) or keep batch statistics break per-example clipping: ``fit`` refuses them before
its first step by the structural checks of ``sage_tfx.models.row_checks`` (synthetic batches built from the
shapes and dtypes of x and y, no value of the data). Dropout is fine (each example's own mask). Regularisation losses
(``model.losses``) are not added: they are data-independent and could be, but are left out for now.

Seeds: ``seed=None`` draws fresh OS entropy; inside ``sage_tfx.models.training_seed`` (DPTrainer) the
sampling and noise come from the grant's private seed and ``seed=`` is refused (sage_tfx.models.seeding).
The model's initial weights are the user's (make_private does not re-initialise them): to reproduce a fit
bit for bit, build the model with seeded initialisers (initial weights need no secrecy).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import tensorflow as tf  # noqa: TID253

import sage_tfx  # noqa: F401  (before TensorFlow: tf.keras is Keras 2)
from sage_tfx.models.dpsgd_engine import ENGINES, ghost_applies, make_engine
from sage_tfx.models.losses import LOSSES, per_example_loss
from sage_tfx.models.momentum import DEBIASED_MOMENTUM, DebiasedMomentum
from sage_tfx.models.private_checks import (  # noqa: F401 (OPTIMIZERS, check_momentum: re-exported)
    OPTIMIZERS,
    check_adaptive_clip,
    check_engine,
    check_momentum,
    check_optimizer,
    check_per_unit,
    check_privacy_budget,
    check_run_numbers,
    refuse_unseeded,
)
from sage_tfx.models.row_checks import check_rows_independent, spec_of, synthetic_batch
from sage_tfx.models.seeding import check_fit, fit_seeds
from sage_tfx.models.unit_clip import unit_batches, unit_engine_name, unit_index, unit_noisy_sum
from sage_tfx.privacy import adaptive_clip, dpsgd, noise_schedules
from sage_tfx.privacy.dpsgd import DpSgdConfigError

if TYPE_CHECKING:
    from sage_tfx.privacy.adaptive_clip import AdaptiveClip
    from sage_tfx.privacy.noise_schedules import NoiseSchedule

__all__ = ["make_private", "PrivateModel", "PER_EXAMPLE", "LOSSES", "poisson_batches", "check_engine"]

PER_EXAMPLE = ("auto",) + ENGINES
_NAME = "make_private"
Model: TypeAlias = tf.keras.Model | Callable[[int | None], tf.keras.Model]


# ------------------------------------------------------------------------------------------- checks, helpers

def poisson_batches(rng: np.random.Generator, n: int, q: float, steps: int) -> Iterator[np.ndarray]:
    """Yield the row indices of ``steps`` Poisson-sampled batches (each row kept w.p. q)."""
    for _ in range(steps):
        size = int(rng.binomial(n, q))
        yield np.sort(rng.choice(n, size=size, replace=False)) if size else np.empty(0, np.int64)


def public_params(batch_size: int, epochs: float, clip_norm: float | AdaptiveClip) -> dict[str, float]:
    """The fit's numbers that must be public under DPTrainer (``training_seed(public=...)``)."""
    return {"batch_size": batch_size, "epochs": epochs, **adaptive_clip.public_numbers(clip_norm)}


def clip_spent(engine: Any, clip_norm: float | AdaptiveClip, noise_multiplier: float,
               batch_size: int) -> dict[str, Any]:
    """``privacy_spent`` entries of an adaptive clip: its parameters, sigma_b, the sum's z_Delta and the last
    estimate (a DP release); {} for a fixed clip (its report is unchanged)."""
    if not isinstance(clip_norm, adaptive_clip.AdaptiveClip):
        return {}
    report = clip_norm.report(noise_multiplier, batch_size)
    report["final_clip_norm"] = engine.current_clip_norm
    return {"adaptive_clip": report}


_GHOST_REFUSED = ("per_example='ghost' is invalid for this model: the ghost engine needs a Keras graph network "
                  "(Functional, or Sequential with a known input shape) with at least one Dense or Embedding "
                  "layer; use per_example='auto' or 'vmap'")


# ------------------------------------------------------------------------------------------- wrapper

# ------------------------------------------------------------------------------------------- wrapper

def _rows(x):
    lengths = {int(np.shape(v)[0]) for v in tf.nest.flatten(x)}
    if len(lengths) != 1:
        raise ValueError("x: every input needs the same number of rows (they differ): pass one row per record in "
                         "each")
    return lengths.pop()


def _to_numpy(x):
    """numpy arrays; floating ones as float32 (the Keras default dtype)."""
    def one(v):
        v = np.asarray(v)
        return v.astype(np.float32) if np.issubdtype(v.dtype, np.floating) else v

    return tf.nest.map_structure(one, x)


def _take(x, rows):
    return tf.nest.map_structure(lambda v: v[rows], x)


# Keras ``Model.fit`` keyword arguments that ``PrivateModel.fit`` does not take, and why (``keras_fit_arguments``).
_STEPS_ARE_SIGNED = ("the step count is fixed by make_private's num_examples, batch_size and epochs (the noise is "
                     "calibrated to it): leave it out")
_KERAS_FIT_REFUSED = {
    "validation_data": "a validation loss on private rows outside the DP-SGD spend is not private: evaluate the "
                       "fitted model with DPModelValidator (the pipeline's SLA), or call predict on public rows",
    "validation_split": "it would hold out private rows and report their loss unprotected: evaluate with "
                        "DPModelValidator, or call predict on public rows",
    "validation_steps": "there is no validation inside a private fit (see validation_data)",
    "validation_batch_size": "there is no validation inside a private fit (see validation_data)",
    "validation_freq": "there is no validation inside a private fit (see validation_data)",
    "callbacks": "Keras callbacks see each batch's exact loss on private rows (and EarlyStopping or "
                 "ModelCheckpoint would choose by it): pass callback=fn(step) for progress or timing",
    "class_weight": "per-record weights are not supported by the clipped sum: resample the rows",
    "sample_weight": "per-record weights are not supported by the clipped sum: resample the rows",
    "initial_epoch": _STEPS_ARE_SIGNED,
    "steps_per_epoch": _STEPS_ARE_SIGNED,
}
# performance settings of Keras' input pipeline: fit takes in-memory arrays, so they change nothing
_KERAS_FIT_IGNORED = ("max_queue_size", "workers", "use_multiprocessing")


def keras_fit_arguments(private: PrivateModel, epochs: Any, batch_size: Any, shuffle: Any,
                        others: dict[str, Any]) -> None:
    """Accept the Keras ``fit`` keywords a Keras user types when they change nothing; refuse the others.

    ``epochs`` / ``batch_size`` equal to make_private's are accepted (None: not given); a different value is
    refused naming make_private, where the noise is calibrated. ``shuffle=True`` (Keras' default) is accepted:
    each batch is a Poisson sample anyway; ``shuffle=False`` is refused. The performance keywords
    ``_KERAS_FIT_IGNORED`` are ignored; ``_KERAS_FIT_REFUSED`` are refused with their reason. Raises
    ``DpSgdConfigError`` before any data is read.
    """
    for name, given, wrapped in (("epochs", epochs, private.epochs), ("batch_size", batch_size, private.batch_size)):
        if given is not None and not (isinstance(given, (int, float)) and not isinstance(given, bool)
                                      and given == wrapped):
            raise DpSgdConfigError(
                f"fit({name}={given!r}) differs from make_private({name}={wrapped:g}): the noise is calibrated to "
                f"make_private's {name}; pass {name}={given!r} to make_private instead (or leave it out of fit)")
    if shuffle is not True:
        raise DpSgdConfigError(f"fit(shuffle={shuffle!r}) is invalid: DP-SGD draws every batch as a Poisson sample "
                               "of all rows (the privacy proof needs it): leave shuffle out")
    for name in others:
        if name in _KERAS_FIT_REFUSED:
            raise DpSgdConfigError(f"fit({name}=...) is refused: {_KERAS_FIT_REFUSED[name]}")
        if name not in _KERAS_FIT_IGNORED:
            raise DpSgdConfigError(f"fit({name}=...) is not an argument of PrivateModel.fit: it takes x, y, "
                                   "verbose, callback, and Keras' epochs / batch_size equal to make_private's")


class PrivateModel:
    """A tf.keras model trained with DP-SGD by ``fit``; see ``make_private`` and the module docstring.

    After ``fit``: ``privacy_spent`` (the format of the DP models, accepted by
    ``trainer_utils.report_spent``), ``predict``, ``export``. ``model`` is the trained Keras model.
    """

    def __init__(self, model: Model, *, epsilon: float, delta: float, num_examples: int,
                 clip_norm: float | AdaptiveClip, batch_size: int, epochs: float, optimizer: str, learning_rate: float,
                 momentum: float, accountant: str, loss: str, per_example: str, seed: int | None,
                 weight_decay: float = 0.0, noise_schedule: NoiseSchedule | None = None, name: str = _NAME,
                 per_unit: bool = False) -> None:
        self.model = model  # a Keras model, or a function init_seed -> model until fit builds it
        self.name, self.seed = name, seed
        self.epsilon, self.delta, self.accountant = epsilon, delta, accountant
        self.num_examples, self.batch_size, self.epochs = num_examples, batch_size, epochs
        self.clip_norm, self.loss, self.per_example = clip_norm, loss, per_example
        self.optimizer_name, self.learning_rate = optimizer, learning_rate
        self.momentum, self.weight_decay = momentum, weight_decay
        self.noise_schedule = noise_schedules.as_schedule(noise_schedule)
        self.engine = None
        self.privacy_spent: dict[str, Any] | None = None
        self.per_unit = per_unit  # per-unit clipping (sage_tfx.models.unit_clip): num_examples counts units
        self._units: tuple[np.ndarray, int] | None = None  # (each row's unit 0..u-1, u) of a per-unit fit

    # ---------------------------------------------------------------- training
    def _start(self, x_spec, y_spec):
        """(the fit's seeds, the per-example loss). A Keras model is built and checked before the fit starts
        in its training block (``fit_seeds``); a builder is first called with the fit's init seed."""
        if isinstance(self.model, tf.keras.Model):
            loss_fn = self._build(x_spec, y_spec)
            return self._fit_seeds(), loss_fn
        seeds = self._fit_seeds()
        self.model = self.model(seeds.init)
        if not isinstance(self.model, tf.keras.Model):
            raise DpSgdConfigError(f"model: the builder returned {type(self.model).__name__}: return a tf.keras "
                                   "model")
        return seeds, self._build(x_spec, y_spec)

    def _fit_seeds(self):
        return fit_seeds(self.seed, self.name, (self.epsilon, self.delta),  # seed= refused, the share's filter
                         public_params(self.batch_size, self.epochs, self.clip_norm))

    def _build(self, x_spec, y_spec):
        """Build the model on a synthetic record and run the structural checks (``row_checks``): refused
        before any value of the data is used, from the shapes and dtypes of x and y alone."""
        if not self.model.built or not self.model.trainable_variables:
            self.model(synthetic_batch(x_spec, 1), training=False)
        if not self.model.trainable_variables:
            raise DpSgdConfigError("model has no trainable variables: nothing to train")
        loss_fn = per_example_loss(self.loss, self.model)
        check_rows_independent(self.model, loss_fn, x_spec, y_spec)
        return loss_fn

    def _make_optimizer(self):
        decay = {"weight_decay": self.weight_decay} if self.weight_decay else {}
        if self.optimizer_name == "adam":
            return tf.keras.optimizers.Adam(learning_rate=self.learning_rate, **decay)
        if self.optimizer_name == DEBIASED_MOMENTUM:  # Hong et al.'s Alg. 2: post-processing of the noisy sums
            return DebiasedMomentum(learning_rate=self.learning_rate, beta=self.momentum, **decay)
        return tf.keras.optimizers.SGD(learning_rate=self.learning_rate, momentum=self.momentum, **decay)

    def fit(self, x: Any, y: Any, verbose: bool | int | str = False, *,
            callback: Callable[[int], None] | None = None, epochs: int | float | None = None,
            batch_size: int | None = None, shuffle: bool = True, units: Any = None,
            **keras_kwargs: Any) -> PrivateModel:
        """Train on (x, y) with DP-SGD; return self. Spends ``privacy_budget`` once (a second fit is refused).

        Keras habits (``keras_fit_arguments``, checked before any data is read): ``epochs=`` / ``batch_size=``
        are accepted when equal to make_private's and refused otherwise (set them in make_private);
        ``validation_data``, ``validation_split``, ``callbacks``, ``class_weight``, ``sample_weight``,
        ``initial_epoch`` and ``steps_per_epoch`` are refused with the reason. ``verbose``: any true value
        prints progress every tenth of the steps.

        ``x``: an array, or a list / dict of arrays for a model with several inputs (rows aligned); ``y`` the
        labels. ``callback(step)``, if given, is called after each step (0-based; timing, progress: it sees
        nothing private beyond what the weights already show). Sensitivity C = ``clip_norm`` per step (add/remove one record); the run is
        (epsilon, delta)-DP for ``privacy_budget`` (module docstring: mechanism and proof sketch).

        ``units``: with ``make_private(per_unit=True)`` (and only then), each row's privacy unit id (the stream's
        unit column, one per row of x): units are Poisson-sampled and each unit's summed gradient is clipped at
        C, so the run is (epsilon, delta)-DP for adding or removing a whole unit (sage_tfx.models.unit_clip).
        """
        keras_fit_arguments(self, epochs, batch_size, shuffle, keras_kwargs)
        if self.privacy_spent is not None:
            raise ValueError("this PrivateModel is already fitted (its budget is spent): call make_private again "
                             "for another fit")
        refuse_unseeded(self.per_example, self.name, "per_example")
        x = _to_numpy(x)
        y = _to_numpy(y)
        n = _rows(x)
        if len(y) != n:
            raise ValueError("y and x have different numbers of rows: pass one label per record")
        self._units = self._unit_rows(units, n)
        seeds, loss_fn = self._start(spec_of(x), spec_of(y))
        run = noise_schedules.scheduled_spend(self.noise_schedule, self.epsilon, self.delta, self.num_examples,
                                              self.batch_size, self.epochs, self.accountant)
        self.engine = self._new_engine(self._engine_name(), loss_fn, adaptive_clip.initial_clip(self.clip_norm),
                                       float(run.noise_multipliers[0]), seeds.noise)
        if isinstance(self.clip_norm, adaptive_clip.AdaptiveClip):
            self.engine.adapt_clip(self.clip_norm, self.batch_size)
        self._train(x, y, n, run, seeds.sampling, lambda: self._fall_back(loss_fn, seeds.noise), verbose, callback)
        self.privacy_spent = self._spent(run)
        seeds.report_spent(self.privacy_spent)
        return self

    def _unit_rows(self, units, n):
        """Hook of per-unit clipping: (each row's unit, the unit count) of a per-unit fit, None for a row-level
        one; a fit given ``units`` it was not made for (or not given them) is refused before any value is used."""
        if self.per_unit != (units is not None):
            raise DpSgdConfigError(
                "fit(units=...) needs make_private(per_unit=True) (num_examples then counts units), and "
                "make_private(per_unit=True) needs fit(units=...), one unit id per row: pass both or neither")
        return unit_index(units, n) if self.per_unit else None

    def _engine_name(self):
        if self.per_unit:
            return unit_engine_name(self.per_example)
        if self.per_example != "auto":
            return self.per_example
        return "ghost" if ghost_applies(self.model) else "vmap"

    def _new_engine(self, name, loss_fn, clip_norm, sigma, seed, vectorized=True):
        if name == "ghost" and not ghost_applies(self.model):
            raise DpSgdConfigError(_GHOST_REFUSED)
        return make_engine(name, self.model, loss_fn, clip_norm, sigma, seed, vectorized=vectorized)

    def _steps(self, optimizer):
        """(dp_step(x, y), noise_step()): the engine's noisy sum / expected batch size, applied by ``optimizer``."""
        expected = float(self.batch_size)

        def apply(sums):
            optimizer.apply_gradients(zip([g / expected for g in sums], self.engine.variables))

        if self.per_unit:  # hook of per-unit clipping: the rows of each sampled unit summed, then clipped
            return (tf.function(lambda xb, yb, seg, k: apply(unit_noisy_sum(self.engine, xb, yb, seg, k)),
                                reduce_retracing=True),
                    tf.function(lambda: apply(self.engine.noise_sum())))
        return (tf.function(lambda xb, yb: apply(self.engine.noisy_sum(xb, yb)), reduce_retracing=True),
                tf.function(lambda: apply(self.engine.noise_sum())))

    def _batches(self, rng, n, run):
        """Each step's Poisson batch: (rows,), or for a per-unit fit (rows, their segment, units sampled), the
        units sampled at ``run.sampling_rate`` (``unit_clip.unit_batches``)."""
        if self._units is None:
            return ((rows,) for rows in poisson_batches(rng, n, run.sampling_rate, run.steps))
        unit_of_row, num_units = self._units
        sampled = poisson_batches(rng, num_units, run.sampling_rate, run.steps)
        return ((rows, tf.constant(seg), tf.constant(k, tf.int32))
                for rows, seg, k in unit_batches(sampled, unit_of_row, num_units))

    def _train(self, x, y, n, run, sampling_seed, fall_back, verbose, callback):
        """The DP-SGD loop: ``run.steps`` Poisson-sampled batches (an empty one takes a noise-only step), each
        step at the schedule's sigma_t. With ``per_example="auto"``, if vectorisation fails when the step is
        first traced, ``fall_back()`` swaps in the per-example loop and the step runs again."""
        optimizer = self._make_optimizer()
        dp_step, noise_step = self._steps(optimizer)
        traced = False
        rng = np.random.default_rng(sampling_seed)
        for i, (rows, *units) in enumerate(self._batches(rng, n, run)):
            if run.noise_multipliers[i] != self.engine.noise_multiplier:
                self.engine.set_noise_multiplier(float(run.noise_multipliers[i]))  # the schedule's sigma_t
            if len(rows) == 0:
                noise_step()
            else:
                xb, yb = _take(x, rows), y[rows]
                try:
                    dp_step(xb, yb, *units)
                except Exception:
                    if traced or not self._can_fall_back():
                        raise
                    fall_back()
                    dp_step, noise_step = self._steps(optimizer)
                    dp_step(xb, yb, *units)
                traced = True
            if callback is not None:
                callback(i)
            if verbose and (i + 1) % max(1, run.steps // 10) == 0:
                print(f"DP-SGD step {i + 1}/{run.steps}", flush=True)

    def _can_fall_back(self):
        engine = self.engine
        return self.per_example == "auto" and getattr(engine, "vectorized", False) \
            and bool(getattr(engine, "fallback", True))

    def _fall_back(self, loss_fn, seed):
        """Replace a vectorised engine by the loop (a ghost engine keeps its ghost part): the same sums. The
        new engine continues the old one's noise generator (no noise draw is ever reused) and clip state."""
        old = self.engine
        name = "ghost" if old.name == "ghost" else "loop"
        self.engine = self._new_engine(name, loss_fn, old.clip_norm, old.noise_multiplier, seed, vectorized=False)
        self.engine.continue_from(old)

    def _implementation(self):
        engine = self.engine
        if engine.name == "ghost" and engine.fallback:
            return "ghost+" + ("vmap" if engine.vectorized else "loop")
        return engine.name

    def _spent(self, run):
        """The fit's ``privacy_spent``: the run's DpEvent and (epsilon, delta), its public parameters, the
        engine, and the adaptive clip's and noise schedule's reports when used."""
        sigma = float(run.noise_multipliers[0])
        spent = {
            "epsilon": run.epsilon, "delta": self.delta, "dp_event": run.dp_event, "noise_multiplier": sigma,
            "steps": run.steps, "sampling_rate": run.sampling_rate, "num_examples": int(self.num_examples),
            "accountant": self.accountant, "mechanism": "dp-sgd (Poisson-sampled Gaussian)",
            "implementation": f"{self.name}/{self._implementation()}",
            **clip_spent(self.engine, self.clip_norm, sigma, self.batch_size),
        }
        if not self.noise_schedule.is_constant:  # the constant default's report is unchanged
            spent["noise_schedule"] = run.report()
        if self.per_unit:  # the record of DP-SGD is the unit: num_examples and sampling_rate count units
            spent["privacy_unit"] = "unit"
        return spent

    # ---------------------------------------------------------------- use
    def _require_fit(self):
        if self.privacy_spent is None:
            raise ValueError("the model is not fitted; call fit first")

    def predict(self, x: Any) -> np.ndarray:
        """The model's outputs on ``x`` (post-processing of the DP weights: no further privacy cost)."""
        self._require_fit()
        return self.model(_to_numpy(x), training=False).numpy()

    def _input_specs(self):
        names = list(getattr(self.model, "input_names", None) or ["x"])
        inputs = tf.nest.flatten(self.model.inputs) if getattr(self.model, "inputs", None) else None
        if inputs is None:
            raise ValueError("export needs a model with known inputs: build it with an Input shape or fit it")
        return {name: tf.TensorSpec([None] + list(t.shape[1:]), t.dtype, name=name)
                for name, t in zip(names, inputs)}

    def _call(self, features, names):
        args = [features[k] for k in names]
        return self.model(args[0] if len(args) == 1 else args, training=False)

    def export(self, path: str, transform_output: Any = None, label_key: str | None = None) -> str:
        """Write a SavedModel with a ``serving_default`` signature; return ``path``.

        Without ``transform_output`` the signature takes the model's inputs by their Keras input names (one
        input of a Sequential model is usually named after its first layer); with it (a tf.Transform output,
        as ``trainer_utils.export_model`` passes) it takes serialized tf.Examples, applies the transform graph
        and feeds the transformed features of those names. Output: ``predictions`` (the model's output; a
        width-1 output is flattened to [None]). Post-processing only: no privacy cost.
        """
        self._require_fit()
        specs = self._input_specs()
        names = list(specs)
        module = tf.Module()
        module.model = self.model

        def outputs(out):
            if out.shape.rank == 2 and out.shape[1] == 1:
                out = tf.reshape(out, [-1])
            return {"predictions": out}

        if transform_output is None:
            @tf.function(input_signature=[specs])
            def serve(features):
                return outputs(self._call(features, names))
        else:
            from sage_tfx.models.export import attach_transform  # noqa: PLC0415

            raw_spec = attach_transform(module, transform_output, label_key)

            @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
            def serve(examples):
                transformed = module.tft_layer(tf.io.parse_example(examples, raw_spec))
                feats = {k: tf.reshape(tf.cast(transformed[k], specs[k].dtype),
                                       [-1] + list(specs[k].shape[1:])) for k in names}
                return outputs(self._call(feats, names))

        tf.saved_model.save(module, str(path), signatures={"serving_default": serve.get_concrete_function()})
        return str(path)


def make_private(model: Model, *, privacy_budget: tuple[float, float], num_examples: int,
                 clip_norm: float | str | adaptive_clip.AdaptiveClip = 1.0, batch_size: int = 256,
                 epochs: int | float = 1,
                 optimizer: str = "sgd", learning_rate: float | None = None, momentum: float = 0.0,
                 weight_decay: float = 0.0, loss: Any = None, accountant: str = "rdp", per_example: str = "auto",
                 seed: int | None = None,
                 noise_schedule: noise_schedules.NoiseSchedule | None = None, name: str = _NAME,
                 per_unit: bool = False) -> PrivateModel:
    """Wrap a tf.keras Sequential or Functional ``model`` for DP-SGD training; return a ``PrivateModel``.

    ``model`` may also be a function ``init_seed -> model`` that ``fit`` calls once, when the fit starts, with
    its weight-initialisation seed (inside ``training_seed``: derived from the grant's seed; else ``seed``):
    how the DP estimators build their network. ``name``: the fit's name in errors, in the training block's
    records and seed derivation (sage_tfx.models.seeding) and in ``privacy_spent["implementation"]``
    (``<name>/<engine>``); the DP estimators pass their class name.

    ``privacy_budget=(epsilon, delta)``: what ``fit`` spends (add/remove one record). ``num_examples``: the
    DP or public row count (``fn_args.num_examples``), never the exact count. Sensitivity of each step's
    gradient sum: ``clip_norm``; noise std ``sigma * clip_norm`` with sigma calibrated on dp_accounting
    (module docstring: mechanism, proof sketch). ``optimizer``: "sgd" (``momentum``), "adam" or
    "debiased_momentum" (Hong et al.'s Alg. 2 with beta = ``momentum``: sage_tfx.models.momentum; post-
    processing, privacy unchanged); ``learning_rate`` defaults to 0.1 (sgd, debiased) / 0.001 (adam). ``loss``: None = the model's compiled loss, one
    of ``LOSSES`` or a per-example Keras loss. ``per_example``: one of ``PER_EXAMPLE``. ``seed``: tests only;
    refused inside ``training_seed`` (DPTrainer).

    ``weight_decay``: decoupled weight decay (w -= learning_rate * weight_decay * w each step): it reads no
    data, so it is post-processing; why a DP user wants it is in docs/models.md ("weight_decay").

    ``clip_norm``: a number C > 0 (fixed), or ``"adaptive"`` / ``sage_tfx.privacy.adaptive_clip.AdaptiveClip(
    target_quantile=0.5, learning_rate=0.2, initial=1.0, count_stddev=None)``: C estimated privately during
    training as the target quantile of the per-example gradient norms (Andrew et al. 2021): each step also
    releases the count of unclipped records with N(0, sigma_b^2) (sigma_b = batch_size / 20 by default) and
    moves C geometrically; the sum's noise multiplier becomes z_Delta = (z^-2 - (2 sigma_b)^-2)^-1/2 so the
    step is still the Gaussian mechanism of the calibrated z: the same DpEvent and epsilon as a fixed clip
    (proof sketch in that module). For an imbalanced label pass ``adaptive_clip.IMBALANCED`` (quantile 0.9).
    ``privacy_spent["adaptive_clip"]`` reports its parameters, sigma_b, z_Delta and the last C.

    ``noise_schedule``: None (constant sigma, the default: unchanged behaviour) or a
    ``sage_tfx.privacy.noise_schedules`` schedule (step, exponential, polynomial, bound_optimal; or a
    dict / kind name): step t adds N(0, (sigma_t C)^2) with sigma_t = s * f_t, the scale s calibrated
    so that the composition of the per-step Poisson-sampled Gaussian events (sensitivity C each) is
    (epsilon, delta)-DP on the accountant (proof sketch in that module: the schedule is fixed before
    training, so the run is an adaptive composition of T sampled Gaussian mechanisms). Refused here,
    before any data is read, if invalid for the run's step count. ``privacy_spent["dp_event"]`` is the
    composed event, ``["noise_schedule"]`` the schedule and its per-stage sigmas.

    ``per_unit``: clip per privacy unit (McMahan et al. 2018; sage_tfx.models.unit_clip): ``fit(x, y,
    units=ids)`` Poisson-samples units (q = ``batch_size`` / ``num_examples``), sums each sampled unit's
    per-example gradients over its rows and clips the sum at ``clip_norm``: the run is (epsilon, delta)-DP for
    adding or removing one whole unit, whatever its number of rows. ``num_examples`` is then the DP (or public)
    count of UNITS and ``batch_size`` the expected units per batch. Engines: ``unit_clip.UNIT_ENGINES`` ("auto"
    picks "vmap"); "ghost" and "tf_privacy" are refused here. ``privacy_spent["privacy_unit"]`` is "unit".
    """
    if not isinstance(model, (tf.keras.Model, types.FunctionType, types.MethodType, functools.partial)):
        raise DpSgdConfigError(f"model={type(model).__name__} is invalid: pass a tf.keras Sequential or Functional "
                               "model (tf.keras is Keras 2 here: import sage_tfx before TensorFlow)")
    epsilon, delta = check_privacy_budget(privacy_budget)
    num_examples, batch_size, epochs = check_run_numbers(num_examples, batch_size, epochs)
    clip_norm = adaptive_clip.as_clip_norm(clip_norm)
    dpsgd.num_steps(num_examples, batch_size, epochs)  # batch_size <= num_examples, named in the error
    learning_rate, momentum = check_optimizer(optimizer, learning_rate, momentum, weight_decay)
    dpsgd.check_accountant(accountant)
    schedule = noise_schedules.as_schedule(noise_schedule)  # a bad schedule is refused here
    check_engine(per_example, "per_example", PER_EXAMPLE, clip_norm, schedule)
    check_per_unit(per_unit, per_example)
    refuse_unseeded(per_example, name, "per_example")
    if per_example == "ghost" and isinstance(model, tf.keras.Model) and model.built and not ghost_applies(model):
        raise DpSgdConfigError(_GHOST_REFUSED)
    # what the fit would refuse when it starts (seed= inside DPTrainer, the share, the public numbers): now
    check_fit(seed, name, (epsilon, delta), public_params(batch_size, epochs, clip_norm))
    if loss is not None:
        per_example_loss(loss, model)  # names a bad loss now, not after the data is read
    schedule.check_for_run(dpsgd.num_steps(num_examples, batch_size, epochs))
    check_adaptive_clip(clip_norm, schedule, epsilon, delta, num_examples, batch_size, epochs, accountant)
    return PrivateModel(model, epsilon=epsilon, delta=delta, num_examples=num_examples, clip_norm=clip_norm,
                        batch_size=batch_size, epochs=epochs, optimizer=optimizer,
                        learning_rate=learning_rate, momentum=float(momentum), weight_decay=float(weight_decay),
                        accountant=accountant, loss=loss, per_example=per_example, seed=seed, name=name,
                        noise_schedule=schedule, per_unit=per_unit)
