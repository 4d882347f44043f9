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

Per-example gradients (``per_example=``):
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
    ``ghost`` or ``ghost+vmap`` / ``ghost+loop`` (with a fallback part).
  * ``"vmap"``: any model; per-example gradients by ``tf.vectorized_map`` over a GradientTape (sparse
    Embedding gradients made dense), then clip and sum. ``"auto"`` picks it for a model without a graph
    (subclassed) or without Dense / Embedding layers, and (for it and for a ghost engine's fallback part)
    falls back to ``"loop"`` if vectorisation fails when the step is first traced.
  * ``"loop"``: a per-example ``tf.map_fn`` loop: slowest, works for any differentiable model.

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
from collections.abc import Callable
from typing import Any

import sage_tfx  # noqa: F401  (before TensorFlow: tf.keras is Keras 2)  # isort: skip
import numpy as np
import tensorflow as tf  # noqa: TID253

from sage_tfx.models.dpsgd_engine import LayerGhostEngine, _Engine, _zero_rows, ghost_layers, per_example_gradients
from sage_tfx.models.dpsgd_models import _INVALID, check_momentum, clip_spent, poisson_batches, start_clip
from sage_tfx.models.row_checks import check_rows_independent, spec_of, synthetic_batch
from sage_tfx.models.seeding import active as _seed_active
from sage_tfx.models.seeding import fit_seeds
from sage_tfx.privacy import adaptive_clip, checks, dpsgd, noise_schedules
from sage_tfx.privacy.dpsgd import DpSgdConfigError

__all__ = ["make_private", "PrivateModel", "PER_EXAMPLE", "LOSSES"]

PER_EXAMPLE = ("auto", "ghost", "vmap", "loop")
LOSSES = ("mse", "binary_crossentropy", "sparse_categorical_crossentropy")
OPTIMIZERS = ("sgd", "adam")
_NAME = "make_private"
_LOSS_ALIASES = {"mse": "mse", "mean_squared_error": "mse", "binary_crossentropy": "binary_crossentropy",
                 "sparse_categorical_crossentropy": "sparse_categorical_crossentropy"}


# ------------------------------------------------------------------------------------------- losses

def _as_rows(t, batch):
    return tf.reshape(t, tf.stack([batch, -1]))


def _mse(y, out):
    batch = tf.shape(out)[0]
    out = _as_rows(out, batch)
    return tf.reduce_mean(tf.square(out - _as_rows(tf.cast(y, out.dtype), batch)), axis=1)


def _keras_loss(cls, match_shape, **config):
    loss = cls(reduction=tf.keras.losses.Reduction.NONE, **config)

    def per_example(y, out):
        if match_shape:
            y = tf.reshape(tf.cast(y, out.dtype), tf.shape(out))
        return tf.reshape(loss(y, out), [-1])

    return per_example


def _wrap_callable(loss):
    def per_example(y, out):
        # labels [B] for an output [B, 1]: Keras would squeeze the output and average over the BATCH
        y, out = tf.convert_to_tensor(y), tf.convert_to_tensor(out)
        if y.shape.rank == 1 and out.shape.rank == 2 and out.shape[1] == 1:
            y = y[:, None]
        values = loss(y, out)
        return tf.reshape(values, [-1])

    return per_example


def per_example_loss(loss: Any, model: tf.keras.Model) -> Callable:
    """A function (y, model output) -> per-example losses [batch], from ``loss`` or the model's compiled loss.

    A Keras ``Loss`` with another reduction is rebuilt with reduction NONE (``from_config``); a callable must
    return one loss per record (``fit`` checks the shape on two records).
    """
    if loss is None:
        loss = getattr(model, "loss", None) if getattr(model, "compiled_loss", None) is not None else None
        if loss is None:
            raise DpSgdConfigError(
                f"loss=None is invalid for an uncompiled model: pass loss= one of {LOSSES}, or a per-example "
                "Keras loss (reduction NONE), or model.compile(loss=...) first")
    if isinstance(loss, str):
        name = _LOSS_ALIASES.get(loss.lower())
        if name is None:
            raise DpSgdConfigError(f"loss={loss!r} is invalid: choose one of {LOSSES}, or pass a per-example Keras "
                                   "loss (reduction NONE)")
        if name == "mse":
            return _mse
        if name == "binary_crossentropy":  # Keras' string: outputs are probabilities (from_logits=False)
            return _keras_loss(tf.keras.losses.BinaryCrossentropy, True)
        return _keras_loss(tf.keras.losses.SparseCategoricalCrossentropy, False)
    if isinstance(loss, tf.keras.losses.Loss):
        if loss.reduction != tf.keras.losses.Reduction.NONE:
            config = dict(loss.get_config())
            config["reduction"] = tf.keras.losses.Reduction.NONE
            try:
                loss = type(loss).from_config(config)
            except Exception:
                raise DpSgdConfigError(
                    f"loss={loss!r} reduces over the batch and cannot be rebuilt with reduction NONE: pass a "
                    "per-example loss (reduction=tf.keras.losses.Reduction.NONE)") from None
        return _wrap_callable(loss)
    if callable(loss):
        return _wrap_callable(loss)
    raise DpSgdConfigError(f"loss={loss!r} is invalid: choose one of {LOSSES}, or pass a per-example Keras loss")


# ------------------------------------------------------------------------------------------- engines

class _PerExampleEngine(_Engine):
    """Per-example gradients of any Keras model (nested inputs allowed), clipped and summed.

    ``vectorized=True``: ``tf.vectorized_map``; False: a ``tf.map_fn`` loop over the examples.
    """

    def __init__(self, model, per_example_loss, clip_norm, noise_multiplier, seed=None, vectorized=True):
        super().__init__(model, per_example_loss, clip_norm, noise_multiplier, seed)
        self.vectorized = vectorized
        self.name = "vmap" if vectorized else "loop"

    def per_example_gradients(self, x, y):
        """One tensor [batch, *variable shape] per trainable variable (dense)."""
        return per_example_gradients(self.model, self.per_example_loss, self.variables, x, y, self.vectorized)

    def clipped_sum(self, x, y):
        per_example = self.per_example_gradients(x, y)
        sq = tf.add_n([tf.reduce_sum(tf.reshape(tf.square(g), [tf.shape(g)[0], -1]), axis=1)
                       for g in per_example])
        factors, norms, finite = self._factors(sq)
        return [tf.tensordot(factors, _zero_rows(g, finite), axes=1) for g in per_example], norms


def _ghost_ok(model):
    """True if the layer ghost engine applies: a graph network with at least one Dense or Embedding layer."""
    found = ghost_layers(model)
    return found is not None and bool(found[0])


_GHOST_REFUSED = ("per_example='ghost' is invalid for this model: the ghost engine needs a Keras graph network "
                  "(Functional, or Sequential with a known input shape) with at least one Dense or Embedding "
                  "layer; use per_example='auto' or 'vmap'")


def _engine(per_example, model, loss_fn, clip_norm, sigma, seed, vectorized=True):
    if per_example == "ghost":
        if not _ghost_ok(model):
            raise DpSgdConfigError(_GHOST_REFUSED)
        return LayerGhostEngine(model, loss_fn, clip_norm, sigma, seed, vectorized=vectorized)
    return _PerExampleEngine(model, loss_fn, clip_norm, sigma, seed, vectorized=per_example != "loop")


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


def keras_fit_arguments(private: "PrivateModel", epochs: Any, batch_size: Any, shuffle: Any,
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

    def __init__(self, model, *, epsilon, delta, num_examples, clip_norm, batch_size, epochs, optimizer,
                 learning_rate, momentum, accountant, loss, per_example, seed, weight_decay=0.0,
                 noise_schedule=None):
        self.model = model
        self.epsilon, self.delta = epsilon, delta
        self.num_examples = num_examples
        self.clip_norm = clip_norm
        self.batch_size = batch_size
        self.epochs = epochs
        self.optimizer_name = optimizer
        self.learning_rate = learning_rate
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.accountant = accountant
        self.loss = loss
        self.per_example = per_example
        self.seed = seed
        self.noise_schedule = noise_schedules.as_schedule(noise_schedule)
        self.engine = None
        self.privacy_spent: dict[str, Any] | None = None

    # ---------------------------------------------------------------- training
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
            batch_size: int | None = None, shuffle: bool = True, **keras_kwargs: Any) -> "PrivateModel":
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
        x = _to_numpy(x)
        y = _to_numpy(y)
        n = _rows(x)
        if len(y) != n:
            raise ValueError("y and x have different numbers of rows: pass one label per record")
        loss_fn = self._build(spec_of(x), spec_of(y))
        seeds = fit_seeds(self.seed, _NAME, (self.epsilon, self.delta),  # seed= refused, the share's filter
                           {"batch_size": self.batch_size, "epochs": self.epochs,
                            **adaptive_clip.public_numbers(self.clip_norm)})
        run = noise_schedules.scheduled_spend(self.noise_schedule, self.epsilon, self.delta, self.num_examples,
                                              self.batch_size, self.epochs, self.accountant)
        sigmas, steps, q = run.noise_multipliers, run.steps, run.sampling_rate
        sigma = float(sigmas[0])
        per_example = self.per_example
        if per_example == "auto":
            per_example = "ghost" if _ghost_ok(self.model) else "vmap"
        self.engine = _engine(per_example, self.model, loss_fn, adaptive_clip.initial_clip(self.clip_norm), sigma,
                              seeds.noise)
        start_clip(self.engine, self.clip_norm, self.batch_size)
        optimizer = self._make_optimizer()
        expected = float(self.batch_size)

        def apply(sums):
            optimizer.apply_gradients(zip([g / expected for g in sums], self.engine.variables))

        def steps_for_engine():
            return (tf.function(lambda xb, yb: apply(self.engine.noisy_sum(xb, yb)), reduce_retracing=True),
                    tf.function(lambda: apply(self.engine.noise_sum())))

        dp_step, noise_step = steps_for_engine()
        traced = False
        rng = np.random.default_rng(seeds.sampling)
        for i, rows in enumerate(poisson_batches(rng, n, q, steps)):
            if sigmas[i] != self.engine.noise_multiplier:
                self.engine.set_noise_multiplier(float(sigmas[i]))  # the schedule's sigma_t (a variable)
            if len(rows) == 0:
                noise_step()
            else:
                xb, yb = _take(x, rows), y[rows]
                try:
                    dp_step(xb, yb)
                except Exception:
                    if traced or self.per_example != "auto" or not getattr(self.engine, "vectorized", False) \
                            or (per_example == "ghost" and not self.engine.fallback):
                        raise
                    # vectorisation failed when first traced: the per-example loop computes the same sums.
                    # The new engine continues the old one's noise generator (no noise draw is ever reused)
                    # and clip state.
                    per_example = "ghost" if per_example == "ghost" else "loop"
                    old = self.engine
                    self.engine = _engine(per_example, self.model, loss_fn, old.clip_norm, float(sigmas[i]),
                                          seeds.noise, vectorized=False)
                    self.engine.continue_from(old)
                    dp_step, noise_step = steps_for_engine()
                    dp_step(xb, yb)
                traced = True
            if callback is not None:
                callback(i)
            if verbose and (i + 1) % max(1, steps // 10) == 0:
                print(f"DP-SGD step {i + 1}/{steps}", flush=True)
        implementation = per_example
        if per_example == "ghost" and self.engine.fallback:
            implementation = "ghost+" + ("vmap" if self.engine.vectorized else "loop")
        self.privacy_spent = {
            "epsilon": run.epsilon, "delta": self.delta, "dp_event": run.dp_event, "noise_multiplier": sigma,
            "steps": steps, "sampling_rate": q, "num_examples": int(self.num_examples),
            "accountant": self.accountant, "mechanism": "dp-sgd (Poisson-sampled Gaussian)",
            "implementation": f"make_private/{implementation}",
            **clip_spent(self.engine, self.clip_norm, sigma, self.batch_size),
        }
        if not self.noise_schedule.is_constant:  # the constant default's report is unchanged
            self.privacy_spent["noise_schedule"] = run.report()
        seeds.report_spent(self.privacy_spent)
        return self

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


def _check_adaptive_clip(clip_norm, schedule, epsilon, delta, num_examples, batch_size, epochs, accountant):
    """Refuse an adaptive clip whose count noise sigma_b is too small for the run's calibrated noise multiplier
    (2 sigma_b must exceed it), from public numbers, before anything is read or drawn."""
    if isinstance(clip_norm, adaptive_clip.AdaptiveClip):
        run = noise_schedules.scheduled_spend(schedule, epsilon, delta, num_examples, batch_size, epochs, accountant)
        adaptive_clip.check_run(clip_norm, run.noise_multipliers, batch_size)


def make_private(model: tf.keras.Model, *, privacy_budget: tuple[float, float], num_examples: int,
                 clip_norm: float | str | adaptive_clip.AdaptiveClip = 1.0, batch_size: int = 256,
                 epochs: int | float = 1,
                 optimizer: str = "sgd", learning_rate: float | None = None, momentum: float = 0.0,
                 weight_decay: float = 0.0, loss: Any = None, accountant: str = "rdp", per_example: str = "auto",
                 seed: int | None = None,
                 noise_schedule: noise_schedules.NoiseSchedule | None = None) -> PrivateModel:
    """Wrap a tf.keras Sequential or Functional ``model`` for DP-SGD training; return a ``PrivateModel``.

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
    if not isinstance(model, tf.keras.Model):
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
    if per_example not in PER_EXAMPLE:
        raise DpSgdConfigError(f"per_example={per_example!r} is invalid: choose one of {PER_EXAMPLE}")
    if per_example == "ghost" and model.built and not _ghost_ok(model):
        raise DpSgdConfigError(_GHOST_REFUSED)
    if seed is not None and _seed_active():
        fit_seeds(seed, _NAME)  # raises: an explicit seed inside training_seed (DPTrainer)
    if loss is not None:
        per_example_loss(loss, model)  # names a bad loss now, not after the data is read
    schedule = noise_schedules.as_schedule(noise_schedule)  # a bad schedule is refused here
    schedule.check_for_run(dpsgd.num_steps(num_examples, batch_size, epochs))
    _check_adaptive_clip(clip_norm, schedule, epsilon, delta, num_examples, batch_size, epochs, accountant)
    return PrivateModel(model, epsilon=epsilon, delta=delta, num_examples=num_examples, clip_norm=clip_norm,
                        batch_size=batch_size, epochs=epochs, optimizer=optimizer,
                        learning_rate=learning_rate, momentum=float(momentum), weight_decay=float(weight_decay),
                        accountant=accountant, loss=loss, per_example=per_example, seed=seed,
                        noise_schedule=schedule)
