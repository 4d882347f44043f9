"""Differentially private models with an estimator-like surface (TensorFlow, tf-keras).

DP-SGD: DPDNNRegressor, DPDNNClassifier, DPLogisticRegressor. AdaSSP: DPLinearRegressor.
Each takes ``privacy_budget=(epsilon, delta)`` and reports ``privacy_spent``
(a dp_accounting DpEvent and its (epsilon, delta)) after ``fit``.

``training_seed(seed)``: the hook through which DPTrainer seeds every DP model fitted inside it from the
grant's private seed (a model given ``seed=`` there is refused) and lets all the DP fits of a run spend at
most its training share together; ``candidate_budgets(privacy_budget, k)`` splits the share for a
hyper-parameter search of k candidates; see sage_tfx.models.seeding.

Non-finite inputs never make a fit fail: features and labels that are NaN or +-inf are mapped to public
defaults before any DP computation (sage_tfx.models.data), so one record's value cannot turn a release into
an error. A label that is not a valid class id raises ``RecordError`` (column and record index, no value).
"""

import sage_tfx  # noqa: F401  (before TensorFlow)
from sage_tfx.models.dpsgd_models import DPDNNClassifier, DPDNNRegressor, DPLogisticRegressor
from sage_tfx.models.linear import DPLinearRegressor
from sage_tfx.models.private import PrivateModel, make_private
from sage_tfx.models.seeding import candidate_budgets, training_seed

__all__ = [
    "DPDNNRegressor",
    "DPDNNClassifier",
    "DPLogisticRegressor",
    "DPLinearRegressor",
    "training_seed",
    "candidate_budgets",
    "make_private",
    "PrivateModel",
]
