"""Which stores write a large float32 batch: ordinary ones, or streaming (non-temporal) ones.

A float32 batch too large to stay in the cache can be written with streaming stores, which
skip reading every output line before writing it (read for ownership) and do not evict the
rest of the cache. Both kinds write the same values; which is faster depends on the host:

* on the 2-core VM's earlier host, streaming stores halved the CPU per ImageNet-like image
  (87 -> 45 µs, ``docs/findings/peers-2026-11-27b.md``);
* on its host of 2026-11-28 (AMD EPYC, 32 MB last-level cache) ordinary stores were faster
  in the loader: 16 against 19-20 µs an image in one process, though the store loop alone,
  on a source already in the cache, favoured streaming stores (23 against 27 ps a byte;
  ``docs/findings/peers-2026-11-28c.md``).

Timing the loader's own first batches could not tell them apart: those batches also fault
the database's pages into the process for the first time (and, on a cold cache, read them),
which swamps the difference; a choice made that way flipped between runs. So the kind is a
setting, ``LMDBIO_STREAMING_STORES``:

* ``large`` (the default): streaming stores for batches of :data:`MIN_BYTES` and more, the
  measured winner where the streaming kernels were written and likely where many workers
  share a host's cache;
* ``never``: ordinary stores always (hosts like the one above);
* ``always``: streaming stores for every batch (tests, benchmarks).
"""

from __future__ import annotations

import os
from typing import Literal, get_args

#: batches at least this large take streaming stores by default: larger than a core's L2
#: cache, and with several workers per host larger than their share of the last-level cache.
#: Smaller ones keep ordinary stores: one process, CIFAR-like batches of 64 (786 KB),
#: streaming them took 3.9 against 3.0 µs of CPU a sample (2-core VM)
MIN_BYTES = 8 << 20
#: the environment variable that sets the policy
ENV = "LMDBIO_STREAMING_STORES"

Policy = Literal["large", "always", "never"]
POLICIES: tuple[Policy, ...] = get_args(Policy)


class StoreChoice:
    """The store kind of the float32 batches this process writes, under ``policy`` (see the
    module docstring)."""

    def __init__(self, policy: Policy = "large") -> None:
        if policy not in POLICIES:
            raise ValueError(f"{ENV}: expected one of {', '.join(POLICIES)}, got {policy!r}")
        self.policy = policy

    def streams(self, nbytes: int) -> bool:
        """Whether a batch of ``nbytes`` is written with streaming stores."""
        if self.policy == "large":
            return nbytes >= MIN_BYTES
        return self.policy == "always"


def policy_from_env() -> str:
    """What ``LMDBIO_STREAMING_STORES`` says, normalised (``large`` when unset); checked by
    :class:`StoreChoice`."""
    return os.environ.get(ENV, "large").strip().lower() or "large"


#: this process's choice (the loader's kernels ask it for every float32 batch they write)
STORES = StoreChoice(policy_from_env())  # type: ignore[arg-type]


def set_policy(policy: Policy) -> StoreChoice:
    """Set this process's policy (benchmarks; tests patch :data:`STORES`); returns it."""
    global STORES
    STORES = StoreChoice(policy)
    return STORES


def streams(nbytes: int) -> bool:
    """Whether this process writes a float32 batch of ``nbytes`` with streaming stores."""
    return STORES.streams(nbytes)
