"""Who is who in an lmdbio job: nodes, readers, workers and their communicators.

:meth:`Topology.build` is collective over a communicator (``COMM_WORLD`` by default) and
derives, for every rank:

* ``node`` - the ranks that share memory with it: ``Split_type(COMM_TYPE_SHARED)``, or with
  ``simulate_nodes=K`` the world cut into K groups of consecutive ranks, so that the
  multi-node code paths (one reader per node, cursor hand-off between nodes) run on one
  host. A simulated node must still lie inside one shared-memory domain, which is checked.
* ``host_size`` - the ranks on this rank's host (its shared-memory domain), whatever the
  nodes: with simulated nodes, all of them; the ring's waits compare it with the cores.
* ``node_index`` - nodes numbered 0..n_nodes-1 in the order of their lowest world rank.
* reader groups - with ``readers_per_node=k`` > 1 every node is cut into k groups of
  consecutive local ranks (sizes as even as possible; ``0`` chooses per node,
  :func:`reader_groups`), and each group is a node from here on: its own node
  communicator, ring and reader, numbered after the nodes before it (``host_nodes``
  counts the nodes before the cut). The groups of one host share its page cache, as
  simulated nodes do; what they spread is the readers' work (locating records, filling
  and publishing slots), which one reader serializes for all of a node's workers
  (docs/service.md, "Readers per node").
* readers - the first local rank of every node (or group). ``readers`` is the
  communicator of all readers across nodes, node by node (``MPI.COMM_NULL`` on other
  ranks); its rank equals the node index.
* mode - ``"auto"`` (the configuration's default) picks per node: colocated below
  :data:`DEDICATED_FROM_RANKS` ranks, dedicated from there (:func:`auto_mode`).
* workers - the ranks that train. ``"dedicated"`` mode: the reader does not train, workers
  are the other local ranks; a node where every rank would be a reader (e.g. a node with a
  single rank) falls back to ``"colocated"`` with a logged warning (none in a job of one
  process, which has no other way to run). ``"colocated"`` mode:
  every rank is a worker and the readers also read. ``workers`` is the communicator of all
  workers (the trainer's data-parallel group), node by node: a node's workers have
  consecutive worker ranks, as the node-level strategies' plans need. Node by node means
  world-rank order where every node is a block of consecutive world ranks (Open MPI's
  default mapping, Slurm's block distribution), not under a round-robin mapping.

``device_index`` (this worker's index among the workers of its node before any reader
groups were cut: the host's, or the simulated node's) is what picks the GPU.
"""

from __future__ import annotations

import logging
import operator
import os
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

from launch.detect import LauncherInfo, detect_launcher
from lmdbio.errors import ConfigError, LmdbioError
from lmdbio.mpiutil import agree, start_mpi

if TYPE_CHECKING:  # pragma: no cover
    from mpi4py import MPI

__all__ = ["MODES", "LauncherInfo", "ReaderMode", "Topology", "detect_launcher", "reader_groups",
           "simulated_node_bounds"]

log = logging.getLogger(__name__)

#: the role layouts a node can run in (``readers.mode`` of a job): the one declaration
ReaderMode = Literal["auto", "dedicated", "colocated"]
#: the role layouts, from :data:`ReaderMode`
MODES: tuple[str, ...] = get_args(ReaderMode)
#: ``mode="auto"``: a node of at least this many ranks gets a dedicated reader, a smaller
#: one runs colocated (see :func:`auto_mode`)
DEDICATED_FROM_RANKS = 8


