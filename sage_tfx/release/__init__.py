"""Release strategies for a growing database, on the same ledger as Sage's iterator (docs/release_strategies.md).

One module per method; each charges the ledger, per block and before it reads, what its privacy analysis says:

- ``continual``: continual and sliding-window release of regularised ERM models (Watson et al.).
- ``incremental_regression``: incremental linear regression by the Tree Mechanism (Kasiviswanathan et al.).
- ``growth``: BBScheduler / BBImprover growth schedules and PMWG for linear queries (Cummings et al.).
- DP-SGD noise schedules (Hong et al.) live with DP-SGD: ``sage_tfx.privacy.noise_schedules``.

Importing this package imports no TensorFlow.
"""
