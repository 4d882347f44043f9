"""The taxi pipelines' shared shape (paper List. 1):

    BlockExampleGen -> DPTransform -> DPTrainer -> DPModelValidator -> Pusher

Every data-reading component gets the iteration's grant and checks it with the
ledger before reading; each spends only its stage's share (the split signed
into the grant). The validator reads the raw eval split (the label in its raw
unit) and blesses the model only on ACCEPT; TFX's own Pusher pushes only a
blessed model.
"""
import os

MODULES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "modules")


def build(config, grant, eta, *, preprocessing_module, trainer_module, metric, label_key, loss_bound=None,
          trainer_config=None):
    from tfx.components.pusher.component import Pusher
    from tfx.orchestration import pipeline as tfx_pipeline
    from tfx.proto import pusher_pb2

    from sage_tfx.components.block_example_gen import BlockExampleGen
    from sage_tfx.components.dp_model_validator import DPModelValidator
    from sage_tfx.components.dp_trainer import DPTrainer
    from sage_tfx.components.dp_transform import DPTransform
    from sage_tfx.pipelines._runner import metadata_config

    from sage_tfx.privacy import BudgetSplit

    grant_json = grant.to_json()
    split = BudgetSplit.from_meta(grant.meta)
    # The REJECT test on the train split runs when the grant pays for it (its split's rejection stage).
    train_split = "train" if split is not None and split.rejection > 0 else None
    gen = BlockExampleGen(ledger=config.ledger, data_root=config.data_root, stream=config.stream, grant=grant_json)
    transform = DPTransform(examples=gen.outputs["examples"], module_file=preprocessing_module,
                            ledger=config.ledger, grant=grant_json, data_root=config.data_root,
                            stream=config.stream)
    trainer = DPTrainer(examples=transform.outputs["transformed_examples"],
                        transform_graph=transform.outputs["transform_graph"], module_file=trainer_module,
                        ledger=config.ledger, grant=grant_json,
                        custom_config={"model": config.model, **(trainer_config or {}), **config.hparams})
    validator = DPModelValidator(model=trainer.outputs["model"], examples=gen.outputs["examples"],
                                 ledger=config.ledger, metric=metric, target=config.target, label_key=label_key,
                                 grant=grant_json, loss_bound=loss_bound, eta=eta, train_split=train_split)
    pusher = Pusher(model=trainer.outputs["model"], model_blessing=validator.outputs["blessing"],
                    push_destination=pusher_pb2.PushDestination(
                        filesystem=pusher_pb2.PushDestination.Filesystem(base_directory=config.serving_dir)))
    return tfx_pipeline.Pipeline(
        pipeline_name=config.name, pipeline_root=config.pipeline_root,
        components=[gen, transform, trainer, validator, pusher], enable_cache=True,
        metadata_connection_config=metadata_config(config.metadata_path),
        beam_pipeline_args=list(config.beam_pipeline_args))