def auto_mode(local_size: int) -> str:
    """The role split ``mode="auto"`` gives a node of ``local_size`` ranks.

    A dedicated reader never trains: on a node of 2 ranks half the node idles, and on a GPU
    node (one rank per device) a device does. Measured (docs/service.md, "Roles"): at 2
    ranks on 2 cores colocated delivered 1.6x dedicated (CIFAR-like, 405 k against 254 k
    samples/s); at 16 ranks on a 16-core node colocated delivered 1.15x (CIFAR-like) and
    1.25x (ImageNet-like) but at 1.2x and 1.45x the CPU per sample, the CPU a trainer's
    own step needs. So: colocated below :data:`DEDICATED_FROM_RANKS` ranks, where one
    reader costs a large share of the node, dedicated from there, where it costs at most
    an eighth and keeps reading off the trainers' cores. GPU workers: colocated (the
    loader asks for it; see ``loaders.Loader``).
    """
    return "dedicated" if local_size >= DEDICATED_FROM_RANKS else "colocated"

#: environment variable ``lmdbio launch --simulate-nodes K`` exports to the ranks
SIMULATE_NODES_ENV = "LMDBIO_SIMULATE_NODES"


def simulated_node_bounds(world_size: int, n_nodes: int) -> list[tuple[int, int]]:
    """``[start, stop)`` world-rank ranges of ``n_nodes`` simulated nodes.

    Consecutive ranks, sizes as even as possible: the first ``world_size % n_nodes`` nodes get
    one rank more. Raises :class:`~lmdbio.errors.ConfigError` if ``n_nodes`` is not in
    ``1..world_size``.
    """
    if n_nodes < 1:
        raise ConfigError(f"topology.simulate_nodes (--simulate-nodes) must be >= 1 to "
                          f"simulate nodes, got {n_nodes}")
    if n_nodes > world_size:
        raise ConfigError(
            f"topology.simulate_nodes (--simulate-nodes) = {n_nodes} is more than the "
            f"{world_size} ranks of the job; every simulated node needs at least one rank"
        )
    base, extra = divmod(world_size, n_nodes)
    bounds = []
    start = 0
    for i in range(n_nodes):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def _as_int(name: str, value: object) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ConfigError(f"{name} must be an integer, got {value!r}") from None


def _check_params(
    simulate_nodes: int | None, readers_per_node: int, mode: str, world_size: int,
    simulate_nodes_at: str | None = None,
) -> tuple[int, int, str]:
    """Normalized ``(simulate_nodes, readers_per_node, mode)``; ConfigError when invalid
    (a refused ``simulate_nodes`` at ``simulate_nodes_at``, the ``file:line`` of the job
    configuration's ``topology.simulate_nodes``, where given)."""
    if mode not in MODES:
        raise ConfigError(f"topology mode must be one of {MODES}, got {mode!r}")
    from_env = simulate_nodes is None
    if from_env:
        raw = os.environ.get(SIMULATE_NODES_ENV, "").strip() or "0"
        try:
            simulate_nodes = int(raw)
        except ValueError:
            raise ConfigError(f"{SIMULATE_NODES_ENV}={raw!r} is not an integer") from None
    simulate_nodes = _as_int("simulate_nodes", simulate_nodes)
    readers_per_node = _as_int("readers_per_node", readers_per_node)
    try:
        if simulate_nodes < 0:
            raise ConfigError(f"topology.simulate_nodes (--simulate-nodes) must be >= 0, got "
                              f"{simulate_nodes}")
        if simulate_nodes:
            simulated_node_bounds(world_size, simulate_nodes)  # raises when > world size
    except ConfigError as exc:
        if from_env:
            raise ConfigError(f"{SIMULATE_NODES_ENV}={simulate_nodes} in the environment "
                              "(what lmdbio launch --simulate-nodes exports; "
                              f"topology.simulate_nodes is not set): {exc}") from None
        if simulate_nodes_at:
            raise ConfigError(f"{simulate_nodes_at}: {exc}") from None
        raise
    if readers_per_node < 0:
        raise ConfigError(f"readers_per_node must be >= 0 (0: chosen per node), got "
                          f"{readers_per_node}")
    return simulate_nodes, readers_per_node, mode


