"""One exception root: every error sage-tfx raises on purpose derives from ``SageError``, keeps
the built-in base it had before (``except ValueError`` still catches what it caught), and round-trips through
pickle (errors cross processes: sage serve workers, Beam workers)."""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil
import subprocess
import sys
from types import ModuleType

import pytest

import sage_tfx
from sage_tfx.privacy.errors import SageError

# Every exception class defined in our packages -> the built-in bases it must still derive from. A class missing
# here fails the test: add it, deriving from SageError.
EXPECTED: dict[str, tuple[type[BaseException], ...]] = {
    "sage_tfx.privacy.errors.SageError": (),
    "sage_tfx.privacy.errors.LedgerError": (ValueError,),
    "sage_tfx.privacy.errors.LedgerNotFound": (ValueError,),
    "sage_tfx.privacy.errors.LedgerCorrupt": (ValueError,),
    "sage_tfx.privacy.errors.LedgerRollback": (ValueError,),
    "sage_tfx.privacy.errors.LedgerUpgradeNeeded": (ValueError,),
    "sage_tfx.privacy.errors.UnknownStream": (ValueError,),
    "sage_tfx.privacy.errors.UnknownBlock": (ValueError,),
    "sage_tfx.privacy.errors.BlockRetired": (ValueError,),
    "sage_tfx.privacy.errors.DuplicateContent": (ValueError,),
    "sage_tfx.privacy.errors.PipelineBusy": (ValueError,),
    "sage_tfx.privacy.errors.RefusedBeforeCharge": (ValueError,),  # a pre-charge check failed: nothing charged
    "sage_tfx.privacy.errors.StorageError": (),  # the environment's fault (a file missing or altered), not input
    "sage_tfx.privacy.errors.IterationInterrupted": (),  # an environment error after the charge: resumable
    "sage_tfx.privacy.errors.ConfinedRunError": (),  # a confined child's error, as the child classified it
    "sage_tfx.isolation.ConfinementError": (RuntimeError,),  # Landlock available but not applied: no user code ran
    "sage_tfx.adaptive.request.RequestMismatch": (ValueError,),  # a name asked for another certificate request
    "sage_tfx.privacy.errors.GrantError": (ValueError,),
    "sage_tfx.privacy.errors.BudgetRefused": (),  # Exception only, never a ValueError (the CLI exits 3, not 2)
    "sage_tfx.privacy.errors.RecordError": (ValueError,),
    "sage_tfx.privacy.keys.KeyFileError": (ValueError,),
    "sage_tfx.privacy.adassp.AdaSSPConfigError": (ValueError,),
    "sage_tfx.auditing.core.AuditConfigError": (ValueError,),
    "sage_tfx.privacy.dpsgd.DpSgdConfigError": (ValueError,),
    "sage_tfx.privacy.randomness.SamplerError": (ValueError,),
    "sage_tfx.models.seeding.TrainingSeedError": (ValueError,),
    "sage_tfx.models.seeding.FitBudgetError": (ValueError,),
    "sage_tfx.models.seeding.PublicParameterError": (ValueError,),
    "sage_tfx.models.row_checks.RowCouplingError": (ValueError,),
    "sage_tfx.transform.errors.DPTransformError": (ValueError,),
    "sage_tfx.transform.errors.MissingBudget": (ValueError,),
    "sage_tfx.transform.errors.BudgetExceeded": (ValueError,),
    "sage_tfx.transform.errors.NonPrivateAnalyzer": (ValueError,),
    "sage_tfx.transform.errors.TraceMismatch": (ValueError,),
    "sage_tfx.transform.errors.RowMixing": (ValueError,),
    "sage_tfx.validation.core.ValidationInputError": (ValueError,),
    "sage_tfx.ingest.inputs.InputError": (ValueError,),
    "sage_tfx.ingest.access.GrantKeyError": (ValueError,),
    "sage_tfx.ingest.sealed.SealedError": (ValueError,),
    "sage_tfx.components.trainer_utils.TrainerDataError": (ValueError,),
    "sage_tfx.components.transform_utils.SchemaError": (ValueError,),
    "sage_tfx.components.dp_transform_executor.TransformConfigError": (ValueError,),
    "sage_tfx.components.validator_records.ValidatorConfigError": (ValueError,),
    "sage_tfx.components.dp_trainer_executor.SpendError": (ValueError,),
    "sage_tfx.pipelines.definition.PipelineDefinitionError": (ValueError,),
    "sage_tfx.pipelines.template.TemplateError": (ValueError,),
    "sage_tfx.pipelines.scoring.ScoreError": (ValueError,),
    "sage_tfx.pipelines.check.TrivialTarget": (ValueError,),
    "sage_tfx.privacy.noise_schedules.NoiseScheduleError": (ValueError,),
    "sage_tfx.release.continual.params.ContinualReleaseError": (ValueError,),
    "sage_tfx.release.growth.errors.GrowthError": (ValueError,),
    "sage_tfx.release.incremental_regression.IncrementalRegressionError": (ValueError,),
    "sage_tfx.release.incremental_regression.HorizonExhausted": (ValueError,),
    "sage_tfx.release.scheduled_pipeline.RunFailed": (),  # a scheduled run's pipeline raised: not bad input
    "sage_tfx.release.settings.ReleaseInputError": (ValueError,),
}

