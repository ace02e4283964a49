"""What a loader measures: its worker's counters, and the pace of trainer and assembly.

:class:`LoaderMetrics` is what :meth:`loaders.loader.Loader.summary` reports;
:class:`Pace` is what the look-ahead (:mod:`loaders.prefetch`) decides with: whether
assembling the next batch on the decoding thread hides more than the hand-off costs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

#: weight of the newest sample in the running means of :class:`Pace`
EWMA_WEIGHT = 0.25


@dataclass
class LoaderMetrics:
    """What a worker measured: batches, samples, bytes, time waiting for data.

    ``wait_seconds`` is the time spent receiving batches (blocked on the node's ring, then
    validating the slot and verifying its checksum); ``blocked_seconds`` the part of it
    spent blocked on the ring alone, with nothing to do but wait for the reader.
    ``epochs_decoded_ahead`` counts epochs whose first slot was decoded during the previous
    epoch's last step (a dedicated reader ahead across the epoch boundary).
    """

    batches: int = 0
    samples: int = 0
    bytes: int = 0
    wait_seconds: float = 0.0
    blocked_seconds: float = 0.0
    decode_seconds: float = 0.0
    skipped: int = 0
    substituted: int = 0
    epochs_decoded_ahead: int = 0
    started: float = field(default_factory=time.perf_counter)

    def as_dict(self) -> dict[str, float]:
        elapsed = time.perf_counter() - self.started
        return {
            "batches": self.batches, "samples": self.samples, "bytes": self.bytes,
            "seconds": elapsed, "wait_seconds": self.wait_seconds,
            "blocked_seconds": self.blocked_seconds,
            "decode_seconds": self.decode_seconds,
            "samples_per_second": self.samples / elapsed if elapsed else 0.0,
            "megabytes_per_second": self.bytes / elapsed / 1e6 if elapsed else 0.0,
            "stall_fraction": self.wait_seconds / elapsed if elapsed else 0.0,
            "blocked_fraction": self.blocked_seconds / elapsed if elapsed else 0.0,
            "skipped_records": self.skipped, "substituted_records": self.substituted,
            "epochs_decoded_ahead": self.epochs_decoded_ahead,
        }

    def progress(self, epoch: int, iteration: int) -> str:
        """The line printed every ``metrics.every`` batches: rates and stall so far."""
        m = self.as_dict()
        return (f"[lmdbio] epoch {epoch} iteration {iteration}: "
                f"{m['samples_per_second']:.0f} samples/s, "
                f"{m['megabytes_per_second']:.1f} MB/s, "
                f"stall {100 * m['stall_fraction']:.1f}%")


@dataclass
class Pace:
    """Running means (weight :data:`EWMA_WEIGHT`) of the trainer's time between two
    batches and of the time one batch takes to assemble."""

    step_s: float = 0.0
    assemble_s: float = 0.0

    def stepped(self, seconds: float) -> None:
        """The trainer took ``seconds`` before asking for the next batch."""
        self.step_s += EWMA_WEIGHT * (seconds - self.step_s)

    def assembled(self, seconds: float) -> None:
        """A batch took ``seconds`` to assemble."""
        self.assemble_s += EWMA_WEIGHT * (seconds - self.assemble_s)

    def overlap_pays(self) -> bool:
        """Whether the trainer's step is at least as long as an assembly (measured ones):
        then assembling the next batch on another thread overlaps the two."""
        return self.step_s >= self.assemble_s > 0
