"""Read strategies, one module each, and the registry that names them.

| name | who reads | how it finds its records |
|---|---|---|
| ``naive-stride`` | every rank | walks every record, keeps ``i % ranks == rank`` (Caffe) |
| ``naive-contig`` | every rank | contiguous shard, reached by walking from the start (DALI) |
| ``lmm`` | one reader per node | walks past the other readers' records (LMDBIO-LMM) |
| ``dm-serial`` | one reader per node | cursor handed along the chain of readers (LMDBIO-DM) |
| ``dm-spec`` | one reader per node | dm-serial + speculative prefetch of its page range |
| ``indexed`` | one reader per node | leaf directory: exact positions, shuffles |

:data:`STRATEGIES` is the registry: the names ``readers.strategy`` and ``--strategy``
accept, and through each class's attributes (``summary``, ``shared``, ``shuffles``,
``chained``...) what each can do. The job configuration, its generated reference and the
commands read it; a new strategy is a :class:`ReadStrategy` subclass added here.
"""

from __future__ import annotations

from lmdbio.errors import ConfigError
from lmdbio.plan.strategies.base import IterationStats, ReaderContext, ReadStrategy, Timer
from lmdbio.plan.strategies.dm import DmSerial, DmSpec
from lmdbio.plan.strategies.indexed import Indexed, build_leaf_directory, sidecar_path
from lmdbio.plan.strategies.lmm import Lmm
from lmdbio.plan.strategies.naive import NaiveContig, NaiveStride
from lmdbio.plan.strategies.spec_estimate import PageRangeEstimator, ValuePageEstimator

STRATEGIES: dict[str, type[ReadStrategy]] = {
    cls.name: cls for cls in (NaiveStride, NaiveContig, Lmm, DmSerial, DmSpec, Indexed)
}


def node_level() -> tuple[str, ...]:
    """The registered strategies in which one reader per node reads for the node's workers
    (the classes that are ``shared``), in registry order: the ones node rings, ring codecs
    and the node-level options need. The others have every rank read for itself."""
    return tuple(name for name, cls in STRATEGIES.items() if cls.shared)


def strategy_class(name: str) -> type[ReadStrategy]:
    """The strategy registered as ``name``."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ConfigError(f"readers.strategy: unknown strategy {name!r}; known: "
                          f"{', '.join(STRATEGIES)}") from None


__all__ = [
    "STRATEGIES",
    "DmSerial",
    "DmSpec",
    "Indexed",
    "IterationStats",
    "Lmm",
    "NaiveContig",
    "NaiveStride",
    "PageRangeEstimator",
    "ReadStrategy",
    "ReaderContext",
    "Timer",
    "ValuePageEstimator",
    "build_leaf_directory",
    "node_level",
    "sidecar_path",
    "strategy_class",
]
