"""``make_private``: DP-SGD training of the user's own tf.keras model (Opacus-like, one call).

Contract: ``fit`` runs ``ceil(epochs * num_examples / batch_size)`` Poisson-sampled steps (rate
``q = batch_size / num_examples``), clips each record's whole gradient to L2 norm C = ``clip_norm`` and adds
N(0, (sigma C)^2) to the sum: the run is ``SelfComposed(PoissonSampled(q, Gaussian(sigma)), steps)``,
(epsilon, delta)-DP under add/remove one record (one unit with ``per_unit``). ``num_examples`` must be public or
a DP count; layers or losses that couple records are refused before the first step (``row_checks``).

Example, mechanism, proof sketch, engines and seeds: docs/models.md ("Your own Keras model: make_private").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import tensorflow as tf  # noqa: TID253

import sage_tfx  # noqa: F401  (before TensorFlow: tf.keras is Keras 2)
from sage_tfx.models.dpsgd_engine import ghost_applies, make_engine
from sage_tfx.models.export import export_keras_model
from sage_tfx.models.fit_inputs import _rows, _take, _to_numpy, keras_fit_arguments
from sage_tfx.models.losses import LOSSES, per_example_loss
from sage_tfx.models.momentum import DEBIASED_MOMENTUM, DebiasedMomentum
from sage_tfx.models.private_checks import (  # noqa: F401 (OPTIMIZERS, check_momentum, ...: re-exported)
    GHOST_REFUSED,
    OPTIMIZERS,
    PER_EXAMPLE,
    check_adaptive_clip,
    check_engine,
    check_make_private,
    check_momentum,
    public_params,
    refuse_unseeded,
)
from sage_tfx.models.row_checks import check_rows_independent, spec_of, synthetic_batch
from sage_tfx.models.seeding import fit_seeds
from sage_tfx.models.step_function import row_signature, step_function
from sage_tfx.models.unit_clip import unit_batches, unit_engine_name, unit_index, unit_noisy_sum
from sage_tfx.privacy import adaptive_clip, noise_schedules
from sage_tfx.privacy.dpsgd import DpSgdConfigError

if TYPE_CHECKING:
    from sage_tfx.privacy.adaptive_clip import AdaptiveClip
    from sage_tfx.privacy.noise_schedules import NoiseSchedule

__all__ = ["make_private", "PrivateModel", "PER_EXAMPLE", "LOSSES", "poisson_batches", "check_engine"]

_NAME = "make_private"
Model: TypeAlias = tf.keras.Model | Callable[[int | None], tf.keras.Model]


# ------------------------------------------------------------------------------------------- checks, helpers


def poisson_batches(rng: np.random.Generator, n: int, q: float, steps: int) -> Iterator[np.ndarray]:
    """Yield the row indices of ``steps`` Poisson-sampled batches (each row kept w.p. q)."""
    for _ in range(steps):
        size = int(rng.binomial(n, q))
        yield np.sort(rng.choice(n, size=size, replace=False)) if size else np.empty(0, np.int64)


def clip_spent(
    engine: Any, clip_norm: float | AdaptiveClip, noise_multiplier: float, batch_size: int
) -> dict[str, Any]:
    """``privacy_spent`` entries of an adaptive clip: its parameters, sigma_b, the sum's z_Delta and the last
    estimate (a DP release); {} for a fixed clip (its report is unchanged)."""
    if not isinstance(clip_norm, adaptive_clip.AdaptiveClip):
        return {}
    report = clip_norm.report(noise_multiplier, batch_size)
    report["final_clip_norm"] = engine.current_clip_norm
    return {"adaptive_clip": report}


def _arrays(x, y):
    """(x, y, their row count) as numpy arrays; refused when x and y have different row counts."""
    x = _to_numpy(x)
    y = _to_numpy(y)
    n = _rows(x)
    if len(y) != n:
        raise ValueError("y and x have different numbers of rows: pass one label per record")
    return x, y, n


class PrivateModel:
    """A tf.keras model trained with DP-SGD by ``fit``: build it with ``make_private``, which checks its arguments.

    After ``fit``: ``privacy_spent`` (the format of the DP models, accepted by
    ``trainer_utils.report_spent``), ``predict``, ``export``. ``model`` is the trained Keras model.

    Args:
      model: a Keras model, or a function ``init_seed -> model`` that ``fit`` calls once.
      epsilon: the run's epsilon (``make_private``'s ``privacy_budget``).
      delta: the run's delta.
      num_examples: the DP or public count of records (of units with ``per_unit``).
      clip_norm: C, or an ``AdaptiveClip``.
      batch_size: the expected batch size.
      epochs: passes over ``num_examples``.
      optimizer: one of ``OPTIMIZERS``.
      learning_rate: the optimizer's learning rate.
      momentum: sgd's momentum.
      accountant: ``"rdp"`` or ``"pld"``.
      loss: None, one of ``LOSSES``, or a per-example Keras loss.
      per_example: one of ``PER_EXAMPLE``.
      seed: tests only (None: OS entropy, or the grant's seed under DPTrainer).
      weight_decay: decoupled weight decay.
      noise_schedule: None (constant sigma) or a noise schedule.
      name: the fit's name in errors, seeds and ``privacy_spent``.
      per_unit: clip per privacy unit (``fit(..., units=ids)``).
    """

    def __init__(
        self,
        model: Model,
        *,
        epsilon: float,
        delta: float,
        num_examples: int,
        clip_norm: float | AdaptiveClip,
        batch_size: int,
        epochs: float,
        optimizer: str,
        learning_rate: float,
        momentum: float,
        accountant: str,
        loss: str,
        per_example: str,
        seed: int | None,
        weight_decay: float = 0.0,
        noise_schedule: NoiseSchedule | None = None,
        name: str = _NAME,
        per_unit: bool = False,
    ) -> None:
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
            raise DpSgdConfigError(f"model: the builder returned {type(self.model).__name__}: return a tf.keras model")
        return seeds, self._build(x_spec, y_spec)

    def _fit_seeds(self):
        return fit_seeds(
            self.seed,
            self.name,
            (self.epsilon, self.delta),  # seed= refused, the share's filter
            public_params(self.batch_size, self.epochs, self.clip_norm),
        )

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

    def fit(
        self,
        x: Any,
        y: Any,
        verbose: bool | int | str = False,
        *,
        callback: Callable[[int], None] | None = None,
        epochs: int | float | None = None,
        batch_size: int | None = None,
        shuffle: bool = True,
        units: Any = None,
        **keras_kwargs: Any,
    ) -> PrivateModel:
        """Train on (x, y) with DP-SGD; spends ``privacy_budget`` once (a second fit is refused).

        Sensitivity C = ``clip_norm`` per step (add/remove one record, or one unit with ``per_unit``); the run is
        (epsilon, delta)-DP for ``privacy_budget`` (docs/models.md: mechanism and proof sketch). Keras' ``fit``
        keywords are checked before any data is read (``keras_fit_arguments``).

        Args:
          x: an array, or a list / dict of arrays for a model with several inputs (rows aligned).
          y: the labels, one per row.
          verbose: any true value prints progress every tenth of the steps.
          callback: ``callback(step)`` after each step (0-based; progress, timing: it sees nothing private
            beyond what the weights show).
          epochs: Keras habit: accepted when equal to make_private's, refused otherwise.
          batch_size: Keras habit: accepted when equal to make_private's, refused otherwise.
          shuffle: Keras habit: True (every batch is a Poisson sample anyway); False is refused.
          units: with ``make_private(per_unit=True)`` (and only then), each row's privacy unit id: units are
            Poisson-sampled and each unit's summed gradient is clipped at C (sage_tfx.models.unit_clip).
          keras_kwargs: other Keras ``fit`` keywords: ``validation_data``, ``validation_split``, ``callbacks``,
            ``class_weight``, ``sample_weight``, ``initial_epoch``, ``steps_per_epoch`` are refused with the
            reason; Keras' input-pipeline knobs (``workers``, ...) are ignored.

        Returns:
          self, with ``privacy_spent`` set.

        Raises:
          DpSgdConfigError: a refused keyword, layer or loss, before any data is read.
          ValueError: already fitted, or x and y of different row counts.
        """
        keras_fit_arguments(self, epochs, batch_size, shuffle, keras_kwargs)
        if self.privacy_spent is not None:
            raise ValueError(
                "this PrivateModel is already fitted (its budget is spent): call make_private again for another fit"
            )
        refuse_unseeded(self.per_example, self.name, "per_example")
        x, y, n = _arrays(x, y)
        self._units = self._unit_rows(units, n)
        seeds, loss_fn = self._start(spec_of(x), spec_of(y))
        run = noise_schedules.scheduled_spend(
            self.noise_schedule,
            self.epsilon,
            self.delta,
            self.num_examples,
            self.batch_size,
            self.epochs,
            self.accountant,
        )
        self.engine = self._new_engine(
            self._engine_name(),
            loss_fn,
            adaptive_clip.initial_clip(self.clip_norm),
            float(run.noise_multipliers[0]),
            seeds.noise,
        )
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
                "make_private(per_unit=True) needs fit(units=...), one unit id per row: pass both or neither"
            )
        return unit_index(units, n) if self.per_unit else None

    def _engine_name(self):
        if self.per_unit:
            return unit_engine_name(self.per_example)
        if self.per_example != "auto":
            return self.per_example
        return "ghost" if ghost_applies(self.model) else "vmap"

    def _new_engine(self, name, loss_fn, clip_norm, sigma, seed, vectorized=True):
        if name == "ghost" and not ghost_applies(self.model):
            raise DpSgdConfigError(GHOST_REFUSED)
        return make_engine(name, self.model, loss_fn, clip_norm, sigma, seed, vectorized=vectorized)

    def _steps(self, optimizer, x, y):
        """(dp_step(x, y), noise_step()): the engine's noisy sum / expected batch size, applied by ``optimizer``.
        Traced once for every batch size (``step_function``: the batch axis is None)."""
        expected = float(self.batch_size)

        def apply(sums):
            optimizer.apply_gradients(zip([g / expected for g in sums], self.engine.variables))

        rows = [row_signature(x), row_signature(y)]
        if self.per_unit:  # hook of per-unit clipping: the rows of each sampled unit summed, then clipped
            units = [tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int32)]
            return (
                step_function(lambda xb, yb, seg, k: apply(unit_noisy_sum(self.engine, xb, yb, seg, k)), rows + units),
                step_function(lambda: apply(self.engine.noise_sum()), []),
            )
        return (
            step_function(lambda xb, yb: apply(self.engine.noisy_sum(xb, yb)), rows),
            step_function(lambda: apply(self.engine.noise_sum()), []),
        )

    def _batches(self, rng, n, run):
        """Each step's Poisson batch: (rows,), or for a per-unit fit (rows, their segment, units sampled), the
        units sampled at ``run.sampling_rate`` (``unit_clip.unit_batches``)."""
        if self._units is None:
            return ((rows,) for rows in poisson_batches(rng, n, run.sampling_rate, run.steps))
        unit_of_row, num_units = self._units
        sampled = poisson_batches(rng, num_units, run.sampling_rate, run.steps)
        return (
            (rows, tf.constant(seg), tf.constant(k, tf.int32))
            for rows, seg, k in unit_batches(sampled, unit_of_row, num_units)
        )

    def _train(self, x, y, n, run, sampling_seed, fall_back, verbose, callback):
        """The DP-SGD loop: ``run.steps`` Poisson-sampled batches (an empty one takes a noise-only step), each
        step at the schedule's sigma_t. With ``per_example="auto"``, if vectorisation fails when the step is
        first traced, ``fall_back()`` swaps in the per-example loop and the step runs again."""
        optimizer = self._make_optimizer()
        optimizer.build(self.engine.variables)  # its variables exist before the trace: the step traces once
        dp_step, noise_step = self._steps(optimizer, x, y)
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
                    dp_step, noise_step = self._steps(optimizer, x, y)
                    dp_step(xb, yb, *units)
                traced = True
            if callback is not None:
                callback(i)
            if verbose and (i + 1) % max(1, run.steps // 10) == 0:
                print(f"DP-SGD step {i + 1}/{run.steps}", flush=True)

    def _can_fall_back(self):
        engine = self.engine
        return (
            self.per_example == "auto"
            and getattr(engine, "vectorized", False)
            and bool(getattr(engine, "fallback", True))
        )

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
            "epsilon": run.epsilon,
            "delta": self.delta,
            "dp_event": run.dp_event,
            "noise_multiplier": sigma,
            "steps": run.steps,
            "sampling_rate": run.sampling_rate,
            "num_examples": int(self.num_examples),
            "accountant": self.accountant,
            "mechanism": "dp-sgd (Poisson-sampled Gaussian)",
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
        """The model's outputs on ``x`` (post-processing of the DP weights: no further privacy cost).

        Args:
          x: the model's inputs (an array, or a list / dict of arrays).

        Returns:
          The outputs as a numpy array.

        Raises:
          ValueError: the model is not fitted.
        """
        self._require_fit()
        return self.model(_to_numpy(x), training=False).numpy()

    def export(self, path: str, transform_output: Any = None, label_key: str | None = None) -> str:
        """Write the fitted model as a SavedModel with a ``serving_default`` signature (``export_keras_model``).

        Post-processing of the DP weights: no privacy cost.

        Args:
          path: the SavedModel directory to write.
          transform_output: None (the signature takes the model's inputs by their Keras input names), or a
            tf.Transform output (it takes serialized tf.Examples through the transform graph), as
            ``trainer_utils.export_model`` passes.
          label_key: the raw label feature, left out of the parsed tf.Examples.

        Returns:
          ``path``.

        Raises:
          ValueError: the model is not fitted, or its inputs are unknown.
        """
        self._require_fit()
        return export_keras_model(self.model, path, transform_output, label_key)


def make_private(
    model: Model,
    *,
    privacy_budget: tuple[float, float],
    num_examples: int,
    clip_norm: float | str | adaptive_clip.AdaptiveClip = 1.0,
    batch_size: int = 256,
    epochs: int | float = 1,
    optimizer: str = "sgd",
    learning_rate: float | None = None,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    loss: Any = None,
    accountant: str = "rdp",
    per_example: str = "auto",
    seed: int | None = None,
    noise_schedule: noise_schedules.NoiseSchedule | None = None,
    name: str = _NAME,
    per_unit: bool = False,
) -> PrivateModel:
    """Wrap a tf.keras ``model`` for DP-SGD training; every argument is checked here, before any data is read.

    Args:
      model: a tf.keras Sequential or Functional model, or a function ``init_seed -> model`` that ``fit`` calls
        once with its weight-initialisation seed (how the DP estimators build their network).
      privacy_budget: ``(epsilon, delta)`` of the run, under add/remove one record (one unit with ``per_unit``).
      num_examples: the DP or public row count (``fn_args.num_examples``; units with ``per_unit``), never the
        exact count: sigma depends on it.
      clip_norm: C > 0, the sensitivity of each step's gradient sum; or ``"adaptive"`` / an ``AdaptiveClip``
        (C estimated privately as a quantile of the gradient norms, same DpEvent and epsilon).
      batch_size: the expected batch size: each step samples each record with ``q = batch_size / num_examples``.
      epochs: passes over ``num_examples``: ``steps = ceil(epochs * num_examples / batch_size)``.
      optimizer: ``"sgd"``, ``"adam"`` or ``"debiased_momentum"`` (``OPTIMIZERS``; the last is Hong et al.'s
        Alg. 2 with beta = ``momentum``, ``sage_tfx.models.momentum``: post-processing, privacy unchanged).
      learning_rate: None for 0.1 (sgd, debiased_momentum) / 0.001 (adam).
      momentum: sgd's momentum (debiased_momentum's beta) in [0, 1).
      weight_decay: decoupled weight decay in [0, 1/learning_rate); reads no data (post-processing).
      loss: None (the model's compiled loss), one of ``LOSSES``, or a per-example Keras loss.
      accountant: ``"rdp"`` or ``"pld"`` (dp_accounting), calibrating sigma.
      per_example: one of ``PER_EXAMPLE``: how per-example gradients are computed (``"auto"``: ghost clipping
        when the model has a graph with a Dense, Embedding, LayerNormalization, Conv1D/Conv2D, EinsumDense or
        MultiHeadAttention layer, else vmap).
      seed: tests only: refused inside ``training_seed`` (DPTrainer), where the grant's seed is used.
      noise_schedule: None (constant sigma) or a ``sage_tfx.privacy.noise_schedules`` schedule, its scale
        calibrated to the same ``privacy_budget``.
      name: the fit's name in errors, seed derivation and ``privacy_spent["implementation"]``.
      per_unit: clip per privacy unit (``sage_tfx.models.unit_clip``): ``fit(x, y, units=ids)``.

    Returns:
      A ``PrivateModel`` to ``fit``.

    Raises:
      DpSgdConfigError: an argument is invalid or refused, named with the fix; nothing is read or spent.

    Mechanism and proofs (calibration, adaptive clip, noise schedules, per-unit clipping): docs/models.md.
    """
    arguments = check_make_private(
        model,
        privacy_budget=privacy_budget,
        num_examples=num_examples,
        clip_norm=clip_norm,
        batch_size=batch_size,
        epochs=epochs,
        optimizer=optimizer,
        learning_rate=learning_rate,
        momentum=momentum,
        weight_decay=weight_decay,
        loss=loss,
        accountant=accountant,
        per_example=per_example,
        seed=seed,
        noise_schedule=noise_schedule,
        name=name,
        per_unit=per_unit,
    )
    return PrivateModel(model, **arguments)
