"""RunPlan.resolve: a job configuration and a topology resolved into one frozen run plan.

No MPI: the topology is a stand-in with what the resolution reads (``mode``, ``rank``,
``size``, ``n_workers``). Covers the values resolved from ``auto`` and aliases, the records
per consuming rank, what differs between the ``train`` and ``bench`` purposes, and each
refusal with its message.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from lmdbio.config import DatasetConfig, JobConfig, ShuffleConfig, load_config
from lmdbio.convert.writer import write_dataset_meta
from lmdbio.errors import ConfigError
from lmdbio.run_plan import ReadTuning, RunPlan, consuming_ranks, resolve_transfer


def topology(size: int = 4, workers: int = 3, mode: str = "dedicated", rank: int = 0
             ) -> SimpleNamespace:
    """A one-node topology of ``size`` ranks, ``workers`` of them consuming."""
    return SimpleNamespace(mode=mode, rank=rank, size=size, n_workers=workers)


def job(**sections: Any) -> JobConfig:
    """A checked job configuration of the sections given (``dataset.path`` filled in)."""
    raw: dict[str, Any] = {"dataset": {"path": "/data/x"}}
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values} if isinstance(values, dict) else values
    return load_config(raw)


# ------------------------------------------------------------------------- resolved values

def test_defaults_resolve_to_the_loaders_settings() -> None:
    plan = RunPlan.resolve(job(batch={"size": 48}), topology())
    assert plan.purpose == "train"
    assert (plan.strategy, plan.reader_mode) == ("dm-spec", "dedicated")
    assert (plan.batch_size, plan.consumers) == (16, 3)  # 48 images over the 3 workers
    assert (plan.last, plan.shuffle, plan.seed) == ("pad", "none", 0)
    assert (plan.block_pages, plan.window_blocks, plan.prefetch_depth) == (64, 8, 4)
    assert plan.batches_per_slot == 0  # chosen by the readers from the record sizes
    assert (plan.codec, dict(plan.codec_options)) == ("none", {})
    assert plan.checksum == "xxh64"
    assert plan.transfer == "spans"  # auto: Caffe records without a codec
    assert plan.accounting is False  # a training job keeps no page accounting
    assert plan.subdb is None
    tuning = ReadTuning()
    assert (plan.timeout, plan.symmetric, plan.direct_io, plan.prefetch_advice,
            plan.read_around) == (tuning.timeout, tuning.symmetric, tuning.direct_io,
                                  tuning.prefetch_advice, tuning.read_around)


def test_the_plan_is_frozen() -> None:
    plan = RunPlan.resolve(job(), topology())
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.seed = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        plan.codec_options["chunk_bytes"] = 4  # type: ignore[index]


@pytest.mark.parametrize("layout, codec, transfer, want", [
    ("caffe-datum", "none", "auto", "spans"),
    ("tensor", "none", "auto", "spans"),
    ("caffe-datum", "ibp", "auto", "copy"),
    ("pcr", "none", "auto", "copy"),
    ("caffe-datum", "none", "copy", "copy"),
    ("caffe-datum", "none", "spans", "spans"),
])
def test_transfer_auto_is_spans_where_records_go_as_stored(layout: str, codec: str,
                                                           transfer: str, want: str) -> None:
    cfg = job(dataset={"layout": layout}, codec={"name": codec},
              readers={"transfer": transfer})
    assert resolve_transfer(cfg) == want


@pytest.mark.parametrize("config, override, want", [
    ("xxh64", None, "xxh64"), ("crc32", None, "crc32"), ("none", None, "none"),
    ("xxh64", False, "none"), ("none", True, "xxh64"), ("xxh64", "crc32", "crc32"),
    ("crc32", "none", "none"),
])
def test_checksum_is_normalised_to_its_name(config: str, override: bool | str | None,
                                            want: str) -> None:
    cfg = job(readers={"checksum": config})
    assert RunPlan.resolve(cfg, topology(), checksum=override).checksum == want


def test_a_node_level_strategy_splits_over_workers_a_naive_one_over_every_rank() -> None:
    topo = topology(size=4, workers=3)
    assert consuming_ranks("dm-spec", topo) == 3
    assert consuming_ranks("naive-stride", topo) == 4
    plan = RunPlan.resolve(job(batch={"size": 48}, readers={"strategy": "naive-stride"}),
                           topo)
    assert (plan.batch_size, plan.consumers) == (12, 4)


def test_an_inexact_split_is_rounded_down_with_a_warning(caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    with caplog.at_level(logging.WARNING, logger="lmdbio.loader"):
        plan = RunPlan.resolve(job(batch={"size": 50}), topology())
    assert plan.batch_size == 16
    assert "not a multiple of the 3 consuming ranks: the global batch is 48" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lmdbio.loader"):
        RunPlan.resolve(job(batch={"size": 50}), topology(rank=1))
    assert caplog.text == ""  # rank 0 alone warns


def test_the_reader_mode_is_the_topologys() -> None:
    plan = RunPlan.resolve(job(readers={"mode": "auto"}), topology(mode="colocated"))
    assert plan.reader_mode == "colocated"


def test_a_training_plan_counts_images_a_bench_plan_records(tmp_path: Path) -> None:
    data = tmp_path / "pcr"
    data.mkdir()
    write_dataset_meta(data, {"group_size": 4})  # four images per PCR record
    cfg = job(dataset={"path": str(data), "layout": "pcr"}, batch={"size": 48})
    assert RunPlan.resolve(cfg, topology(), purpose="train").batch_size == 4
    assert RunPlan.resolve(cfg, topology(), purpose="bench").batch_size == 16


# ------------------------------------------------------------------------- purposes

def test_page_accounting_is_a_bench_setting() -> None:
    cfg = job()
    assert RunPlan.resolve(cfg, topology(), purpose="bench").accounting is True
    assert RunPlan.resolve(cfg, topology(), purpose="bench",
                           tuning=ReadTuning(accounting=False)).accounting is False
    # a training job never accounts, whatever the tuning says
    assert RunPlan.resolve(cfg, topology(), purpose="train",
                           tuning=ReadTuning(accounting=True)).accounting is False


def test_both_purposes_take_the_slot_size_from_the_config() -> None:
    for purpose in ("train", "bench"):
        for per_slot in (0, 1, 5):
            cfg = job(readers={"batches_per_slot": per_slot})
            assert RunPlan.resolve(cfg, topology(), purpose=purpose).batches_per_slot \
                == per_slot


def test_the_tuning_reaches_the_plan() -> None:
    tuning = ReadTuning(timeout=7.5, symmetric=False, direct_io=True, prefetch_advice=False,
                        read_around="on")
    plan = RunPlan.resolve(job(), topology(), purpose="bench", tuning=tuning)
    assert (plan.timeout, plan.symmetric, plan.direct_io, plan.prefetch_advice,
            plan.read_around) == (7.5, False, True, False, "on")


# ------------------------------------------------------------------------- refusals

def test_a_batch_smaller_than_the_consuming_ranks_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"batch\.size: 2 is smaller than the number of "
                                          r"consuming ranks \(3\); every rank needs a record"):
        RunPlan.resolve(job(batch={"size": 2}), topology())


def test_a_record_larger_than_a_workers_share_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "pcr"
    data.mkdir()
    write_dataset_meta(data, {"group_size": 32})
    cfg = job(dataset={"path": str(data), "layout": "pcr"}, batch={"size": 48})
    with pytest.raises(ConfigError, match=r"batch\.size 48 counts images: 16 per worker"):
        RunPlan.resolve(cfg, topology())


def test_a_config_built_in_code_is_checked_as_a_loaded_one() -> None:
    cfg = JobConfig(dataset=DatasetConfig(path="/data/x"),
                    shuffle=ShuffleConfig(mode="global"))  # dm-spec cannot shuffle
    with pytest.raises(ConfigError, match=r"shuffle\.mode: 'global' needs readers\.strategy"):
        RunPlan.resolve(cfg, topology())


@pytest.mark.parametrize("tuning, message", [
    (ReadTuning(read_around="sometimes"), "read_around must be 'auto', 'on' or 'off'"),
    (ReadTuning(timeout=0.0), "timeout must be positive"),
])
def test_tuning_no_session_runs_with_is_refused(tuning: ReadTuning, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RunPlan.resolve(job(), topology(), purpose="bench", tuning=tuning)


def test_an_unknown_checksum_or_purpose_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"readers\.checksum: must be 'xxh64', 'crc32'"):
        RunPlan.resolve(job(), topology(), checksum="md5")
    with pytest.raises(ConfigError, match="run plan purpose must be one of"):
        RunPlan.resolve(job(), topology(), purpose="serve")
