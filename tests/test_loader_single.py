"""The loader in a single process (a one-rank job): decoding policies, the PyTorch adapter,
state round trips and configuration errors that reach the loader."""

from __future__ import annotations

import numpy as np
import pytest

import loaders
from bench.lmdbgen import write_db
from lmdbio.codecs.datum import datum_from_array, encode_datum
from lmdbio.errors import ConfigError, LmdbioError, RecordError
from lmdbio.io.prefetch import OS_PAGE_SIZE
from tests.page_tables import in_page_tables, needs_populate


@pytest.fixture(scope="module")
def db_with_corrupt_record(tmp_path_factory):
    path = tmp_path_factory.mktemp("corrupt-datum")
    rng = np.random.default_rng(1)
    items = []
    for i in range(40):
        img = rng.integers(0, 256, (1, 4, 4), dtype=np.uint8)
        value = encode_datum(datum_from_array(img, i))
        if i == 13:
            value = value[:-5]  # truncated: the data field runs past the end
        items.append((b"%08d" % i, value))
    write_db(path, items)
    return path


def config(path, **over):
    """A one-rank job over ``path``; ``section__key=value`` overrides. Workers are pinned to
    the CPU: these tests compare values with numpy, and on a GPU host ``auto`` would pick
    the device (the device path: test_auto_device_on_a_gpu_host)."""
    cfg = {"dataset": {"path": str(path), "layout": "caffe-datum"},
           "batch": {"size": 8, "last": "pad"}, "readers": {"strategy": "indexed"},
           "metrics": {"every": 0}, "workers": {"device": "cpu"}}
    for k, v in over.items():
        section, key = k.split("__")
        cfg.setdefault(section, {})[key] = v
    return cfg


def test_raise_policy_names_the_key(db_with_corrupt_record):
    with loaders.open(config(db_with_corrupt_record)) as loader, \
            pytest.raises(RecordError, match="00000013"):
        for _ in loader:
            pass


def test_skip_policy_drops_and_counts(db_with_corrupt_record):
    cfg = config(db_with_corrupt_record)
    cfg["on_error"] = "skip"
    with loaders.open(cfg) as loader:
        batches = list(loader)
        assert len(batches) == 5  # the batch count does not change
        labels = np.concatenate([b.label for b in batches])
        assert 13 not in labels.tolist() and labels.size == 39
        assert loader.metrics.skipped == 1
        assert b"00000013" not in [k for b in batches for k in b.keys]


def test_substitute_policy_reuses_the_previous_good_record(db_with_corrupt_record):
    cfg = config(db_with_corrupt_record)
    cfg["on_error"] = "substitute"
    with loaders.open(cfg) as loader:
        batches = list(loader)
        b = next(b for b in batches if 13 in b.ids.tolist())
        i = b.ids.tolist().index(13)
        assert b.label[i] == 12 and np.array_equal(b.data[i], b.data[i - 1])
        assert all(len(x) == 8 for x in batches)
        assert loader.metrics.substituted == 1


def test_state_dict_refuses_another_world_or_order(db_with_corrupt_record):
    with loaders.open(config(db_with_corrupt_record)) as loader:
        state = loader.state_dict()
    with loaders.open(config(db_with_corrupt_record, batch__size=4)) as loader, \
            pytest.raises(ConfigError, match="batch_size"):
        loader.load_state_dict(state)


def test_batch_smaller_than_world_is_a_config_error(db_with_corrupt_record):
    with pytest.raises(ConfigError, match=r"batch\.size"):
        loaders.open(config(db_with_corrupt_record, batch__size=0))


def test_torch_adapter(db_with_corrupt_record):
    torch = pytest.importorskip("torch")
    from loaders.torch_adapter import TorchBatches

    cfg = config(db_with_corrupt_record)
    cfg["on_error"] = "skip"
    with loaders.open(cfg) as loader:
        ds = TorchBatches(loader)
        assert isinstance(ds, torch.utils.data.IterableDataset)
        got = list(torch.utils.data.DataLoader(ds, batch_size=None))
        assert len(got) == 5
        data, label = got[0]
        assert data.dtype == torch.float32 and data.shape == (8, 1, 4, 4)
        assert label.dtype == torch.int64


@pytest.mark.parametrize(("configured", "argument", "kind"), [
    (None, None, "xxh64"), ("crc32", None, "crc32"), ("none", None, "none"),
    ("crc32", "xxh64", "xxh64"), ("xxh64", "none", "none"), ("xxh64", False, "none")])
