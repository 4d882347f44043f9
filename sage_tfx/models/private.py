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
from sage_tfx.models.dpsgd_engine import _INVALID, ENGINES, ghost_applies, make_engine
from sage_tfx.models.losses import LOSSES, per_example_loss
from sage_tfx.models.row_checks import check_rows_independent, spec_of, synthetic_batch
from sage_tfx.models.seeding import active as _seed_active
from sage_tfx.models.seeding import check_fit, fit_seeds
from sage_tfx.privacy import adaptive_clip, checks, dpsgd, noise_schedules
from sage_tfx.privacy.dpsgd import DpSgdConfigError

if TYPE_CHECKING:
    from sage_tfx.privacy.adaptive_clip import AdaptiveClip
    from sage_tfx.privacy.noise_schedules import NoiseSchedule

__all__ = ["make_private", "PrivateModel", "PER_EXAMPLE", "LOSSES", "poisson_batches", "check_engine"]

PER_EXAMPLE = ("auto",) + ENGINES
OPTIMIZERS = ("sgd", "adam")
_NAME = "make_private"
Model: TypeAlias = tf.keras.Model | Callable[[int | None], tf.keras.Model]


# ------------------------------------------------------------------------------------------- checks, helpers

def check_momentum(momentum: Any) -> float:
    """``momentum`` as a float in [0, 1), else a DpSgdConfigError naming it (a bool is refused)."""
    return checks.number(momentum, "momentum", low=0.0, high=1.0, high_open=True, error=DpSgdConfigError,
                         message=_INVALID)


def check_engine(engine: str, keyword: str, choices: tuple[str, ...], clip_norm: Any,
                 schedule: noise_schedules.NoiseSchedule) -> None:
    """Refuse, before anything is read, an engine not in ``choices`` and tf_privacy with what it cannot do
    (a noise schedule, an adaptive clip). ``keyword``: the caller's argument name, for the message."""
    if engine not in choices:
        raise DpSgdConfigError(f"{keyword}={engine!r} is invalid: choose one of {choices}")
    if engine != "tf_privacy":
        return
    if not schedule.is_constant:
        raise DpSgdConfigError(f"noise_schedule={schedule.describe()} is invalid with {keyword}='tf_privacy' (a "
                               "fixed sigma): use 'ghost' or 'vmap'")
    if isinstance(clip_norm, adaptive_clip.AdaptiveClip):
        raise DpSgdConfigError(f"clip_norm='adaptive' is invalid with {keyword}='tf_privacy' (a fixed clip "
                               "norm): use 'ghost' or 'vmap'")


def refuse_unseeded(engine: str, name: str, keyword: str) -> None:
    """Refuse the tf_privacy engine inside ``training_seed`` (DPTrainer): its noise comes from TensorFlow's
    global generator, which a module's ``tf.random.set_seed`` fixes, not from the grant's seed."""
    if engine == "tf_privacy" and _seed_active():
        raise DpSgdConfigError(
            f"{name}: {keyword}='tf_privacy' is refused under DPTrainer (training_seed): tensorflow-privacy draws "
            "its noise from TensorFlow's global generator, which tf.random.set_seed in a module fixes, not from "
            "the grant's seed; use 'ghost' (default) or 'vmap'")


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


def _check_positive(name, value, integer=False):
    if integer:
        return checks.integer(value, name, low=1, error=DpSgdConfigError, message=_INVALID)
    return checks.positive(value, name, error=DpSgdConfigError, message=_INVALID)


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
                 weight_decay: float = 0.0, noise_schedule: NoiseSchedule | None = None, name: str = _NAME) -> None:
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
        return tf.keras.optimizers.SGD(learning_rate=self.learning_rate, momentum=self.momentum, **decay)

    def fit(self, x: Any, y: Any, verbose: bool | int | str = False, *,
            callback: Callable[[int], None] | None = None, epochs: int | float | None = None,
            batch_size: int | None = None, shuffle: bool = True, **keras_kwargs: Any) -> PrivateModel:
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

    def _engine_name(self):
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

        return (tf.function(lambda xb, yb: apply(self.engine.noisy_sum(xb, yb)), reduce_retracing=True),
                tf.function(lambda: apply(self.engine.noise_sum())))

    def _train(self, x, y, n, run, sampling_seed, fall_back, verbose, callback):
        """The DP-SGD loop: ``run.steps`` Poisson-sampled batches (an empty one takes a noise-only step), each
        step at the schedule's sigma_t. With ``per_example="auto"``, if vectorisation fails when the step is
        first traced, ``fall_back()`` swaps in the per-example loop and the step runs again."""
        optimizer = self._make_optimizer()
        dp_step, noise_step = self._steps(optimizer)
        traced = False
        rng = np.random.default_rng(sampling_seed)
        for i, rows in enumerate(poisson_batches(rng, n, run.sampling_rate, run.steps)):
            if run.noise_multipliers[i] != self.engine.noise_multiplier:
                self.engine.set_noise_multiplier(float(run.noise_multipliers[i]))  # the schedule's sigma_t
            if len(rows) == 0:
                noise_step()
            else:
                xb, yb = _take(x, rows), y[rows]
                try:
                    dp_step(xb, yb)
                except Exception:
                    if traced or not self._can_fall_back():
                        raise
                    fall_back()
                    dp_step, noise_step = self._steps(optimizer)
                    dp_step(xb, yb)
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