def _world_comm(comm: MPI.Comm | None) -> MPI.Comm:
    """The communicator :meth:`Topology.build` splits: ``comm``, or ``MPI.COMM_WORLD`` if None.

    Starts MPI first (:func:`lmdbio.mpiutil.start_mpi`); ``MPI.COMM_NULL`` is refused with
    :class:`~lmdbio.errors.LmdbioError`, since no rank could take part in the collectives.
    """
    MPI = start_mpi()  # mpi4py's module, under its usual name
    world = MPI.COMM_WORLD if comm is None else comm
    if world == MPI.COMM_NULL:
        raise LmdbioError("Topology.build needs a communicator, got MPI.COMM_NULL")
    return world


def _agreed_params(
    world: MPI.Comm, simulate_nodes: int | None, readers_per_node: int, mode: str,
    simulate_nodes_at: str | None = None,
) -> tuple[int, int, str]:
    """Collective: the checked ``(simulate_nodes, readers_per_node, mode)``, equal on all ranks.

    Validates locally, then exchanges: a rank with a bad or different value must make every
    rank raise :class:`~lmdbio.errors.ConfigError`, not leave the others waiting in the next
    collective.
    """
    try:
        params: tuple[int, int, str] | str = _check_params(
            simulate_nodes, readers_per_node, mode, world.Get_size(), simulate_nodes_at)
    except ConfigError as exc:
        params = str(exc)
    all_params = world.allgather(params)
    errors = sorted({p for p in all_params if isinstance(p, str)})
    if errors:
        raise ConfigError("; ".join(errors))
    if any(p != all_params[0] for p in all_params):
        raise ConfigError(
            "Topology.build got different arguments on different ranks "
            f"(simulate_nodes, readers_per_node, mode): {sorted(set(all_params))}"
        )
    agreed: tuple[int, int, str] = all_params[0]
    return agreed


def _split_simulated_nodes(world: MPI.Comm, simulate_nodes: int
                           ) -> tuple[MPI.Comm, int, int, int]:
    """Collective: ``(node, node_index, n_nodes, host_size)`` for ``simulate_nodes`` nodes.

    Nodes are runs of consecutive world ranks (:func:`simulated_node_bounds`). A simulated
    node must fit in one shared-memory domain (the batch ring lives in an MPI shared
    window), which is checked on every rank before anyone allocates one.
    """
    from mpi4py import MPI

    rank = world.Get_rank()
    bounds = simulated_node_bounds(world.Get_size(), simulate_nodes)
    node_index = next(i for i, (lo, hi) in enumerate(bounds) if lo <= rank < hi)
    node = world.Split(color=node_index, key=rank)
    shared = node.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    inside = shared.Get_size() == node.Get_size()
    shared.Free()
    host = world.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    host_size = host.Get_size()
    host.Free()
    try:
        agree(
            world,
            inside,
            f"simulated node {node_index} spans more than one shared-memory domain",
            "simulate_nodes",
        )
    except LmdbioError:
        node.Free()
        raise
    return node, node_index, simulate_nodes, host_size


def _split_host_nodes(world: MPI.Comm) -> tuple[MPI.Comm, int, int, int]:
    """Collective: ``(node, node_index, n_nodes, host_size)`` with a node per shared-memory domain.

    Nodes are numbered by their lowest world rank (node rank 0, since ``key=rank``).
    """
    from mpi4py import MPI

    rank = world.Get_rank()
    node = world.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    leader = node.bcast(rank if node.Get_rank() == 0 else None, root=0)
    leaders = sorted(set(world.allgather(leader)))
    return node, leaders.index(leader), len(leaders), node.Get_size()