# Exceptions that deliberately do NOT derive from SageError, with their bases. beam_boot.py runs as a Beam worker's
# boot program on stdlib alone: importing sage_tfx.privacy.errors would run sage_tfx/__init__ (it sets
# TF_USE_LEGACY_KERAS in the environment the worker inherits) and sage_tfx.privacy/__init__ (the ledger).
NOT_SAGE: dict[str, tuple[type[BaseException], ...]] = {
    "sage_tfx.beam_boot.BootError": (RuntimeError,),
    # private to `sage release`, always caught there and turned into exit 2; the CLI's modules import no privacy
    # core while the parser is built (`sage --help` stays fast), so it is a plain Exception
    "sage_tfx.cli.release._BadInput": (Exception,),
}

# Constructor arguments of the errors whose __init__ is not Exception's.
ARGS: dict[str, tuple[object, ...]] = {
    "BudgetRefused": ("taxi", "p1", {"day-3": "epsilon 0.5 > 0.25 left"}),
    "RecordError": ("fare", 7, "not finite"),
}

# Modules that import no TensorFlow (the core, ingest, validation, the CLI's light parts, the pipeline definition).
CORE_MODULES = (
    "sage_tfx.privacy.errors",
    "sage_tfx.privacy.keys",
    "sage_tfx.privacy.adassp",
    "sage_tfx.privacy.dpsgd",
    "sage_tfx.privacy.samplers",
    "sage_tfx.privacy.randomness",
    "sage_tfx.transform.errors",
    "sage_tfx.validation.core",
    "sage_tfx.ingest.records",
    "sage_tfx.ingest.access",
    "sage_tfx.ingest.sealed",
    "sage_tfx.components.transform_utils",
    "sage_tfx.components.trainer_utils",
    "sage_tfx.pipelines.definition",
    "sage_tfx.pipelines.template",
    "sage_tfx.pipelines.scoring",
    "sage_tfx.beam_boot",
    "sage_tfx.privacy.noise_schedules",
    "sage_tfx.release.continual.params",
    "sage_tfx.release.growth.errors",
    "sage_tfx.release.incremental_regression",
    "sage_tfx.cli.release",
    "sage_tfx.release.settings",
    "sage_tfx.release.session",
    "sage_tfx.release.plans",
)


def _all_module_names() -> list[str]:
    names = ["sage_tfx"]
    for package in ("sage_tfx", "sage_tfx.components", "sage_tfx.pipelines"):
        module = importlib.import_module(package)
        names += [info.name for info in pkgutil.walk_packages(module.__path__, package + ".")]
    return sorted(set(names) - {"sage_tfx.__main__"})


def _exceptions(modules: list[ModuleType]) -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for module in modules:
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__.split(".")[0] == "sage_tfx":
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return found


def _instance(cls: type[BaseException]) -> BaseException:
    return cls(*ARGS.get(cls.__name__, ("bad value 'x'",)))


def _check(found: dict[str, type[BaseException]]) -> None:
    unknown = sorted(set(found) - set(EXPECTED) - set(NOT_SAGE))
    assert not unknown, f"exception classes missing from EXPECTED (derive them from SageError): {unknown}"
    for name, cls in found.items():
        if name in NOT_SAGE:
            assert not issubclass(cls, SageError), name
            bases = NOT_SAGE[name]
        else:
            assert issubclass(cls, SageError), f"{name} does not derive from SageError"
            bases = EXPECTED[name]
        for base in bases:
            assert issubclass(cls, base), f"{name} lost its base {base.__name__}"
        if not bases and name not in NOT_SAGE:
            assert not issubclass(cls, ValueError), name
        error = _instance(cls)
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is cls, name
        assert str(back) == str(error), name
        assert back.args == error.args, name
        assert vars(back) == vars(error), name


def test_sage_error_is_exported() -> None:
    import sage_tfx.privacy as privacy

    assert privacy.SageError is SageError and "SageError" in privacy.__all__
    assert sage_tfx.SageError is SageError
    assert "catches them all" in SageError.__doc__


def test_core_errors_derive_from_sage_error_and_pickle() -> None:
    modules = [importlib.import_module(name) for name in CORE_MODULES]
    found = _exceptions(modules)
    core = {name for name in EXPECTED if name.rsplit(".", 1)[0] in CORE_MODULES}
    assert core | set(NOT_SAGE) <= set(found)
    _check(found)


def test_budget_refused_and_record_error_pickle_their_fields() -> None:
    from sage_tfx.privacy.errors import BudgetRefused, RecordError

    refused = pickle.loads(pickle.dumps(BudgetRefused("taxi", "p1", {"day-1": "exhausted"})))
    assert (refused.stream, refused.pipeline, refused.shortfalls) == ("taxi", "p1", {"day-1": "exhausted"})
    record = pickle.loads(pickle.dumps(RecordError("fare", None, "not finite")))
    assert (record.column, record.index, record.problem) == ("fare", None, "not finite")
    assert str(record) == "column 'fare': not finite"


def test_importing_the_errors_loads_no_tensorflow() -> None:
    code = "import sys, sage_tfx.privacy.errors; assert 'tensorflow' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.tf
def test_every_public_module_error_derives_from_sage_error_and_pickles() -> None:
    modules = [importlib.import_module(name) for name in _all_module_names()]
    found = _exceptions(modules)
    assert set(EXPECTED) | set(NOT_SAGE) <= set(found), sorted(set(EXPECTED) | set(NOT_SAGE) - set(found))
    _check(found)
