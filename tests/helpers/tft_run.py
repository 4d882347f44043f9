"""Running a preprocessing_fn through tf.Transform on Beam's DirectRunner, over rows held in memory."""

import tempfile


def analyze(rows, spec, preprocessing_fn, batch_size=None):
    """``AnalyzeAndTransformDataset`` of ``preprocessing_fn`` on ``rows`` (dicts of ``spec``'s features); return the
    transformed rows. ``batch_size``: tf.Transform's ``desired_batch_size`` (None: its default)."""
    import tensorflow_transform as tft
    import tensorflow_transform.beam as tft_beam

    metadata = tft.DatasetMetadata.from_feature_spec(spec)
    with tempfile.TemporaryDirectory() as tmp, tft_beam.Context(temp_dir=tmp, desired_batch_size=batch_size):
        (transformed, _), _ = (rows, metadata) | tft_beam.AnalyzeAndTransformDataset(preprocessing_fn)
    return transformed