def _node_mode(mode: str, node_index: int, local_rank: int, local_size: int,
               world_size: int) -> str:
    """The role layout this node runs in, given the ``mode`` of the host (or simulated)
    node it belongs to (``auto`` resolved there, by that node's size: :func:`auto_mode`):
    ``"dedicated"`` on a node of one rank (nobody would be left to train) falls back to
    ``"colocated"``, warned about once per node (not in a job of one process, which has
    no other way to run).
    """
    node_mode = mode
    if mode == "dedicated" and local_size <= 1:
        node_mode = "colocated"
        if local_rank == 0 and world_size > 1:  # one process: nothing else was to be had
            log.warning(
                "node %d has one rank: nobody would be left to train beside a dedicated "
                "reader, so this node runs in colocated mode (its reader also trains)",
                node_index,
            )
    return node_mode


def _split_nodes(world: MPI.Comm, simulate_nodes: int) -> tuple[MPI.Comm, int, int, int]:
    """Collective: ``(node, node_index, n_nodes, host_size)``, simulated nodes or real ones."""
    if simulate_nodes:
        return _split_simulated_nodes(world, simulate_nodes)
    return _split_host_nodes(world)


def reader_groups(readers_per_node: int, node_mode: str, node_size: int) -> int:
    """The reader groups a node of ``node_size`` ranks run in ``node_mode`` is cut into:
    ``readers_per_node`` (clamped to the node's size), or for 0 (``readers.per_node: 0``,
    chosen) a reader per rank on a colocated node - every rank locates and publishes its
    own records, nobody waits for another rank's reader - and one on a dedicated node,
    whose reader does not train (docs/service.md, "Readers per node")."""
    if readers_per_node == 0:
        return node_size if node_mode == "colocated" else 1
    return min(readers_per_node, node_size)


def _split_reader_groups(world: MPI.Comm, node: MPI.Comm, node_index: int, groups: int
                         ) -> tuple[MPI.Comm, int, int]:
    """Collective over ``world``: ``(group, group_index, n_groups)`` with this rank's node
    cut into ``groups`` (1 .. the node's size) runs of consecutive local ranks
    (:func:`simulated_node_bounds`). Groups are numbered over the world node by node, then by their
    first local rank, so that ordering by (group, local rank) keeps the world's node-major
    order that the node-level plans need."""
    local, size = node.Get_rank(), node.Get_size()
    bounds = simulated_node_bounds(size, groups)
    mine = next(i for i, (lo, hi) in enumerate(bounds) if lo <= local < hi)
    group = node.Split(color=mine, key=local)
    every = sorted(set(world.allgather((node_index, mine))))
    return group, every.index((node_index, mine)), len(every)


def _device_index(node: MPI.Comm, is_worker: bool) -> int:
    """Collective over ``node``: this rank's index among the node's workers in local-rank
    order (-1 for a rank that does not train)."""
    workers = node.allgather(is_worker)
    return sum(workers[:node.Get_rank()]) if is_worker else -1


def _local_roles(node_mode: str, local_rank: int, local_size: int
                 ) -> tuple[bool, bool, tuple[int, ...]]:
    """``(is_reader, is_worker, node_workers)`` of a local rank in a node run in ``node_mode``.

    Local rank 0 reads; in colocated mode every rank trains, in dedicated mode only the
    others do (``node_workers`` are local ranks).
    """
    is_reader = local_rank == 0
    is_worker = node_mode == "colocated" or not is_reader
    node_workers = tuple(range(0 if node_mode == "colocated" else 1, local_size))
    return is_reader, is_worker, node_workers


def _split_role(world: MPI.Comm, has_role: bool, node_major: int) -> tuple[MPI.Comm, int]:
    """Collective: the communicator of the ranks that have a role, and how many there are.

    ``MPI.COMM_NULL`` on the ranks without it. Ranks are ordered node by node (then by local
    rank, ``node_major``): the node-level strategies give each node a run of consecutive
    consumers, so a node's workers must hold consecutive worker ranks. Where nodes are
    blocks of consecutive world ranks (the usual mapping) this is world-rank order; a
    round-robin mapping (Open MPI --map-by node, srun --distribution=cyclic) interleaves
    the nodes' world ranks.
    """
    from mpi4py import MPI

    role = world.Split(color=0 if has_role else MPI.UNDEFINED, key=node_major)
    return role, world.allreduce(1 if has_role else 0, op=MPI.SUM)


