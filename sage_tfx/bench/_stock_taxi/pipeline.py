"""Run the stock baseline once: CsvExampleGen -> ImportSchemaGen -> Transform -> Trainer -> Evaluator -> Pusher
under TFX's LocalDagRunner, on one CSV directory; print {"components": [...]} as the last line.

Run as a script (``python pipeline.py CSV_DIR SCHEMA ROOT [--no-evaluator]``), so that nothing of sage_tfx is
imported: the baseline pays TFX's imports as a TFX user's process does. TensorFlow Data Validation does not
install on this Python; TFX's Transform and schema modules import it at module level, so a stand-in module is
registered that refuses every use, and Transform runs with its statistics off (``disable_statistics``: the only
part that needs it; sage's DPTransform computes none either).
"""

import importlib.abc
import importlib.machinery
import json
import os
import sys
import types


class _Refused(type):
    """A stand-in name of TFDV's: a class whose attributes are stand-ins too and whose every call is refused."""

    def __getattr__(cls, name):
        return _refused(f"{cls.__name__}.{name}")


def _refused(name):
    def refuse(*args, **kwargs):
        raise RuntimeError(f"tensorflow_data_validation's {name} is not installed here")

    return _Refused(name, (), {"__init__": refuse})


class _NoTFDV(types.ModuleType):
    """tensorflow_data_validation's stand-in: its names (type annotations, default arguments) read, every use
    is refused."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _refused(name)


class _NoTFDVFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``tensorflow_data_validation`` and its submodules as ``_NoTFDV`` stand-ins."""

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] != "tensorflow_data_validation":
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _NoTFDV(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def _pipeline(csv_dir, schema, root, evaluator):
    from tfx.components.example_gen.csv_example_gen.component import CsvExampleGen
    from tfx.components.pusher.component import Pusher
    from tfx.components.schema_gen.import_schema_gen.component import ImportSchemaGen
    from tfx.components.trainer.component import Trainer
    from tfx.components.transform.component import Transform
    from tfx.orchestration import metadata, pipeline
    from tfx.proto import pusher_pb2, trainer_pb2

    module = os.path.join(os.path.dirname(os.path.abspath(__file__)), "module.py")
    example_gen = CsvExampleGen(input_base=csv_dir)
    schema_gen = ImportSchemaGen(schema_file=schema)
    transform = Transform(
        examples=example_gen.outputs["examples"],
        schema=schema_gen.outputs["schema"],
        module_file=module,
        disable_statistics=True,
    )
    trainer = Trainer(
        module_file=module,
        examples=transform.outputs["transformed_examples"],
        transform_graph=transform.outputs["transform_graph"],
        schema=schema_gen.outputs["schema"],
        train_args=trainer_pb2.TrainArgs(num_steps=1),
        eval_args=trainer_pb2.EvalArgs(num_steps=1),
    )
    components = [example_gen, schema_gen, transform, trainer]
    if evaluator:
        components.append(_evaluator(example_gen, trainer))
    components.append(
        Pusher(
            model=trainer.outputs["model"],
            push_destination=pusher_pb2.PushDestination(
                filesystem=pusher_pb2.PushDestination.Filesystem(base_directory=os.path.join(root, "serving"))
            ),
        )
    )
    return pipeline.Pipeline(
        pipeline_name="stock_taxi",
        pipeline_root=os.path.join(root, "pipeline"),
        components=components,
        metadata_connection_config=metadata.sqlite_metadata_connection_config(os.path.join(root, "mlmd.db")),
    )


def _evaluator(example_gen, trainer):
    import tensorflow_model_analysis as tfma
    from tfx.components.evaluator.component import Evaluator

    config = tfma.EvalConfig(
        model_specs=[tfma.ModelSpec(signature_name="serving_default", label_key="trip_seconds")],
        slicing_specs=[tfma.SlicingSpec()],
        metrics_specs=[tfma.MetricsSpec(metrics=[tfma.MetricConfig(class_name="MeanSquaredError")])],
    )
    return Evaluator(examples=example_gen.outputs["examples"], model=trainer.outputs["model"], eval_config=config)


def main(argv):
    csv_dir, schema, root = argv[:3]
    sys.meta_path.insert(0, _NoTFDVFinder())
    from tfx.orchestration.local.local_dag_runner import LocalDagRunner

    built = _pipeline(csv_dir, schema, root, evaluator="--no-evaluator" not in argv)
    LocalDagRunner().run(built)
    print(json.dumps({"components": [c.id for c in built.components]}))


if __name__ == "__main__":
    main(sys.argv[1:])
