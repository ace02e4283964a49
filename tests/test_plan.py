"""Epoch plans: exactly-once coverage, equal batch counts, determinism."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdbio.plan import job_epochs, plan_epoch


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 500), consumers=st.integers(1, 9), batch=st.integers(1, 40),
       last=st.sampled_from(["pad", "drop", "partial"]),
       shuffle=st.sampled_from(["none", "global", "block"]), seed=st.integers(0, 3),
       epoch=st.integers(0, 3), scheme=st.sampled_from(["blocked", "stride", "shard"]))
def test_coverage_and_equal_batches(n, consumers, batch, last, shuffle, seed, epoch, scheme):
    leaf_counts = np.random.default_rng(n).integers(1, 7, size=max(n, 1))
    first = np.concatenate([[0], np.cumsum(leaf_counts)])
    first = first[first <= n]
    if first[-1] != n:
        first = np.append(first, n)
    plan = plan_epoch(n, consumers, batch, last, shuffle, seed, epoch, leaf_first=first,
                      block_leaves=2, window=16, scheme=scheme)
    assert sorted(plan.order.tolist()) == list(range(n))
    per = [plan.consumer_records(c) for c in range(consumers)]
    pads = [np.concatenate([plan.padding(i, c) for i in range(plan.iterations)] or
                           [np.empty(0, bool)]) for c in range(consumers)]
    delivered = np.concatenate(per) if per else np.empty(0)
    real = np.concatenate([p[~m] for p, m in zip(per, pads, strict=True)])
    counts = np.bincount(real.astype(np.int64), minlength=n) if n else np.empty(0)
    if last == "drop":
        assert set(real.tolist()).isdisjoint(plan.dropped.tolist())
        assert (counts <= 1).all() and real.size + plan.dropped.size == n
        assert not any(m.any() for m in pads), "drop never pads"
        assert all(p.size == plan.iterations * batch for p in per)
    elif last == "pad":
        assert (counts == 1).all()
        assert all(p.size == plan.iterations * batch for p in per)
        assert delivered.size == plan.iterations * batch * consumers
    else:
        assert (counts == 1).all() and delivered.size == n
        for i in range(plan.iterations):
            row = [plan.records(i, c).size for c in range(consumers)]
            assert max(row) <= batch
            if scheme == "blocked":
                assert max(row) - min(row) <= 1
    for i in range(plan.iterations):  # a node's records and padding, consumer after consumer
        for first, count in ((0, consumers), (consumers // 2, consumers - consumers // 2)):
            cs = range(first, first + count)
            np.testing.assert_array_equal(
                plan.group_records(i, first, count),
                np.concatenate([plan.records(i, c) for c in cs] or [np.empty(0, np.int64)]))
            np.testing.assert_array_equal(
                plan.group_padding(i, first, count),
                np.concatenate([plan.padding(i, c) for c in cs] or [np.empty(0, bool)]))
    for i, k in ((0, plan.iterations), (plan.iterations // 2, 2)):  # several iterations
        k = min(k, plan.iterations - i)
        for first, count in ((0, consumers), (consumers // 2, consumers - consumers // 2)):
            cs, its = range(first, first + count), range(i, i + k)
            for worker_major, pairs in ((False, [(j, c) for j in its for c in cs]),
                                        (True, [(j, c) for c in cs for j in its])):
                ids, pad = plan.slot_records(i, k, first, count, worker_major=worker_major)
                np.testing.assert_array_equal(ids, np.concatenate(
                    [plan.records(j, c) for j, c in pairs] or [np.empty(0, np.int64)]))
                np.testing.assert_array_equal(pad, np.concatenate(
                    [plan.padding(j, c) for j, c in pairs] or [np.empty(0, bool)]))
    if scheme == "blocked" and shuffle == "none" and n:
        # a node's consumers read one contiguous range of records (mod n for padding)
        for i in range(plan.iterations):
            got = plan.group_records(i, 0, consumers)
            assert ((np.diff(got) - 1) % n == 0).all()
    if scheme == "stride" and shuffle == "none" and last != "drop":
        for c in range(consumers):
            own = plan.consumer_records(c)[~pads[c]]
            assert (own % consumers == c).all()


def test_deterministic_and_epoch_dependent():
    a = plan_epoch(1000, 4, 16, "pad", "global", seed=7, epoch=1)
    b = plan_epoch(1000, 4, 16, "pad", "global", seed=7, epoch=1)
    c = plan_epoch(1000, 4, 16, "pad", "global", seed=7, epoch=2)
    np.testing.assert_array_equal(a.order, b.order)
    assert not np.array_equal(a.order, c.order)


def test_block_order_keeps_locality():
    first = np.arange(0, 10_001, 10)  # 1000 leaves of 10 records
    plan = plan_epoch(10_000, 2, 50, "drop", "block", seed=1, leaf_first=first,
                      block_leaves=8, window=64)
    jumps = np.abs(np.diff(plan.order))
    assert np.median(jumps) < 80  # mostly within a block of 80 records
    assert not np.array_equal(plan.order, np.arange(10_000))


def test_bad_arguments():
    with pytest.raises(ValueError, match="last must be"):
        plan_epoch(10, 1, 1, last="wrap")
    with pytest.raises(ValueError, match="leaf directory"):
        plan_epoch(10, 1, 1, shuffle="block")


def test_group_records_never_let_a_caller_write_into_the_plan():
    plan = plan_epoch(100, 4, 5, "pad", "global", 0, 0)
    got = plan.group_records(0, 0, 4)
    with pytest.raises(ValueError):
        got[0] = -1
    with pytest.raises(ValueError):
        plan.group_padding(0, 0, 4)[0] = True
    for worker_major in (False, True):
        ids, pad = plan.slot_records(0, 3, 1, 2, worker_major=worker_major)
        with pytest.raises(ValueError):
            ids[0] = -1
        with pytest.raises(ValueError):
            pad[0] = True


def test_slot_groups_and_the_automatic_slot_size():
    from lmdbio.plan.epoch import slot_groups
    from lmdbio.ring_setup import choose_batches_per_slot

    assert slot_groups(0, 7, 3) == [(0, 3), (3, 3), (6, 1)]
    # a resumed epoch: the rest of the slot it resumes in, then the epoch's slots
    assert slot_groups(4, 7, 3) == [(4, 2), (6, 1)]
    assert slot_groups(3, 8, 3) == [(3, 3), (6, 2)]
    assert slot_groups(8, 20, 4) == [(8, 4), (12, 4), (16, 4)]
    assert slot_groups(5, 5, 2) == []
    assert slot_groups(0, 3, 1) == [(0, 1), (1, 1), (2, 1)]
    # small records are grouped up to 1,024 per worker or 4 MiB; large ones are not
    assert choose_batches_per_slot(128, 128 * 3085) == 8
    assert choose_batches_per_slot(8, 8 * 100) == 16
    assert choose_batches_per_slot(32, 32 * 150_541) == 1
    assert choose_batches_per_slot(64, 2 << 20) == 2
    assert choose_batches_per_slot(4096, 10) == 1
    # slots of spans: bounded by the workers' float32 output (48 MiB each), not the payload
    assert choose_batches_per_slot(32, 32 * 150_541, spans=True) == 2  # 19.3 MB per batch
    assert choose_batches_per_slot(32, 4 * 32 * 150_541, spans=True, consumers=4) == 2
    assert choose_batches_per_slot(256, 256 * 150_541, spans=True) == 1
    # CIFAR-sized spans: 4,096 records per worker, within the decoded-output cap
    assert choose_batches_per_slot(32, 32 * 3085, spans=True) == 64  # at most 64 batches
    assert choose_batches_per_slot(64, 64 * 4096, spans=True) == 48  # 48 MiB decoded
    assert choose_batches_per_slot(128, 128 * 256, spans=True) == 32  # 4,096 records
    assert choose_batches_per_slot(128, 128 * 3085, spans=True) == 31  # 48 MiB decoded
    assert choose_batches_per_slot(256, 256 * 12_000, spans=True) == 4  # 12 MiB decoded
    assert choose_batches_per_slot(8, 8 * 100, spans=True) == 64  # at most 64 batches
    # workers that assemble batch by batch: 16,384 records per worker, at most 64 MiB of
    # the file per worker (what a cold file's next slot asks the kernel for)
    assert choose_batches_per_slot(64, 64 * 4096, spans=True, batchwise=True) == 256
    assert choose_batches_per_slot(64, 64 * 4125, spans=True, batchwise=True) == 254  # 64 MiB
    assert choose_batches_per_slot(32, 4 * 32 * 150_541, spans=True, consumers=4,
                                   batchwise=True) == 13  # 64 MiB: 416 records of 150 KB
    assert choose_batches_per_slot(8, 8 * 100, spans=True, batchwise=True) == 1024  # at most
    assert choose_batches_per_slot(32, 32 * 150_541, batchwise=True) == 1  # copies: as before


def test_batch_capacity_bounds_any_batch_even_beyond_the_database():
    from lmdbio.ring_setup import batch_capacity

    top = np.array([1, 5, 9])  # the largest value sizes, ascending
    assert batch_capacity(top, 2) == 14
    assert batch_capacity(top, 3) == 15
    assert batch_capacity(top, 5) == 15 + 2 * 9  # padding repeats records
    assert batch_capacity(np.empty(0, np.int64), 4) == 0


@pytest.mark.parametrize(("n", "consumers", "batch", "last", "group", "nodes"), [
    (100, 4, 3, "pad", 4, (2, 2)),
    (97, 4, 3, "drop", 3, (1, 3)),
    (50, 3, 2, "pad", 5, (3,)),
    (48, 4, 3, "partial", 4, (2, 2)),
    (203, 6, 4, "pad", 2, (2, 1, 3)),
])
def test_slot_groups_lay_each_nodes_slot_out_as_one_run(n, consumers, batch, last, group,
                                                        nodes):
    grouped = plan_epoch(n, consumers, batch, last, group=group, node_consumers=nodes)
    plain = plan_epoch(n, consumers, batch, last)
    assert grouped.group == group and grouped.iterations == plain.iterations
    # the same records, each as often, the same batch sizes and padding counts
    def real(p):
        return np.sort(np.concatenate([p.records(i, c)[~p.padding(i, c)]
                                       for i in range(p.iterations) for c in range(consumers)]))
    np.testing.assert_array_equal(real(grouped), real(plain))
    np.testing.assert_array_equal(grouped.sizes, plain.sizes)
    assert grouped.pad.sum() == plain.pad.sum()
    first = np.cumsum((0, *nodes))[:-1]
    for g in range(0, grouped.iterations, group):
        its = range(g, min(g + group, grouped.iterations))
        assert grouped.contiguous_slot(its[0], len(its))
        runs = []
        for c0, cn in zip(first.tolist(), nodes, strict=True):
            # a node's records of every iteration of the group, iteration after iteration,
            # are one run of positions; the nodes' runs follow each other
            # (unshuffled: a record's index is its position, modulo n for the padding)
            run = np.concatenate([grouped.group_records(i, c0, cn) for i in its])
            assert (np.diff(run) % n == 1).all(), (g, c0)
            runs.append(run)
        assert (np.diff(np.concatenate(runs)) % n == 1).all()
    if grouped.iterations > group:  # a slot across two groups is not one run
        assert not grouped.contiguous_slot(group - 1, 2)


@pytest.mark.parametrize(("n", "group", "stop"), [(400, 8, 5), (400, 8, 13), (203, 5, 3)])
def test_a_run_that_stops_inside_a_slot_group_splits_it_there(n, group, stop) -> None:
    """``split``: the slot group a run stops in is laid out as two, each node's records
    before the stop one run of the order, the nodes' runs one after the other (a reader
    walking to its records reads no other node's records nobody reads); the epoch still
    delivers every record once, and the groups before stay as they were."""
    consumers, batch, nodes = 4, 3, (2, 2)
    whole = plan_epoch(n, consumers, batch, group=group, node_consumers=nodes)
    cut = plan_epoch(n, consumers, batch, group=group, node_consumers=nodes, split=stop)
    assert cut.split == stop and cut.iterations == whole.iterations

    def real(p):
        return np.sort(np.concatenate([p.records(i, c)[~p.padding(i, c)]
                                       for i in range(p.iterations) for c in range(consumers)]))
    np.testing.assert_array_equal(real(cut), real(whole))
    start = stop // group * group
    np.testing.assert_array_equal(cut.table[:start], whole.table[:start])
    assert cut.contiguous_slot(start, stop - start)
    assert not cut.contiguous_slot(stop - 1, 2)  # across the cut
    runs = [np.concatenate([cut.group_records(i, c0, 2) for i in range(start, stop)])
            for c0 in (0, 2)]
    for run in runs:
        assert (np.diff(run) % n == 1).all()
    assert (np.diff(np.concatenate(runs)) % n == 1).all()
    # without the split, the stopped part of the group is not one run for the second node
    if stop - start < group:
        late = np.concatenate([whole.group_records(i, 0, 2) for i in range(start, stop)] +
                              [whole.group_records(i, 2, 2) for i in range(start, stop)])
        assert not (np.diff(late) % n == 1).all()
    # a stop at a group's boundary, or past the epoch, changes nothing
    at_boundary = plan_epoch(n, consumers, batch, group=group, node_consumers=nodes,
                             split=group)
    assert at_boundary.split == 0
    np.testing.assert_array_equal(at_boundary.table, whole.table)


def test_slot_groups_apply_to_full_batches_of_the_blocked_scheme_only():
    split = plan_epoch(49, 4, 3, "partial", group=4, node_consumers=(2, 2))
    assert split.group == 1  # the last batch is split: plain blocked order
    np.testing.assert_array_equal(split.table, plan_epoch(49, 4, 3, "partial").table)
    assert plan_epoch(48, 4, 3, scheme="stride", group=4, node_consumers=(2, 2)).group == 1
    assert plan_epoch(48, 4, 3, group=4).group == 1  # no node layout given
    assert not plan_epoch(48, 4, 3).contiguous_slot(0, 2)
    with pytest.raises(ValueError, match="add up"):
        plan_epoch(48, 4, 3, group=2, node_consumers=(1, 2))


@pytest.mark.parametrize(("sizes", "inline"), [
    ((1, 400), True),             # MNIST-like: small inline values
    ((1900, 2200), False),        # around LMDB's inline limit: some go to overflow pages
    ((2000, 2024), True),         # up to the largest inline node (8 + 7 + 2023 = 2038 B)
    ((2020, 2040), False),        # past it: the larger ones go to overflow pages
    ((3000, 3100), False),        # CIFAR-like: every value on its own overflow pages
])
def test_largest_values_reads_no_leaf_of_an_inline_tree_and_bounds_every_value(
        tmp_path, sizes, inline):
    """Without overflow pages the ring's capacity comes from the format's inline limit,
    with no page read; with them, from the exact largest values."""
    import lmdbio
    from bench.lmdbgen import random_items, write_db
    from lmdbio.ring_setup import largest_values

    items = random_items(300, sizes, seed=3, key_fmt="k%06d")
    write_db(tmp_path, items)
    real = np.sort([len(v) for _, v in items])
    with lmdbio.open(tmp_path, accounting=True, pin_snapshot=False) as db:
        limit = db.inline_value_limit()
        if inline is not None:
            assert (limit is not None) == inline
        db.accounting.reset()
        top = largest_values(db, None, 0, 1, 64)
        assert top.shape == (64,)
        if limit is None:  # values on overflow pages: the exact sizes
            np.testing.assert_array_equal(top, real[-64:])
        else:
            assert real.max() < limit and (top == limit).all()
            assert db.accounting.pages().size == 0
        assert largest_values(db, None, 0, 1, 1000).shape == (300,)


def test_node_consumers_from_every_ranks_node_and_consumer_rank():
    from lmdbio.reader import node_consumers

    # dedicated, 2 nodes of 3 ranks: node rank 0 reads, the others consume
    ranks = [(0, -1, None), (0, 0, None), (0, 1, None), (1, -1, None), (1, 2, None),
             (1, 3, None)]
    assert node_consumers(ranks, 0) == (0, 2, (2, 2))
    assert node_consumers(ranks, 1) == (2, 2, (2, 2))
    # nodes listed in consumer order whatever their index; unequal nodes keep their counts
    ranks = [(1, 0, "pin"), (1, 1, None), (0, 2, None), (1, 3, None)]
    assert node_consumers(ranks, 0) == (2, 1, (3, 1))
    assert node_consumers(ranks, 1) == (0, 3, (3, 1))
    # a node without consumers: no first consumer, left out of the layout
    ranks = [(0, -1, None), (1, 0, None)]
    assert node_consumers(ranks, 0) == (1 << 30, 0, (1,))


@settings(max_examples=300, deadline=None)
@given(epochs=st.integers(0, 6), max_iterations=st.integers(0, 40),
       per_epoch=st.integers(0, 9))
def test_job_epochs_run_epochs_or_max_iterations_whichever_ends_first(epochs, max_iterations,
                                                                      per_epoch):
    """The job's epochs run in order from 0, whole but for the last, and hold
    ``min(epochs * per_epoch, max_iterations)`` iterations (all of them when the limit is
    0 or an epoch holds none)."""
    got = job_epochs(epochs, max_iterations, per_epoch)
    assert [e for e, _ in got] == list(range(len(got)))
    assert all(stop == 0 for _, stop in got[:-1])
    assert all(0 <= stop < max(per_epoch, 1) for _, stop in got)
    ran = sum(stop or per_epoch for _, stop in got)
    limited = max_iterations and per_epoch
    assert ran == (min(epochs * per_epoch, max_iterations) if limited else epochs * per_epoch)
    assert len(got) <= epochs


def test_job_epochs_examples_and_bad_counts():
    assert job_epochs(3, 0, 7) == [(0, 0), (1, 0), (2, 0)]
    assert job_epochs(3, 10, 7) == [(0, 0), (1, 3)]
    assert job_epochs(3, 14, 7) == [(0, 0), (1, 0)]  # ends on an epoch's edge: no empty one
    assert job_epochs(3, 100, 7) == [(0, 0), (1, 0), (2, 0)]
    assert job_epochs(2, 5, 0) == [(0, 0), (1, 0)]
    with pytest.raises(ValueError, match="max_iterations=-1"):
        job_epochs(2, -1, 7)


@settings(max_examples=300, deadline=None)
@given(epochs=st.integers(1, 6), max_iterations=st.integers(0, 40),
       per_epoch=st.integers(1, 9), data=st.data())
def test_a_resumed_job_runs_the_rest_of_the_straight_one(epochs, max_iterations, per_epoch,
                                                         data):
    """Resumed at any batch of the straight schedule, with the iterations run before it,
    the job runs exactly the rest of that schedule."""
    straight = job_epochs(epochs, max_iterations, per_epoch)
    batches = [(e, i) for e, stop in straight for i in range(stop or per_epoch)]
    k = data.draw(st.integers(0, len(batches)))
    if k == len(batches):  # saved after the last batch: at the next epoch's start
        epoch, iteration = (straight[-1][0] + 1, 0) if straight else (0, 0)
    else:
        epoch, iteration = batches[k]
    rest = job_epochs(epochs, max_iterations, per_epoch, epoch=epoch, iteration=iteration,
                      done=k)
    assert rest == [(e, stop) for e, stop in straight if e >= epoch]


def test_a_resumed_job_counts_what_ran_before():
    # ran 20 of 15-iteration epochs under max_iterations 20 (epoch 1 cut at 5), saved at
    # epoch 2: a limit of 40 runs 20 more, whatever the cut epoch left out
    assert job_epochs(4, 40, 15, epoch=2, iteration=0, done=20) == [(2, 0), (3, 5)]
    assert job_epochs(4, 20, 15, epoch=2, iteration=0, done=20) == []  # reached
    assert job_epochs(4, 20, 15, epoch=1, iteration=10, done=25) == []  # past it
    assert job_epochs(4, 30, 15, epoch=1, iteration=10, done=25) == [(1, 0)]
    assert job_epochs(4, 28, 15, epoch=1, iteration=10, done=25) == [(1, 13)]
    with pytest.raises(ValueError, match="done=-1"):
        job_epochs(2, 5, 7, done=-1)
