"""A worker's look-ahead: slots received and decoded while the trainer computes.

:class:`Prefetcher` is the worker's side of the node ring. It receives the slot that
carries the batch asked for, holds the batches decoded from it, and looks ahead: when the
next slot has already arrived, it decodes it on one background thread (the decoding
kernels release the GIL) while the trainer works on the batch just yielded; at an epoch's
last batch, it takes the next epoch's first slot the same way. Receiving and releasing
slots stay on the trainer's thread (MPI and the ring are not touched from the thread).

Its interface is small: :meth:`~Prefetcher.begin_epoch`, :meth:`~Prefetcher.take`,
:meth:`~Prefetcher.look_ahead` and :meth:`~Prefetcher.look_ahead_epoch` while an epoch is
delivered; :meth:`~Prefetcher.drain` when the trainer leaves it early,
:meth:`~Prefetcher.close` or :meth:`~Prefetcher.abandon` to stop.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from lmdbio.errors import LmdbioError
from loaders.assemble import Batch, BatchAssembler, Made, Taken
from loaders.metrics import LoaderMetrics, Pace
from loaders.schedule import EpochSlots, whole_first_slot_batches

if TYPE_CHECKING:  # pragma: no cover
    from lmdbio.reader import ReadSession
    from lmdbio.slot_receiver import Delivered

log = logging.getLogger("lmdbio.loader")

#: a batch of the slot being delivered: as the assembler made it, being assembled on the
#: decoding thread, or None once delivered (no reference is kept to it)
Pending = Made | Future[Taken] | None


def wait_quietly(future: Future[Any] | None) -> None:
    """Wait for a decoding whose result is not used (its memory is the slot's)."""
    if future is None:
        return
    try:
        future.result()
    except Exception as exc:  # a slot laid out otherwise, or a bad record: unused
        log.debug("dropping a slot decoded ahead: %s", exc)


def drop_received(got: Delivered, future: Future[Any] | None) -> None:
    """Give a received slot back to the ring unused, once the decoding thread (if it was
    decoding it) is done with its memory."""
    try:
        wait_quietly(future)
    finally:
        got.release()


class Prefetcher:
    """Receives this worker's slots and decodes them ahead (see the module docstring).

    ``on_host``: a CPU worker (device workers decode in line: nothing is decoded ahead).
    ``across_epochs``: the node has a dedicated reader, which runs ahead across epochs, so
    the next epoch's first slot may be waiting at an epoch's last batch.
    """

    def __init__(self, session: ReadSession, assembler: BatchAssembler, metrics: LoaderMetrics,
                 pace: Pace, *, rank: int, on_host: bool, across_epochs: bool) -> None:
        self.session, self.assembler, self.metrics, self.pace = session, assembler, metrics, pace
        self.rank, self.on_host, self.across_epochs = rank, on_host, across_epochs
        self.epoch = 0
        self.slots: EpochSlots | None = None
        #: slots received in the current epoch (a worker leaving it drains the rest)
        self.received = 0
        #: (first iteration, batches) of the slot being delivered
        self.decoded: tuple[int, list[Pending]] | None = None
        #: the slot whose batches are assembled as they are asked for: released once the
        #: last one is (:meth:`set_decoded`)
        self.held: Delivered | None = None
        #: (iteration, received slot, future of its decoding) while a slot decodes ahead
        self.ahead: tuple[int, Delivered | None, Future[list[Pending]] | None] | None = None
        #: (slot, future of its decoding or None) of the next epoch's first slot
        self.next_epoch_slot: tuple[Delivered, Future[list[Pending]] | None] | None = None
        self.pool: ThreadPoolExecutor | None = None  # started with the first look-ahead

    def begin_epoch(self, epoch: int, slots: EpochSlots) -> None:
        """The batches of ``slots`` of ``epoch`` are asked for next."""
        self.epoch, self.slots = epoch, slots
        self.received = 0
        self.decoded = None

    # ----------------------------------------------------------------- receiving
    def receive(self, defer_verify: bool = False, defer_values: bool = False
                ) -> Delivered | None:
        """The next slot from the session, timed (``wait_seconds``, ``blocked_seconds``).
        ``defer_verify``: the checksum (and the overflow page headers of records delivered
        by reference) are checked on the decoding thread; ``defer_values``: the headers
        are checked later (the whole slot, or each fused batch its own)."""
        t0 = time.perf_counter()
        with self.session.stages.span("receive"):
            got = self.session.receive(timeout=self.session.run_plan.timeout,
                                       defer_verify=defer_verify,
                                       defer_value_check=defer_verify or defer_values)
        self.metrics.wait_seconds += time.perf_counter() - t0
        ring = self.session.ring
        if ring is not None:
            self.metrics.blocked_seconds = ring.stats.worker_wait_s
        return got

    def batches(self, got: Delivered, first: int) -> list[Pending]:
        """The current epoch's batches of the slot ``got``, from iteration ``first``."""
        plan = self.session.plan
        assert self.slots is not None and plan is not None  # only while an epoch is delivered
        # the list becomes the prefetcher's: futures and None take its batches' places
        return cast("list[Pending]", self.assembler.make_batches(
            got, first, self.epoch, plan, self.slots.batches_in_slot_of(first)))

    def next_epoch_batches(self, got: Delivered, epoch: int) -> list[Pending]:
        """The batches of the first slot of ``epoch`` (not the current one), as the epoch
        run whole lays it out."""
        plan = self.session.plan_for(epoch)
        return cast("list[Pending]", self.assembler.make_batches(
            got, 0, epoch, plan, self.whole_first_slot(epoch)))

    def whole_first_slot(self, epoch: int) -> int:
        """Batches in the first slot of ``epoch`` run whole (no stop inside it): what its
        first slot decoded ahead holds (:meth:`look_ahead_epoch`)."""
        return whole_first_slot_batches(self.session.plan_for(epoch).iterations,
                                        self.session.batches_per_slot)

    def decoding_thread(self) -> ThreadPoolExecutor:
        """The one decoding thread (an executor), started on first use."""
        if self.pool is None:
            self.pool = ThreadPoolExecutor(1, thread_name_prefix="lmdbio-decode")
        return self.pool

    def ahead_pays(self) -> bool:
        """Whether to assemble the next batch on the decoding thread while the trainer
        works on this one. It pays when the trainer's step is at least as long as an
        assembly (the two then overlap); for a faster trainer, the hand-off between the two
        threads (queue, wake-ups, the GIL) costs more than it hides: measured on the 2-core
        VM, one process, CIFAR-like batches of 64 and no step, 6.3-7.5 us of CPU per sample
        with every batch assembled ahead against 4.8-5.3 us assembled in line."""
        return self.on_host and self.pace.overlap_pays()

    # ----------------------------------------------------------------- looking ahead
    def has(self, it: int) -> bool:
        """Whether batch ``it`` is among those decoded from the last slot received."""
        d = self.decoded
        return d is not None and d[0] <= it < d[0] + len(d[1])

    def look_ahead(self, it: int) -> None:
        """If the slot of batch ``it`` has already arrived, start decoding it on the
        decoding thread, so that it decodes while the trainer computes on the batch just
        yielded (nothing to do when ``it`` came in the slot already decoded). A slot not
        there yet is received and decoded when asked for. Device workers decode in line.
        """
        if not self.on_host or self.has(it) or not self.session.poll():
            return
        if self.assembler.fuses_datums and not self.ahead_pays():
            # its batches are assembled one by one as asked for: the slot's own work
            # (checks, keys) is little, and a hand-off to the thread for it costs more
            # than it hides unless the trainer's step is long (one process, CIFAR-like:
            # the trainer's thread waited on it 10% of the time)
            return
        got = self.receive(defer_verify=True)  # verified on the decoding thread
        if got is None:  # the reader stopped: said when this batch is asked for
            self.ahead = (it, None, None)
            return
        self.ahead = (it, got, self.decoding_thread().submit(self.batches, got, it))

    def look_ahead_epoch(self) -> None:
        """At an epoch's last batch: when the node's dedicated reader has already published
        the next epoch's first slot, receive it now and, if it is what the usual
        ``set_epoch(epoch + 1)`` loop asks for next (that epoch, from its first batch),
        start decoding it on the decoding thread. Otherwise every new epoch began with a
        slot decoded inside the trainer's wait: with 600 ImageNet-like records and 4
        workers of 32, one batch in 5, 60% of the workers' time in the loader.

        A slot of another epoch (the trainer chose one; the reader, running the same script,
        did too) is kept undecoded and decoded when asked for.
        """
        if (not (self.on_host and self.across_epochs) or self.next_epoch_slot is not None
                or not self.session.poll()):
            return
        got = self.receive(defer_verify=True)
        if got is None:  # the reader stopped: the next receive says so again
            return
        future = None
        if got.epoch == self.epoch + 1 and got.iteration == 0:
            future = self.decoding_thread().submit(self.next_epoch_batches, got, got.epoch)
        self.next_epoch_slot = (got, future)

    # ----------------------------------------------------------------- taking
    def take(self, it: int) -> tuple[Batch, int]:
        """Batch ``it`` as the assembler made it, ``(Batch, payload bytes)``: from the slot
        already decoded, the next epoch's first slot, the one decoded ahead, or a slot
        received and decoded now. Raises the error of a batch whose records failed."""
        if not self.has(it) and self.next_epoch_slot is not None:
            self.take_next_epoch_slot(it)
        if not self.has(it):
            self.take_slot(it)
        assert self.decoded is not None
        first, batches = self.decoded
        item = batches[it - first]
        batches[it - first] = None  # no reference is kept to a delivered batch
        if isinstance(item, Future):
            with self.session.stages.span("handoff"):
                item = item.result()
        elif isinstance(item, partial):
            item = item()
        if it == first + len(batches) - 1:
            self.forget_decoded()
        elif isinstance(nxt := batches[it + 1 - first], partial) and self.ahead_pays():
            # assemble the next batch while the trainer computes on this one
            batches[it + 1 - first] = self.decoding_thread().submit(nxt)
        if isinstance(item, Exception):  # this batch's records failed under on_error raise
            raise item
        assert isinstance(item, tuple)  # (Batch, payload bytes): each batch is taken once
        return item

    def take_next_epoch_slot(self, it: int) -> None:
        """Deliver the next epoch's first slot, received at the last epoch's end, from
        batch ``it``: decoded ahead where this epoch's first slot is laid out as the whole
        epoch's, decoded now otherwise (the epoch stops inside its first slot)."""
        assert self.next_epoch_slot is not None and self.slots is not None
        got, future = self.next_epoch_slot
        self.next_epoch_slot = None
        try:
            if (got.epoch, got.iteration) != (self.epoch, it):
                raise LmdbioError(
                    f"rank {self.rank}: the reader's next slot is epoch {got.epoch} "
                    f"iteration {got.iteration}, this worker asks for epoch {self.epoch} "
                    f"iteration {it}: every rank of the job must call set_epoch and "
                    "load_state_dict alike")
            if future is not None and \
                    self.slots.groups[0][1] == self.whole_first_slot(self.epoch):
                batches = future.result()
                self.metrics.epochs_decoded_ahead += 1
            else:
                wait_quietly(future)
                batches = self.batches(got, it)
        except BaseException:
            got.release()
            raise
        self.received += 1
        self.set_decoded(it, batches, got)

    def take_slot(self, it: int) -> None:
        """Deliver the slot that carries batch ``it``: the one decoded ahead, or the next
        one received and decoded now."""
        if self.ahead is None:
            got = self.receive(defer_values=self.assembler.fuses_datums)
            if got is None:
                raise LmdbioError(f"the reader stopped before epoch {self.epoch} "
                                  f"iteration {it}")
            try:
                batches = self.batches(got, it)
            except BaseException:
                got.release()
                raise
        else:
            ahead_it, got, future = self.ahead
            self.ahead = None
            if ahead_it != it:  # cannot happen: look-ahead is always for the next one
                raise LmdbioError(f"internal: batch {ahead_it} was decoded ahead, {it} "
                                  "asked for")
            if got is None:
                raise LmdbioError(f"the reader stopped before epoch {self.epoch} "
                                  f"iteration {it}")
            assert future is not None  # a slot received ahead is decoding
            try:
                with self.session.stages.span("handoff"):
                    batches = future.result()
            except BaseException:
                got.release()
                raise
        self.received += 1
        self.set_decoded(it, batches, got)

    def set_decoded(self, first: int, batches: list[Pending], got: Delivered) -> None:
        """The batches of the slot ``got`` just received, from iteration ``first``. A slot
        whose batches are assembled as they are asked for is held until its last one is;
        any other is released now."""
        self.forget_decoded()  # nothing is left of the slot before (a no-op but for drains)
        self.decoded = (first, batches)
        if any(isinstance(b, partial) for b in batches):
            self.held = got
        else:
            got.release()

    # ----------------------------------------------------------------- stopping
    def forget_decoded(self) -> None:
        """Drop what is left of the slot being delivered: wait for a batch assembling on
        the decoding thread (it reads the slot), then release the slot if it was held."""
        decoded, self.decoded = self.decoded, None
        if decoded is not None:
            for item in decoded[1]:
                if isinstance(item, Future):
                    wait_quietly(item)
        held, self.held = self.held, None
        if held is not None:
            held.release()

    def drain(self, published: int) -> None:
        """The trainer leaves the epoch: drop the slot being delivered and the one decoding
        ahead, then take (and drop) the rest of the ``published`` slots of the epoch from
        the ring, so that the reader and this worker stay in step."""
        self.forget_decoded()
        taken = 0  # a slot received for decoding ahead is already out of the ring
        if self.ahead is not None:
            _, got, future = self.ahead
            self.ahead = None
            if got is not None:
                taken = 1
                drop_received(got, future)
        for _ in range(max(published - self.received - taken, 0)):
            got = self.session.receive(timeout=self.session.run_plan.timeout)
            if got is not None:
                got.release()

    def drop_next_epoch_slot(self) -> None:
        """Give back a next epoch's slot nobody asked for (the job ends after the epoch)."""
        if self.next_epoch_slot is not None:
            got, future = self.next_epoch_slot
            self.next_epoch_slot = None
            drop_received(got, future)

    def close(self) -> None:
        """Release every slot still held and stop the decoding thread (collective close)."""
        self.forget_decoded()
        self.drop_next_epoch_slot()
        if self.pool is not None:
            self.pool.shutdown(wait=True)
            self.pool = None

    def abandon(self) -> None:
        """Stop the decoding thread without waiting for it (after an error: local abort)."""
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None