def test_slot_checksum_from_the_config_or_the_argument(db_with_corrupt_record, configured,
                                                       argument, kind):
    """``readers.checksum`` sets the ring's slot checksum; ``slot_checksum=`` overrides it;
    the batches arrive either way."""
    from lmdbio.shm.layout import checksum_kind

    over = {} if configured is None else {"readers__checksum": configured}
    cfg = config(db_with_corrupt_record, **over)
    cfg["on_error"] = "skip"
    with loaders.open(cfg, slot_checksum=argument) as loader:
        assert loader.session.ring.checksum == checksum_kind(kind)
        assert sum(len(b) for b in loader) == 39  # one record is corrupt (skipped)


def _delivered(cfg, epochs=2, stop_after=None):
    """Every batch's content, per epoch (optionally leaving each epoch after a few)."""
    out = []
    with loaders.open(cfg) as loader:
        try:
            for epoch in range(epochs):
                loader.set_epoch(epoch)
                for k, b in enumerate(loader):
                    out.append((epoch, b.iteration, b.ids.tolist(), b.padding.tolist(),
                                b.keys, np.asarray(b.label).tolist(),
                                np.asarray(b.data).copy()))
                    if stop_after is not None and k + 1 == stop_after:
                        break
        except LmdbioError as exc:  # where and how a policy gives up is part of the result
            out.append((type(exc).__name__, str(exc), None, None, None, None, np.empty(0)))
        return out, loader.metrics


@pytest.mark.slow
@pytest.mark.parametrize("on_error", ["skip", "substitute"])
@pytest.mark.parametrize("transform", [{}, {"crop_size": 3, "mirror": True, "scale": 0.5}])
@pytest.mark.parametrize("last", ["pad", "partial"])
def test_batches_are_the_same_however_many_share_a_slot(db_with_corrupt_record, on_error,
                                                         transform, last):
    """A slot carrying several batches (decoded in one call when every record decodes,
    batch by batch when one fails) delivers exactly what one batch per slot delivers:
    records, keys, labels, transformed pixels, policies, metrics."""
    runs = {}
    for per_slot in (1, 2, 3, 0):
        cfg = config(db_with_corrupt_record, batch__size=6, batch__last=last,
                     readers__batches_per_slot=per_slot, shuffle__mode="global")
        cfg["on_error"] = on_error
        cfg["transform"] = transform
        runs[per_slot] = _delivered(cfg)
    ref, ref_metrics = runs.pop(1)
    for per_slot, (got, metrics) in runs.items():
        assert len(got) == len(ref), per_slot
        for a, b in zip(ref, got, strict=True):
            assert a[:6] == b[:6], per_slot
            assert np.array_equal(a[6], b[6]), per_slot
        assert (metrics.batches, metrics.samples, metrics.bytes, metrics.skipped,
                metrics.substituted) == (ref_metrics.batches, ref_metrics.samples,
                                         ref_metrics.bytes, ref_metrics.skipped,
                                         ref_metrics.substituted), per_slot


@pytest.mark.parametrize("per_slot", [1, 4, 0])
def test_raise_surfaces_at_the_batch_of_the_bad_record(db_with_corrupt_record, per_slot):
    """The good batches before the one holding the bad record are delivered first, however
    many batches its slot carries."""
    cfg = config(db_with_corrupt_record, readers__batches_per_slot=per_slot)
    got = []
    with loaders.open(cfg) as loader, pytest.raises(RecordError, match="00000013"):
        for b in loader:
            got.append(b.ids.tolist())
    assert [i for ids in got for i in ids] == list(range(8))  # batch 0; 13 is in batch 1


@pytest.mark.parametrize("per_slot", [2, 3])
def test_resume_and_early_exit_inside_a_slot(db_with_corrupt_record, per_slot):
    cfg = config(db_with_corrupt_record, batch__size=4, readers__batches_per_slot=per_slot)
    cfg["on_error"] = "skip"
    full, _ = _delivered(cfg, epochs=1)
    for at in (1, 2, 4, 5):  # inside a slot and at slot boundaries
        with loaders.open(cfg) as loader:
            for k, _ in enumerate(loader):
                if k + 1 == at:
                    state = loader.state_dict()
                    break
        with loaders.open(cfg) as loader:
            loader.load_state_dict(state)
            rest = [b.ids.tolist() for b in loader]
            again = [b.ids.tolist() for b in loader]  # the next epoch starts cleanly
        assert rest == [x[2] for x in full[at:]], at
        assert len(again) == len(full)
    left, _ = _delivered(cfg, epochs=3, stop_after=3)
    assert [(e, i) for e, i, *_ in left] == [(e, i) for e in range(3) for i in range(3)]


