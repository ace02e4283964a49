"""Build several topologies (one JSON list of configs in argv[1]) and emit what each saw.

For every config this rank emits ``{"case": i, "describe": ..., "comm_sizes": ...}``, where
``comm_sizes`` are measured on the communicators themselves (not copied from the fields), plus
the world ranks of the readers/workers communicators gathered through them, so the test can
check both the bookkeeping and the real splits. A config that raises emits the error text.
"""

import json
import sys

from _result import emit
from mpi4py import MPI

from lmdbio.topology import Topology

configs = json.loads(sys.argv[1])
world = MPI.COMM_WORLD
for i, cfg in enumerate(configs):
    # {"per_rank": {"name": [value for rank 0, value for rank 1, ...]}}: a rank-dependent
    # argument, to check that mismatched arguments raise everywhere instead of hanging
    for name, values in cfg.pop("per_rank", {}).items():
        cfg[name] = values[world.Get_rank()]
    try:
        topo = Topology.build(world, **cfg)
    except Exception as exc:  # the test checks that every rank raised the same way
        emit({"case": i, "error": f"{type(exc).__name__}: {exc}"})
        continue
    sizes = {"node": topo.node.Get_size()}
    members = {}
    for name in ("readers", "workers"):
        comm = getattr(topo, name)
        if comm == MPI.COMM_NULL:
            sizes[name] = None
        else:
            sizes[name] = comm.Get_size()
            members[name] = comm.allgather(world.Get_rank())
    members["node"] = topo.node.allgather(world.Get_rank())
    emit({"case": i, "describe": topo.describe(), "comm_sizes": sizes, "members": members})
    topo.close()
    topo.close()  # idempotent
    emit({"case": i, "closed": topo.closed, "node_null": topo.node == MPI.COMM_NULL})
