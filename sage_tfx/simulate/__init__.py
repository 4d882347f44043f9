"""Load simulation of Sage's budgeting strategies (paper Fig. 8): numpy and the real ledger, no TensorFlow."""

from .engine import SimResult, simulate
from .strategies import LABELS, STRATEGIES
from .workload import SimConfig, make_workload

__all__ = ["simulate", "SimResult", "SimConfig", "make_workload", "STRATEGIES", "LABELS"]