def test_a_stop_inside_an_epoch_is_checked_and_kept(db_with_corrupt_record):
    """One rank: ``set_epoch(e, stop_iteration=K)`` delivers K batches, ``len`` says so,
    the next loop runs the next epoch whole; a stop before the resumed batch, a negative
    stop and a resume that stops elsewhere than the saved run are refused by name."""
    cfg = config(db_with_corrupt_record, batch__size=4, readers__batches_per_slot=3)
    cfg["on_error"] = "skip"
    with loaders.open(cfg) as loader:
        loader.set_epoch(0, stop_iteration=4)
        assert len(loader) == 4
        cut = []
        for b in loader:
            cut.append(b.iteration)
            if b.iteration == 1:
                state = loader.state_dict()
        assert cut == [0, 1, 2, 3] and state["stop_iteration"] == 4
        assert [b.epoch for b in loader] == [1] * 10  # the next epoch, whole
        with pytest.raises(ConfigError, match="stop_iteration must be >= 0"):
            loader.set_epoch(2, stop_iteration=-1)
    with loaders.open(cfg) as loader:
        loader.load_state_dict(state)
        loader.set_epoch(0)  # keeps the state's stop
        assert [b.iteration for b in loader] == [2, 3]
    with loaders.open(cfg) as loader:
        loader.load_state_dict(state)
        loader.set_epoch(0, stop_iteration=6)
        with pytest.raises(ConfigError, match="stop where the saved run did"):
            next(iter(loader))
    with loaders.open(cfg) as loader:
        loader.load_state_dict({**state, "iteration": 3, "stop_iteration": 2})
        with pytest.raises(ConfigError, match="is before the batch the loop starts at"):
            next(iter(loader))


@pytest.fixture(scope="module")
def clean_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("clean-datum")
    rng = np.random.default_rng(5)
    images = rng.integers(0, 256, (60, 3, 5, 5), dtype=np.uint8)
    write_db(path, [(b"%08d" % i, encode_datum(datum_from_array(img, i)))
                    for i, img in enumerate(images)])
    return path, images


@pytest.mark.parametrize("transform", [{}, {"scale": 0.5, "mean_values": [1, 2, 3]}])
@pytest.mark.parametrize("keep", [True, False])
def test_reused_output_memory_never_changes_a_batch_the_trainer_holds(clean_db, transform,
                                                                      keep):
    """Decoded slots and transformed batches land in pooled arrays (loaders.buffer_pool):
    a trainer that keeps every batch of three epochs still holds exactly the pixels of its
    records, and one that drops each batch gets the same pixels from reused memory."""
    path, images = clean_db
    cfg = config(path, batch__size=5, readers__batches_per_slot=3, shuffle__mode="global")
    cfg["transform"] = transform
    ref = images.astype(np.float32) * np.float32(transform.get("scale", 1.0))
    if "mean_values" in transform:
        ref = (images.astype(np.float32) - np.float32([1, 2, 3]).reshape(1, 3, 1, 1)) \
            * np.float32(transform["scale"])
    held = []
    with loaders.open(cfg) as loader:
        for epoch in range(3):
            loader.set_epoch(epoch)
            for b in loader:
                np.testing.assert_array_equal(b.data, ref[b.ids])
                if keep:
                    held.append(b)
        if not keep:
            assert loader.buffers.reused > 0
    for b in held:  # after every later slot was decoded
        np.testing.assert_array_equal(b.data, ref[b.ids])


@pytest.mark.parametrize("on_error", ["skip", "substitute"])
@pytest.mark.parametrize("transform", [{}, {"crop_size": 3, "mirror": True, "scale": 0.5}])
@pytest.mark.parametrize("per_slot", [1, 0])
def test_spans_transfer_delivers_what_copying_delivers(db_with_corrupt_record, on_error,
                                                        transform, per_slot):
    """``readers.transfer: spans`` (slots carry record spans, workers decode from the
    database mapping) delivers exactly what copying records into the slots delivers:
    records, keys, labels, pixels, the on_error policy on the truncated record, metrics."""
    runs = {}
    for transfer in ("copy", "spans"):
        cfg = config(db_with_corrupt_record, batch__size=6, shuffle__mode="global",
                     readers__batches_per_slot=per_slot, readers__transfer=transfer)
        cfg["on_error"] = on_error
        cfg["transform"] = transform
        runs[transfer] = _delivered(cfg)
    (ref, ref_m), (got, got_m) = runs["copy"], runs["spans"]
    assert len(got) == len(ref)
    for a, b in zip(ref, got, strict=True):
        assert a[:6] == b[:6]
        assert np.array_equal(a[6], b[6])
    assert (got_m.batches, got_m.samples, got_m.bytes, got_m.skipped, got_m.substituted) == \
        (ref_m.batches, ref_m.samples, ref_m.bytes, ref_m.skipped, ref_m.substituted)


