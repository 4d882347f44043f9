"""The non-private baseline of `sage bench iteration`: taxi_regression's task built from TFX's stock components."""
