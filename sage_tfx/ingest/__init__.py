"""Ingest: turn an input file into disjoint, ledger-registered blocks of tf.Example TFRecords.

``records`` converts rows to tf.Example bytes and frames TFRecord files,
``blocks`` assigns each record to a block (time window or keyed user shard),
``layout`` names the folders and files of the block store, ``sealed`` encrypts and
authenticates every block file (and a run's part list), ``staging`` holds an ingest's
runs in progress, ``store`` writes part files and commits and registers blocks,
``access`` hands out block keys (a charged grant, or trusted code),
``pipeline`` is the Beam pipeline behind ``sage ingest``, ``replay`` makes a
historical data set arrive block by block. None of them imports TensorFlow.
"""