def _launcher_or_none() -> LauncherInfo | None:
    """The detected launcher; ``None`` (with a warning) when its variables are malformed.

    A malformed launcher environment is only informative here, so it must not fail the job.
    """
    try:
        return detect_launcher()
    except LmdbioError as exc:
        log.warning("ignoring launcher environment: %s", exc)
        return None


def _free(comm: MPI.Comm | None) -> None:
    from mpi4py import MPI

    if comm is not None and comm != MPI.COMM_NULL:
        comm.Free()


@dataclass(eq=False)
class Topology:
    """This rank's place in the job; built by the collective :meth:`build`.

    Communicators (``node``, ``readers``, ``workers``) are owned by the object: free them
    with :meth:`close` (collective over the world communicator, like every ``Comm.Free``).
    Fields about the whole node (``node_world_ranks``, ``node_readers``, ``node_workers``)
    are the same on every rank of a node; ``node_readers`` / ``node_workers`` are local ranks.
    """

    world: MPI.Comm
    node: MPI.Comm
    readers: MPI.Comm
    workers: MPI.Comm
    requested_mode: str
    mode: str
    rank: int
    size: int
    node_index: int
    n_nodes: int
    local_rank: int
    local_size: int
    is_reader: bool
    is_worker: bool
    reader_rank: int
    n_readers: int
    worker_rank: int
    n_workers: int
    #: reader groups (nodes of one reader each) its host or simulated node was cut into
    readers_per_node: int
    #: the job's nodes before any reader groups were cut (hosts, or simulated nodes): what
    #: a report calls its nodes (``n_nodes`` counts the node rings)
    host_nodes: int
    #: this rank's node before reader groups were cut, numbered as ``node_index`` numbers
    #: nodes (the host, or the simulated node)
    host_node: int
    #: whether nodes may share a host (simulated nodes, or reader groups asked for:
    #: ``readers_per_node`` other than 1): then one rank per host and file pins the
    #: snapshot. From the arguments every rank agreed on, not from this node's own split,
    #: so that every rank takes part in the exchange it decides alike
    shares_host: bool
    simulated: bool
    hostname: str
    node_world_ranks: tuple[int, ...]
    node_readers: tuple[int, ...]
    node_workers: tuple[int, ...]
    host_size: int
    #: this worker's index among the workers of its node before reader groups were cut
    #: (the host's, or the simulated node's): what picks its GPU; -1 for non-workers. In
    #: dedicated mode a reader holds no GPU, so the first worker gets device 0
    device_index: int = -1
    launcher: LauncherInfo | None = None
    _closed: bool = field(default=False, repr=False)

    # ------------------------------------------------------------------ construction
    @classmethod
    def build(
        cls,
        comm: MPI.Comm | None = None,
        simulate_nodes: int | None = 0,
        readers_per_node: int = 1,
        mode: str = "dedicated",
        simulate_nodes_at: str | None = None,
    ) -> Topology:
        """Collective over ``comm`` (default ``MPI.COMM_WORLD``): split it into nodes and roles.

        ``simulate_nodes``: 0 = real nodes (shared-memory domains); K > 0 = K simulated nodes
        of consecutive ranks; ``None`` = read ``LMDBIO_SIMULATE_NODES`` (exported by
        ``lmdbio launch --simulate-nodes``), 0 when unset. ``readers_per_node``: reader
        groups per node (one reader each; clamped to the node's size; 0 chooses:
        :func:`reader_groups`). Every argument must
        be the same on every rank; a wrong value raises
        :class:`~lmdbio.errors.ConfigError` on every rank (a ``simulate_nodes`` larger than
        the world at ``simulate_nodes_at``, where the job configuration wrote
        ``topology.simulate_nodes``: :meth:`lmdbio.config.ConfigOrigin.location`).
        """
        world = _world_comm(comm)
        rank, size = world.Get_rank(), world.Get_size()
        simulate_nodes, readers_per_node, mode = _agreed_params(
            world, simulate_nodes, readers_per_node, mode, simulate_nodes_at
        )
        whole, node_index, n_nodes, host_size = _split_nodes(world, simulate_nodes)
        host_node, host_nodes = node_index, n_nodes
        whole_mode = auto_mode(whole.Get_size()) if mode == "auto" else mode
        groups = reader_groups(readers_per_node, whole_mode, whole.Get_size())
        node = whole
        if readers_per_node != 1:  # agreed on every rank: all take part (a collective)
            node, node_index, n_nodes = _split_reader_groups(world, whole, node_index, groups)
        local_rank, local_size = node.Get_rank(), node.Get_size()
        node_mode = _node_mode(whole_mode, node_index, local_rank, local_size, size)
        is_reader, is_worker, node_workers = _local_roles(node_mode, local_rank, local_size)
        device_index = _device_index(whole, is_worker)
        if whole is not node:
            whole.Free()
        node_major = node_index * size + local_rank
        readers, n_readers = _split_role(world, is_reader, node_major)
        workers, n_workers = _split_role(world, is_worker, node_major)

        return cls(
            world=world,
            node=node,
            readers=readers,
            workers=workers,
            requested_mode=mode,
            mode=node_mode,
            rank=rank,
            size=size,
            node_index=node_index,
            n_nodes=n_nodes,
            local_rank=local_rank,
            local_size=local_size,
            is_reader=is_reader,
            is_worker=is_worker,
            reader_rank=readers.Get_rank() if is_reader else -1,
            n_readers=n_readers,
            worker_rank=workers.Get_rank() if is_worker else -1,
            n_workers=n_workers,
            readers_per_node=groups,
            host_nodes=host_nodes,
            host_node=host_node,
            shares_host=bool(simulate_nodes) or readers_per_node != 1,
            simulated=bool(simulate_nodes),
            hostname=socket.gethostname(),
            node_world_ranks=tuple(node.allgather(rank)),
            node_readers=(0,),
            node_workers=node_workers,
            host_size=host_size,
            device_index=device_index,
            launcher=_launcher_or_none(),
        )

    # ------------------------------------------------------------------ queries

    @property
    def closed(self) -> bool:
        return self._closed

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary (no communicators) for logs, tests and ``lmdbio run``."""
        return {
            "rank": self.rank,
            "size": self.size,
            "hostname": self.hostname,
            "node_index": self.node_index,
            "n_nodes": self.n_nodes,
            "simulated": self.simulated,
            "local_rank": self.local_rank,
            "local_size": self.local_size,
            "host_size": self.host_size,
            "requested_mode": self.requested_mode,
            "mode": self.mode,
            "readers_per_node": self.readers_per_node,
            "host_nodes": self.host_nodes,
            "host_node": self.host_node,
            "is_reader": self.is_reader,
            "is_worker": self.is_worker,
            "reader_rank": self.reader_rank,
            "n_readers": self.n_readers,
            "worker_rank": self.worker_rank,
            "n_workers": self.n_workers,
            "device_index": self.device_index,
            "node_world_ranks": list(self.node_world_ranks),
            "node_readers": list(self.node_readers),
            "node_workers": list(self.node_workers),
            "launcher": None if self.launcher is None else self.launcher.to_dict(),
        }

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Free the node, readers and workers communicators (collective; safe to repeat).

        The world communicator is the caller's and is left alone.
        """
        if self._closed:
            return
        self._closed = True
        for comm in (self.workers, self.readers, self.node):
            _free(comm)
        from mpi4py import MPI

        self.node = self.readers = self.workers = MPI.COMM_NULL

    def __enter__(self) -> Topology:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
