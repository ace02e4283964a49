"""Which launcher started this process, and where it says the process sits.

Every launcher exports the rank of a process and its place on its node in its own set of
environment variables. :func:`detect_launcher` reads them from an environment mapping (a pure
function, so tests pass fake environments) and returns a :class:`LauncherInfo`. lmdbio uses it
for log prefixes, for ``lmdbio launch`` (to refuse nesting a launch inside a launched job) and
as a cross-check of the node-local rank that later picks a GPU.

Precedence matters because launchers nest: ``mpirun`` inside a Slurm allocation still sees the
allocation's ``SLURM_*`` variables (with ``SLURM_PROCID=0`` in every rank), and ``srun`` with
PMI-2 exports both ``SLURM_*`` and ``PMI_*``. The MPI launcher that actually spawned the
process is the most specific source, so the order is: Open MPI, MPICH/Hydra (PMI), PMIx,
Slurm, torchrun.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from lmdbio.errors import LmdbioError

__all__ = ["MPI_LAUNCHERS", "LauncherInfo", "detect_launcher", "slurm_tasks_on_node"]

#: launcher names that mean "this process is already a rank of an MPI job"
MPI_LAUNCHERS = frozenset({"openmpi", "mpich", "slurm-pmi", "pmix"})


@dataclass(frozen=True)
class LauncherInfo:
    """Where the launcher placed this process.

    ``local_rank`` / ``local_size`` describe the node as the launcher sees it; a field is
    ``None`` when that launcher does not export it. ``node_index`` is only known under Slurm.
    ``source`` names the variables the values came from (for log messages).
    """

    name: str
    rank: int
    size: int
    local_rank: int | None = None
    local_size: int | None = None
    node_index: int | None = None
    source: str = ""

    def to_dict(self) -> dict[str, object]:
        """JSON-able form (for ``Topology.describe()`` and logs)."""
        return asdict(self)


def _int(env: Mapping[str, str], name: str, *, required: bool = True) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        if required:
            raise LmdbioError(f"launcher variable {name} is not set")
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise LmdbioError(
            f"launcher variable {name}={raw!r} is not an integer"
        ) from None
    if value < 0:
        raise LmdbioError(f"launcher variable {name}={raw!r} is negative")
    return value


_TASKS_ITEM = re.compile(r"^\s*(\d+)\s*(?:\(x(\d+)\))?\s*$")


def slurm_tasks_on_node(tasks_per_node: str, node_index: int) -> int | None:
    """Number of tasks Slurm placed on node ``node_index``.

    ``SLURM_TASKS_PER_NODE`` is a compressed list such as ``"2(x3),1"`` (three nodes with 2
    tasks, then one with 1). Returns ``None`` when the string cannot be parsed or the node
    index is out of range, because a log field is not worth failing a job for.
    """
    seen = 0
    for item in tasks_per_node.split(","):
        m = _TASKS_ITEM.match(item)
        if m is None:
            return None
        count, repeat = int(m.group(1)), int(m.group(2) or 1)
        if node_index < seen + repeat:
            return count
        seen += repeat
    return None


def _check(info: LauncherInfo) -> LauncherInfo:
    if info.size < 1:
        raise LmdbioError(f"{info.source}: world size {info.size} is not positive")
    if info.rank >= info.size:
        raise LmdbioError(f"{info.source}: rank {info.rank} is not below size {info.size}")
    if (
        info.local_rank is not None
        and info.local_size is not None
        and info.local_rank >= info.local_size
    ):
        raise LmdbioError(
            f"{info.source}: local rank {info.local_rank} is not below local size "
            f"{info.local_size}"
        )
    return info


def detect_launcher(environ: Mapping[str, str] | None = None) -> LauncherInfo | None:
    """The launcher of this process according to ``environ`` (default ``os.environ``).

    Returns ``None`` for a process started by hand (a singleton). Raises
    :class:`~lmdbio.errors.LmdbioError` when a launcher's variables are present but malformed
    (non-integer, negative, rank not below size), naming the variable.
    """
    env = os.environ if environ is None else environ

    if "OMPI_COMM_WORLD_RANK" in env:
        return _check(
            LauncherInfo(
                name="openmpi",
                rank=_int(env, "OMPI_COMM_WORLD_RANK"),
                size=_int(env, "OMPI_COMM_WORLD_SIZE"),
                local_rank=_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", required=False),
                local_size=_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", required=False),
                source="OMPI_COMM_WORLD_*",
            )
        )
    if "PMI_RANK" in env and "PMI_SIZE" in env:
        # Hydra (MPICH, Intel MPI, MVAPICH) exports MPI_LOCALRANKID / MPI_LOCALNRANKS;
        # srun --mpi=pmi2 exports PMI_* and SLURM_LOCALID.
        local_rank = _int(env, "MPI_LOCALRANKID", required=False)
        local_size = _int(env, "MPI_LOCALNRANKS", required=False)
        name = "mpich"
        if local_rank is None and "SLURM_LOCALID" in env:
            name = "slurm-pmi"
            local_rank = _int(env, "SLURM_LOCALID", required=False)
        return _check(
            LauncherInfo(
                name=name,
                rank=_int(env, "PMI_RANK"),
                size=_int(env, "PMI_SIZE"),
                local_rank=local_rank,
                local_size=local_size,
                source="PMI_RANK/PMI_SIZE",
            )
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        # An srun task. (The batch script itself also has SLURM_PROCID=0; it is reported
        # as task 0, which is harmless for logs; ``lmdbio launch`` only refuses to nest
        # inside MPI launchers, see MPI_LAUNCHERS.)
        node_index = _int(env, "SLURM_NODEID", required=False)
        local_size = None
        if node_index is not None and env.get("SLURM_STEP_TASKS_PER_NODE"):
            local_size = slurm_tasks_on_node(env["SLURM_STEP_TASKS_PER_NODE"], node_index)
        elif node_index is not None and env.get("SLURM_TASKS_PER_NODE"):
            local_size = slurm_tasks_on_node(env["SLURM_TASKS_PER_NODE"], node_index)
        return _check(
            LauncherInfo(
                name="slurm",
                rank=_int(env, "SLURM_PROCID"),
                size=_int(env, "SLURM_NTASKS"),
                local_rank=_int(env, "SLURM_LOCALID", required=False),
                local_size=local_size,
                node_index=node_index,
                source="SLURM_PROCID/SLURM_NTASKS",
            )
        )
    if "PMIX_RANK" in env:
        # A PMIx launcher that is not Open MPI's (e.g. srun --mpi=pmix): the world size is
        # only known from Slurm's variables when they are there.
        size = _int(env, "SLURM_NTASKS", required=False)
        rank = _int(env, "PMIX_RANK")
        return _check(
            LauncherInfo(
                name="pmix",
                rank=rank,
                size=size if size is not None else rank + 1,
                local_rank=_int(env, "SLURM_LOCALID", required=False),
                source="PMIX_RANK",
            )
        )
    if "RANK" in env and "WORLD_SIZE" in env and "LOCAL_RANK" in env:
        return _check(
            LauncherInfo(
                name="torchrun",
                rank=_int(env, "RANK"),
                size=_int(env, "WORLD_SIZE"),
                local_rank=_int(env, "LOCAL_RANK"),
                local_size=_int(env, "LOCAL_WORLD_SIZE", required=False),
                node_index=_int(env, "GROUP_RANK", required=False),
                source="RANK/WORLD_SIZE/LOCAL_RANK",
            )
        )
    return None