def check_adaptive_clip(clip_norm: float | AdaptiveClip, schedule: NoiseSchedule | None, epsilon: float, delta: float,
                        num_examples: int, batch_size: int, epochs: float, accountant: str) -> None:
    """Refuse an adaptive clip whose count noise sigma_b is too small for the run's calibrated noise multiplier
    (2 sigma_b must exceed it), from public numbers, before anything is read or drawn."""
    if isinstance(clip_norm, adaptive_clip.AdaptiveClip):
        run = noise_schedules.scheduled_spend(schedule, epsilon, delta, num_examples, batch_size, epochs, accountant)
        adaptive_clip.check_run(clip_norm, run.noise_multipliers, batch_size)


def make_private(model: Model, *, privacy_budget: tuple[float, float], num_examples: int,
                 clip_norm: float | str | adaptive_clip.AdaptiveClip = 1.0, batch_size: int = 256,
                 epochs: int | float = 1,
                 optimizer: str = "sgd", learning_rate: float | None = None, momentum: float = 0.0,
                 weight_decay: float = 0.0, loss: Any = None, accountant: str = "rdp", per_example: str = "auto",
                 seed: int | None = None,
                 noise_schedule: noise_schedules.NoiseSchedule | None = None, name: str = _NAME) -> PrivateModel:
    """Wrap a tf.keras Sequential or Functional ``model`` for DP-SGD training; return a ``PrivateModel``.

    ``model`` may also be a function ``init_seed -> model`` that ``fit`` calls once, when the fit starts, with
    its weight-initialisation seed (inside ``training_seed``: derived from the grant's seed; else ``seed``):
    how the DP estimators build their network. ``name``: the fit's name in errors, in the training block's
    records and seed derivation (sage_tfx.models.seeding) and in ``privacy_spent["implementation"]``
    (``<name>/<engine>``); the DP estimators pass their class name.

    ``privacy_budget=(epsilon, delta)``: what ``fit`` spends (add/remove one record). ``num_examples``: the
    DP or public row count (``fn_args.num_examples``), never the exact count. Sensitivity of each step's
    gradient sum: ``clip_norm``; noise std ``sigma * clip_norm`` with sigma calibrated on dp_accounting
    (module docstring: mechanism, proof sketch). ``optimizer``: "sgd" (``momentum``) or "adam";
    ``learning_rate`` defaults to 0.1 (sgd) / 0.001 (adam). ``loss``: None = the model's compiled loss, one
    of ``LOSSES`` or a per-example Keras loss. ``per_example``: one of ``PER_EXAMPLE``. ``seed``: tests only;
    refused inside ``training_seed`` (DPTrainer).

    ``weight_decay``: decoupled weight decay (Keras optimizers' ``weight_decay``: each step every weight w
    becomes w - learning_rate * weight_decay * w besides the noisy gradient step). It reads no data, so it is
    post-processing and changes no privacy statement. Why a DP user wants it: the Gaussian noise of every
    step lands on every weight, and on weights the data barely moves it adds up as a random walk (after T
    steps its std is learning_rate * sigma * clip_norm / batch_size * sqrt(T)); the decay pulls those weights
    back, bounding the walk. On TFX's taxi wide-and-deep model at epsilon 0.675, 0.01 turned a run that fell
    below the majority class in most noise draws into one above 0.84 in most (docs/your_pipeline.md).

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
    """
    if not isinstance(model, (tf.keras.Model, types.FunctionType, types.MethodType, functools.partial)):
        raise DpSgdConfigError(f"model={type(model).__name__} is invalid: pass a tf.keras Sequential or Functional "
                               "model (tf.keras is Keras 2 here: import sage_tfx before TensorFlow)")
    try:
        epsilon, delta = privacy_budget
    except (TypeError, ValueError):
        raise DpSgdConfigError(f"privacy_budget={privacy_budget!r} is invalid: pass (epsilon, delta)") from None
    epsilon, delta = dpsgd.check_budget(epsilon, delta)
    if num_examples is None:
        raise DpSgdConfigError("num_examples=None is invalid: pass the ledger's DP (or a public) row count "
                               "(fn_args.num_examples), never the exact private count")
    num_examples = _check_positive("num_examples", num_examples, integer=True)
    batch_size = _check_positive("batch_size", batch_size, integer=True)
    epochs = _check_positive("epochs", epochs)
    clip_norm = adaptive_clip.as_clip_norm(clip_norm)
    dpsgd.num_steps(num_examples, batch_size, epochs)  # batch_size <= num_examples, named in the error
    if optimizer not in OPTIMIZERS:
        raise DpSgdConfigError(f"optimizer={optimizer!r} is invalid: choose one of {OPTIMIZERS}")
    if learning_rate is None:
        learning_rate = 0.1 if optimizer == "sgd" else 0.001
    learning_rate = _check_positive("learning_rate", learning_rate)
    momentum = check_momentum(momentum)
    if optimizer == "adam" and momentum:
        raise DpSgdConfigError(f"momentum={momentum!r} is invalid with optimizer='adam': leave it at 0")
    checks.number(weight_decay, "weight_decay", low=0.0, high=1 / learning_rate, high_open=True,
                  error=DpSgdConfigError, message="{what}={value!r} is invalid: pass a number in [0, 1/learning_rate) "
                  f"(learning_rate {learning_rate}), e.g. 0.01")
    dpsgd.check_accountant(accountant)
    schedule = noise_schedules.as_schedule(noise_schedule)  # a bad schedule is refused here
    check_engine(per_example, "per_example", PER_EXAMPLE, clip_norm, schedule)
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
                        noise_schedule=schedule)