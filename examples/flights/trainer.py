"""run_fn of the flights example (DPTrainer module file, TFX's ``run_fn(fn_args)``).

A DP linear model (AdaSSP) of the arrival delay from the four features of preprocessing.py, each in [0, 1],
centred at 0.5 (``feature_center``): every row then lies in [-0.5, 0.5]^4, L2 norm <= 1, the public
``feature_bound`` (uncentred it would be 2, and AdaSSP's noise and ridge, which scale with its square, four
times larger); the label clipped to the public DELAY_RANGE.
A PUBLIC prior, known before any data: a flight arrives about as late as it left (arr_delay = dep_delay, i.e.
240 * dep_delay_01 - 60 on the feature's [0, 1] scale). The model fits the residual, arrival minus departure
delay, clipped to +-60 minutes (a flight rarely makes up or loses more than an hour on the way), and AdaSSP's
ridge shrinks towards the prior instead of towards 0 (DPLinearRegressor's ``prior_coef``).
The budget comes from DPTrainer (``fn_args.privacy_budget``); the noise from the grant (no seed here).
"""

import sage_tfx  # noqa: F401  (before TensorFlow)
from sage_tfx.components import trainer_utils
from sage_tfx.models import DPLinearRegressor

FEATURES = ["dep_delay_01", "distance_01", "hour_01", "carrier_delay"]  # each in [0, 1]
LABEL = "arr_delay"
DELAY_RANGE = (-60.0, 180.0)  # minutes, as in preprocessing.py
RESIDUAL_RANGE = (-60.0, 60.0)  # minutes: arrival delay minus departure delay


def run_fn(fn_args):
    x, y = trainer_utils.load_examples(fn_args, FEATURES, LABEL)
    low, high = DELAY_RANGE
    model = DPLinearRegressor(
        fn_args.privacy_budget,
        feature_bound=len(FEATURES) ** 0.5 / 2,
        label_range=DELAY_RANGE,
        feature_center=0.5,
        prior_coef={"dep_delay_01": high - low},
        prior_intercept=low,
        residual_range=RESIDUAL_RANGE,
    )
    model.fit(x, y)
    trainer_utils.export_model(fn_args, model, label_key=LABEL)
    return trainer_utils.report_spent(fn_args, model)