def test_spans_transfer_raises_at_the_bad_record(db_with_corrupt_record):
    cfg = config(db_with_corrupt_record, readers__transfer="spans")
    with loaders.open(cfg) as loader, pytest.raises(RecordError, match="00000013"):
        for _ in loader:
            pass


@pytest.mark.parametrize("transform", [None, {"scale": 0.5}, {"scale": 1.0}],
                         ids=["decoded", "fused-transform", "fused-widen"])
@pytest.mark.parametrize("transfer", ["copy", "spans"])
def test_a_bad_overflow_header_is_named_however_records_travel(tmp_path, transfer,
                                                                transform):
    """A record whose overflow page header is damaged (its page number) stops the loader
    with the file and the page named, whether the reader copies the records into the slots
    (it checks before copying) or hands out their spans (each consumer checks its spans
    as it reads them: the general decoder's path, and the fused Datum kernels of a
    transform or of the identity one, which check each header as they read its value)."""
    from lmdbio.errors import LmdbFormatError

    rng = np.random.default_rng(2)
    items = [(b"%08d" % i, encode_datum(datum_from_array(
        rng.integers(0, 256, (3, 32, 32), dtype=np.uint8), i))) for i in range(24)]
    write_db(tmp_path, items)
    import lmdbio

    with lmdbio.open(tmp_path) as db:
        refs = db.locate(np.array([17]))
        assert refs.ovf_pages[0] > 0
        pg = int((refs.val_off[0] - db.layout.header_size) // db.psize)
        psize = db.psize
    with open(tmp_path / "data.mdb", "r+b") as f:
        f.seek(pg * psize)
        f.write((pg + 7).to_bytes(8, "little"))
    cfg = config(tmp_path, readers__transfer=transfer)
    if transform is not None:
        cfg["transform"] = transform
    with loaders.open(cfg) as loader, \
            pytest.raises(LmdbFormatError, match=f"data.mdb, page {pg}: overflow page header"):
        for _ in loader:
            pass


def test_spans_transfer_needs_records_as_stored(db_with_corrupt_record):
    cfg = config(db_with_corrupt_record, readers__transfer="spans")
    cfg["dataset"]["layout"] = "pcr"
    with pytest.raises(ConfigError, match=r"readers\.transfer"):
        loaders.open(cfg)


HANDOFFS = ["ring", "in-process"]


def _corrupt_spans(monkeypatch, handoff, values=None, keys=None):
    """Make the one rank's reader hand its worker spans changed by ``values(starts,
    lengths)`` / ``keys(starts, lengths)``: in the ring slot it writes (``ring``), or in
    the records it locates, which a rank that is its own ring's only worker hands over in
    process (``in-process``)."""
    from lmdbio.lmdb import RecordRefs
    from lmdbio.shm import SlotWriter
    from lmdbio.slot_locator import SlotLocator

    def same(st, ln):
        return st, ln

    values, keys = values or same, keys or same
    if handoff == "ring":
        real = SlotWriter.set_spans

        def written(self, starts, lengths, *args, key_spans=None, **kwargs):
            assert key_spans is not None  # the session sends keys by reference
            return real(self, *values(starts, lengths), *args, key_spans=keys(*key_spans),
                        **kwargs)

        monkeypatch.setattr(SlotWriter, "set_spans", written)
    else:
        located = SlotLocator.fetch_group

        def fetched(self, *args, **kwargs):
            r = located(self, *args, **kwargs)
            return RecordRefs(*values(r.val_off, r.val_len), r.leaf_pg, r.ovf_pages,
                              *keys(r.key_off, r.key_len))

        monkeypatch.setattr(SlotLocator, "fetch_group", fetched)


def _first_batch(cfg, handoff):
    """The first batch of a one-rank loader, its slots through the ring or in process."""
    with loaders.open(cfg) as loader:
        assert loader.session.hands_to_itself  # a lone rank's slots of spans: in process
        loader.session.alone_on_ring = handoff == "in-process"
        return next(iter(loader))


def _refused(handoff):
    """What refuses a span: the worker's check of a ring slot, or the reader's of the
    records it hands itself."""
    from lmdbio.shm import SlotCorruptError

    return SlotCorruptError if handoff == "ring" else LmdbioError


@pytest.mark.parametrize("handoff", HANDOFFS)
def test_a_span_outside_the_mapping_is_refused(db_with_corrupt_record, monkeypatch, handoff):
    """Every span of a by-reference delivery is checked against the mapping of the
    database before decoding: by the worker for a ring slot, by the reader for the slots
    it hands itself (here a span is moved past the file's end, with slot checksums off so
    that only that check stands)."""
    _corrupt_spans(monkeypatch, handoff, values=lambda st, ln: (np.asarray(st) + (1 << 30), ln))
    cfg = config(db_with_corrupt_record, readers__transfer="spans", readers__checksum="none")
    with pytest.raises(_refused(handoff), match="record span lies outside") as refused:
        _first_batch(cfg, handoff)
    assert str(db_with_corrupt_record) in str(refused.value)  # the file is named


@pytest.mark.parametrize("handoff", HANDOFFS)
def test_a_key_span_outside_the_mapping_is_refused(db_with_corrupt_record, monkeypatch,
                                                   handoff):
    """The keys of a by-reference delivery are spans of the mapped file too: a key span
    past the file's end is refused before any key is read (slot checksums off, as above)."""
    _corrupt_spans(monkeypatch, handoff, keys=lambda st, ln: (np.asarray(st) + (1 << 30), ln))
    cfg = config(db_with_corrupt_record, readers__transfer="spans", readers__checksum="none")
    with pytest.raises(_refused(handoff), match="key span lies outside"):
        _first_batch(cfg, handoff)


@pytest.mark.parametrize("handoff", HANDOFFS)
@pytest.mark.parametrize("which", ["record", "key"])
def test_a_span_whose_end_wraps_around_is_refused(db_with_corrupt_record, monkeypatch, which,
                                                  handoff):
    """A span whose start and length are each inside int64 but whose sum wraps around
    (start 2**62, length 2**62) is refused like any span past the mapping, not read."""

    def wrapped(st, ln):
        st, ln = np.array(st, np.int64), np.array(ln, np.int64)
        st[0], ln[0] = 1 << 62, 1 << 62
        return st, ln

    _corrupt_spans(monkeypatch, handoff, **{"values" if which == "record" else "keys": wrapped})
    cfg = config(db_with_corrupt_record, readers__transfer="spans", readers__checksum="none")
    with pytest.raises(_refused(handoff), match=f"{which} span lies outside"):
        _first_batch(cfg, handoff)


@pytest.mark.parametrize("handoff", HANDOFFS)
def test_the_batches_before_a_bad_span_are_delivered_first(clean_db, monkeypatch, handoff):
    """A bad span in the third slot (read ahead with the first) is raised where that slot
    is taken, after the two batches before it, through the ring or in process alike."""
    from lmdbio.lmdb import RecordRefs
    from lmdbio.slot_locator import SlotLocator

    located = SlotLocator.fetch_group

    def fetched(self, plan, first, count, ids, stats):
        r = located(self, plan, first, count, ids, stats)
        if first != 2:
            return r
        return RecordRefs(r.val_off + (1 << 30), r.val_len, r.leaf_pg, r.ovf_pages,
                          r.key_off, r.key_len)

    monkeypatch.setattr(SlotLocator, "fetch_group", fetched)
    cfg = config(clean_db[0], readers__transfer="spans", readers__checksum="none",
                 readers__batches_per_slot=1, readers__prefetch_depth=3)
    got = []
    with loaders.open(cfg) as loader:
        loader.session.alone_on_ring = handoff == "in-process"
        with pytest.raises(_refused(handoff), match="span lies outside"):
            for b in loader:
                got.append(b.iteration)
    assert got == [0, 1]


def test_max_iterations_ends_the_job_inside_an_epoch_and_resumes_there(clean_db):
    """``max_iterations`` (Caffe's ``max_iter``): ``loader.epochs()`` runs whole epochs up
    to the limit and stops the last one at it, each record at most once in it; a state
    taken inside that epoch resumes there, up to the same stop; a limit on an epoch's edge
    adds no empty epoch, and without one every epoch runs."""
    path, _ = clean_db  # 60 records, batches of 4: 15 per epoch
    cfg = {**config(path, batch__size=4, readers__batches_per_slot=4), "epochs": 3,
           "max_iterations": 20}
    with loaders.open(cfg) as loader:
        got, state = [], None
        for epoch in loader.epochs():
            for b in loader:
                got.append((epoch, b.epoch, b.iteration, tuple(b.keys)))
                if (epoch, b.iteration) == (1, 1):
                    state = loader.state_dict()
    assert [(e, i) for e, _, i, _ in got] == \
        [(0, i) for i in range(15)] + [(1, i) for i in range(5)]
    assert all(e == be for e, be, _, _ in got)
    cut = [k for e, _, _, keys in got if e == 1 for k in keys]
    assert len(cut) == len(set(cut)) == 20
    assert state["epoch"] == 1 and state["stop_iteration"] == 5
    with loaders.open(cfg) as loader:
        loader.load_state_dict(state)
        rest = [(epoch, b.iteration, tuple(b.keys)) for epoch in loader.epochs()
                for b in loader]
    assert rest == [(1, i, keys) for e, _, i, keys in got if e == 1 and i >= 2]
    for limit, epochs in [(30, [0, 1]), (0, [0, 1, 2]), (1000, [0, 1, 2])]:
        with loaders.open({**cfg, "max_iterations": limit}) as loader:
            ran = [(epoch, sum(1 for _ in loader)) for epoch in loader.epochs()]
        assert ran == [(e, 15) for e in epochs]


def test_a_job_resumed_with_another_max_iterations_counts_what_it_ran(clean_db):
    """Caffe's snapshot workflow: a job that ended at ``max_iterations`` 20 (epoch 1 cut
    at 5) and is resumed with 40 runs 20 more; a state at or past the limit runs
    nothing; a limit that would cut the saved epoch elsewhere is refused, naming the
    limits that can resume there."""
    path, _ = clean_db  # 60 records, batches of 4: 15 per epoch
    cfg = {**config(path, batch__size=4, readers__batches_per_slot=4), "epochs": 4,
           "max_iterations": 20}
    with loaders.open(cfg) as loader:
        ran = [(epoch, b.iteration) for epoch in loader.epochs() for b in loader]
        end = loader.state_dict()
    assert len(ran) == 20 and ran[-1] == (1, 4)
    assert (end["epoch"], end["iteration"], end["job_iteration"]) == (2, 0, 20)

    def resume(state, limit):
        with loaders.open({**cfg, "max_iterations": limit}) as loader:
            loader.load_state_dict(state)
            got = [(epoch, b.iteration) for epoch in loader.epochs() for b in loader]
            return got, loader.state_dict()

    got, after = resume(end, 40)
    assert got == [(2, i) for i in range(15)] + [(3, i) for i in range(5)]
    assert after["job_iteration"] == 40
    assert resume(end, 20)[0] == []
    # a state of an uncut run, 25 iterations in (epoch 1, batch 10)
    with loaders.open({**cfg, "max_iterations": 0}) as loader:
        for epoch in loader.epochs():
            for b in loader:
                if (epoch, b.iteration) == (1, 9):
                    mid = loader.state_dict()
                    break
            else:
                continue
            break
    assert (mid["epoch"], mid["iteration"], mid["job_iteration"]) == (1, 10, 25)
    assert resume(mid, 20)[0] == []  # past the limit: nothing to run
    assert resume(mid, 30)[0] == [(1, i) for i in range(10, 15)]
    with pytest.raises(ConfigError, match=r"max_iterations 28 ends this job inside epoch 1 "
                       r"at batch 13.*max_iterations 0 or at least 30, or at most 25"):
        resume(mid, 28)


@pytest.mark.parametrize("transform", [{}, {"scale": 0.5, "mean_values": [3]},
                                       {"crop_size": 3, "mirror": True, "scale": 0.25}])
def test_auto_device_on_a_gpu_host(db_with_corrupt_record, monkeypatch, transform):
    """``workers.device: auto`` on a host where cupy finds a device (the stand-in of
    tests/fake_gpu.py): batches are device arrays (no implicit numpy conversion) holding
    exactly what the CPU run delivers after Caffe's transform, which ran on the device:
    the pixels crossed as uint8, never as float32."""
    from tests import fake_gpu

    over = {"on_error": "skip", "transform": transform}
    with loaders.open({**config(db_with_corrupt_record), **over}) as loader:
        cpu = [(b.data.copy(), b.label.copy(), b.ids.copy()) for b in loader]
    cupy = fake_gpu.install(monkeypatch)
    cfg = {**config(db_with_corrupt_record), **over, "workers": {"device": "auto"}}
    with loaders.open(cfg) as loader:
        assert loader.xp is cupy
        gpu = list(loader)
    assert len(gpu) == len(cpu) > 0
    for b, (data, label, ids) in zip(gpu, cpu, strict=True):
        assert isinstance(b.data, fake_gpu.DeviceArray) and b.data.dtype == np.float32
        with pytest.raises(TypeError, match="Implicit conversion"):
            np.asarray(b.label)
        np.testing.assert_array_equal(b.data.get(), data)  # bit for bit
        np.testing.assert_array_equal(b.label.get(), label)
        np.testing.assert_array_equal(b.ids, ids)
    kinds = {np.dtype(dtype).kind for dtype, _ in cupy.transfers}
    assert kinds <= {"u", "i", "f"} and np.dtype(np.uint8) in {d for d, _ in cupy.transfers}
    floats = [n for dtype, n in cupy.transfers if np.dtype(dtype).kind == "f"]
    assert len(floats) <= 1 and sum(floats) <= 4  # the mean value, copied once: no pixels


@pytest.mark.parametrize("transfer", ["spans", "copy"])
@pytest.mark.parametrize("transform", [{"scale": 0.5}, {"crop_size": 3, "mirror": True}])
@pytest.mark.parametrize("on_error", ["skip", "substitute"])
def test_batches_assembled_ahead_on_the_thread_equal_those_assembled_in_line(
        db_with_corrupt_record, monkeypatch, transform, on_error, transfer):
    """Each batch of raw Datums is assembled when asked for, or on the decoding thread
    while the trainer works on the one before (``Prefetcher.ahead_pays``: when its step is
    at least as long as an assembly). Both give the same batches, the bad record's batch
    included, and every slot goes back to the reader (the epochs after it run)."""
    from loaders.prefetch import Prefetcher

    cfg = config(db_with_corrupt_record, batch__size=6, readers__batches_per_slot=3,
                 shuffle__mode="global", readers__transfer=transfer)
    cfg.update(on_error=on_error, transform=transform, epochs=3)
    runs = {}
    for ahead in (False, True):
        monkeypatch.setattr(Prefetcher, "ahead_pays", lambda self, ahead=ahead: ahead)
        got = []
        with loaders.open(cfg) as loader:
            try:
                for epoch in loader.epochs():
                    for b in loader:
                        got.append((epoch, b.iteration, b.ids.tolist(), b.label.tolist(),
                                    b.data.copy()))
                        del b  # the pool may reuse its memory for the next one
            except LmdbioError as exc:  # substitute with no good record before the bad one
                got.append((type(exc).__name__, str(exc), None, None, np.empty(0)))
        runs[ahead] = got
    assert len(runs[True]) == len(runs[False]) > 0
    for a, b in zip(runs[False], runs[True], strict=True):
        assert a[:4] == b[:4]
        np.testing.assert_array_equal(a[4], b[4])


@pytest.fixture(scope="module")
def tensor_images(tmp_path_factory):
    """A data set of 12 lmdbio tensor records, uint8 (3, 4, 4) images, labels 0..11."""
    from lmdbio.codecs.tensor import encode_tensor

    path = tmp_path_factory.mktemp("tensor-images")
    images = np.random.default_rng(4).integers(0, 256, (12, 3, 4, 4), dtype=np.uint8)
    write_db(path, [(b"%08d" % i, encode_tensor(img, i)) for i, img in enumerate(images)])
    return path, images


@pytest.mark.parametrize("transfer", ["spans", "copy"])
@pytest.mark.parametrize(("transform", "expect"), [
    ({"scale": 0.5}, lambda x: x * np.float32(0.5)),
    ({"mean_values": [10, 20, 30], "scale": 2.0},
     lambda x: (x - np.float32([10, 20, 30])[:, None, None]) * np.float32(2)),
    ({"crop_size": 2, "phase": "test"}, lambda x: x[:, 1:3, 1:3]),  # centred crops
])
def test_tensor_images_take_the_transform(tensor_images, transfer, transform, expect):
    """Tensor records are images too (``Layout.image``): Caffe's transform applies to their
    batches as to decoded Datums, float32 out (it was ignored before)."""
    path, images = tensor_images
    cfg = config(path, dataset__layout="tensor", batch__size=4, readers__transfer=transfer)
    cfg["transform"] = transform
    with loaders.open(cfg) as loader:
        batches = list(loader)
    assert len(batches) == 3
    for b in batches:
        assert b.data.dtype == np.float32
        want = np.stack([expect(images[i].astype(np.float32)) for i in b.ids.tolist()])
        np.testing.assert_allclose(b.data, want, rtol=1e-6)
        assert b.label.tolist() == b.ids.tolist()


def test_tensor_images_without_a_transform_keep_their_dtype(tensor_images):
    """The identity transform (the defaults) leaves tensor records as stored
    (``Layout.widens`` is False), unlike Caffe Datums, which it widens to float32."""
    path, images = tensor_images
    with loaders.open(config(path, dataset__layout="tensor", batch__size=4)) as loader:
        batches = list(loader)
        assert loader.transform is None
    for b in batches:
        assert b.data.dtype == np.uint8
        np.testing.assert_array_equal(b.data, images[b.ids])


def test_a_transform_for_tensor_rows_is_refused_when_the_job_opens(tmp_path):
    """Tensor records whose sidecar says they are rows, not (C, H, W) images: a transform
    is refused at its key's line when the loader opens, not at the first batch."""
    from lmdbio.codecs.tensor import encode_tensor
    from lmdbio.dataset_meta import write_dataset_meta

    rows = np.arange(48, dtype=np.float32).reshape(8, 6)
    write_db(tmp_path / "rows", [(b"%08d" % i, encode_tensor(r, i)) for i, r in enumerate(rows)])
    write_dataset_meta(tmp_path / "rows", {"layout": "tensor", "shape": [6]})
    job = tmp_path / "job.yaml"
    job.write_text(f"dataset:\n  path: {tmp_path / 'rows'}\n  layout: tensor\n"
                   "workers:\n  device: cpu\ntransform:\n  scale: 0.5\n")
    with pytest.raises(ConfigError) as info:
        loaders.open(str(job))
    msg = str(info.value)
    assert f"{job}:7: transform.scale: applies to (C, H, W) images" in msg
    assert "are (6,) (from its lmdbio.json)" in msg
    # without a transform the rows are read as stored
    with loaders.open(config(tmp_path / "rows", dataset__layout="tensor",
                             batch__size=4)) as loader:
        got = np.concatenate([b.data for b in loader])
    assert got.dtype == np.float32 and sorted(got[:, 0].tolist()) == rows[:, 0].tolist()


class _TwoRanks:
    """A stand-in communicator of two ranks where the other rank's outcome is given: what
    :func:`lmdbio.mpiutil.agree` asks of a communicator (allreduce, allgather, size)."""

    def __init__(self, other_refuses: str | None) -> None:
        self.other = other_refuses

    def allreduce(self, value: int, op: object = None) -> int:
        return value + (1 if self.other else 0)

    def allgather(self, mine: object) -> list[object]:
        return [mine, self.other]

    def Get_size(self) -> int:  # noqa: N802 - mpi4py's name
        return 2


def test_a_transform_refused_on_one_rank_only_is_refused_on_every_rank(monkeypatch):
    """Each rank reads the sidecar itself: where one rank refuses the transform and another
    does not, both raise (the refusing one its own error) instead of one waiting in the read
    session's collectives for the other."""
    from lmdbio.config import load_config
    from lmdbio.mpiutil import AgreementError, agreed
    from loaders import options

    cfg = load_config(config("unused"))
    with pytest.raises(AgreementError, match=r"rank 1.*the records are rows"), \
            agreed(_TwoRanks("ConfigError: the records are rows"), "settings", own_error=True):
        options.transformer(cfg)

    def refuse(_cfg: object) -> None:
        raise ConfigError("transform.scale: the records are rows")

    monkeypatch.setattr(options, "transformer", refuse)
    with pytest.raises(ConfigError, match="the records are rows"), \
            agreed(_TwoRanks(None), "settings", own_error=True):
        options.transformer(cfg)


@needs_populate
def test_a_warm_database_is_in_the_page_tables_before_the_first_read(db_with_corrupt_record):
    """A small database in the page cache is mapped into the process's page tables when
    the session opens (no page fault per fault-around window inside the kernels' calls):
    every page of the mapping present, before a batch is read."""
    (db_with_corrupt_record / "data.mdb").read_bytes()  # in the page cache
    with loaders.open(config(db_with_corrupt_record)) as loader:
        s = loader.session
        assert s.totals.populated and loader.summary()["populated"]
        pages = -(-s.db.buf.shape[0] // OS_PAGE_SIZE)
        assert in_page_tables(s.db.buf.ctypes.data, pages).all()
