"""A model of one epoch of every read strategy, to project lmdbio beyond one host.

* :mod:`~lmdbio.scale.trace` runs the real strategies over a real database, one simulated
  reader after another, and records the exact pages each one touches;
* :mod:`~lmdbio.scale.costs` holds the cost parameters (file system, MPI, CPU);
* :mod:`~lmdbio.scale.model` turns a trace and costs into an epoch's time;
* :mod:`~lmdbio.scale.project` runs that for every strategy of a job (``lmdbio
  plan-scale``). No MPI anywhere: everything runs in one process.
"""

from lmdbio.scale.costs import Costs, costs_from_mapping, load_costs
from lmdbio.scale.model import EpochResult, epoch_time
from lmdbio.scale.trace import Step, Trace, trace

__all__ = ["Costs", "EpochResult", "Step", "Trace", "costs_from_mapping", "epoch_time",
           "load_costs", "trace"]
