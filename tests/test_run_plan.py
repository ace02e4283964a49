"""RunPlan.resolve: a job configuration and a topology resolved into one frozen run plan.

No mpiexec: the topology is a stand-in with what the resolution reads (``rank``, ``size``,
``n_workers``), except for the two refusals made outside the plan, by the topology and by
the session (a one-process loader, and a one-process ``lmdbio run``). Covers the values
resolved from ``auto`` and aliases, the records per consuming rank, what differs between
the ``train`` and ``bench`` purposes, and each refusal with its message, which names the
key and, for a configuration read from a file, its ``file:line``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import loaders
from bench.lmdbgen import tiny_datum_items, write_db
from lmdbio.config import DatasetConfig, JobConfig, ShuffleConfig, load_config
from lmdbio.dataset_meta import write_dataset_meta
from lmdbio.errors import ConfigError
from lmdbio.run_plan import ReadTuning, RunPlan, consuming_ranks, resolve_transfer


def topology(size: int = 4, workers: int = 3, rank: int = 0) -> SimpleNamespace:
    """A one-node topology of ``size`` ranks, ``workers`` of them consuming."""
    return SimpleNamespace(rank=rank, size=size, n_workers=workers)


def job(**sections: Any) -> JobConfig:
    """A checked job configuration of the sections given (``dataset.path`` filled in)."""
    raw: dict[str, Any] = {"dataset": {"path": "/data/x"}}
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values} if isinstance(values, dict) else values
    return load_config(raw)


# ------------------------------------------------------------------------- resolved values

def test_defaults_resolve_to_the_loaders_settings() -> None:
    plan = RunPlan.resolve(job(batch={"size": 48}), topology())
    assert plan.strategy == "dm-spec"
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


def test_a_training_plan_counts_images_a_bench_plan_records(tmp_path: Path) -> None:
    data = tmp_path / "pcr"
    data.mkdir()
    write_dataset_meta(data, {"group_size": 4})  # four images per PCR record
    cfg = job(dataset={"path": str(data), "layout": "pcr"}, batch={"size": 48})
    # training: 48 images over 3 workers, 4 images a record; bench: 48 records a rank
    assert RunPlan.resolve(cfg, topology(), purpose="train").batch_size == 4
    assert RunPlan.resolve(cfg, topology(), purpose="bench").batch_size == 48


def test_a_bench_plan_takes_batch_size_records_on_every_consuming_rank(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="lmdbio.loader"):
        plan = RunPlan.resolve(job(batch={"size": 2}), topology(), purpose="bench")
    assert (plan.batch_size, plan.consumers) == (2, 3)  # no split, no refusal, no warning
    assert caplog.text == ""


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
    with pytest.raises(ConfigError, match=r"batch\.size: 48 counts images: 16 per worker"):
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


# ------------------------------------------------------------------------- refusals at file:line

def job_file(tmp_path: Path, text: str) -> tuple[JobConfig, Path]:
    """A job configuration read from a YAML file of ``text`` (and the file)."""
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return load_config(path), path


def test_a_batch_smaller_than_the_consuming_ranks_names_its_file_and_line(tmp_path: Path
                                                                          ) -> None:
    cfg, path = job_file(tmp_path, "dataset:\n  path: /data/x\nbatch:\n  last: drop\n"
                                   "  size: 2\n")
    with pytest.raises(ConfigError) as info:
        RunPlan.resolve(cfg, topology())
    assert str(info.value) == (
        f"invalid job configuration {path}: {path}:5: batch.size: 2 is smaller than the "
        "number of consuming ranks (3); every rank needs a record")
    assert info.value.path == "batch.size"  # type: ignore[attr-defined]
    # every rank refuses alike (no rank reaches a collective the others skip)
    for rank in (1, 2, 3):
        with pytest.raises(ConfigError) as other:
            RunPlan.resolve(cfg, topology(rank=rank))
        assert str(other.value) == str(info.value)


def test_a_refusal_of_a_default_points_at_its_section_or_at_nothing(tmp_path: Path) -> None:
    # batch.size is not written: its section's line, then no line where neither is
    cfg, path = job_file(tmp_path, "dataset:\n  path: /data/x\nbatch:\n  last: pad\n")
    with pytest.raises(ConfigError, match=rf"{path}:3: batch\.size: 64 is smaller"):
        RunPlan.resolve(cfg, topology(size=100, workers=99))
    cfg, path = job_file(tmp_path, "dataset:\n  path: /data/x\n")
    with pytest.raises(ConfigError, match=rf"^invalid job configuration {path}: batch\.size: "
                                          "64 is smaller"):
        RunPlan.resolve(cfg, topology(size=100, workers=99))


def test_a_record_larger_than_a_workers_share_names_its_file_and_line(tmp_path: Path
                                                                      ) -> None:
    data = tmp_path / "pcr"
    data.mkdir()
    write_dataset_meta(data, {"group_size": 32})
    cfg, path = job_file(tmp_path, f"dataset:\n  path: {data}\n  layout: pcr\n"
                                   "batch:\n  size: 48\n")
    with pytest.raises(ConfigError, match=rf"{path}:5: batch\.size: 48 counts images: 16 per "
                                          r"worker rank \(3 consuming ranks\), but"):
        RunPlan.resolve(cfg, topology())


def test_a_crop_larger_than_the_smallest_image_names_its_file_and_line(tmp_path: Path
                                                                       ) -> None:
    data = tmp_path / "mixed"
    data.mkdir()
    write_dataset_meta(data, {"smallest_image": {"name": "a", "height": 20, "width": 30}})
    cfg, path = job_file(tmp_path, f"dataset:\n  path: {data}\ntransform:\n  mirror: true\n"
                                   "  crop_size: 24\nbatch:\n  size: 48\n")
    with pytest.raises(ConfigError, match=rf"{path}:5: transform\.crop_size: 24 is larger than "
                                          "the smallest image"):
        RunPlan.resolve(cfg, topology())


def test_an_override_refused_after_loading_points_at_the_key_it_replaced(tmp_path: Path
                                                                         ) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("dataset:\n  path: /data/x\nbatch:\n  size: 48\n")
    cfg = load_config(path, ["batch.size=2"])
    with pytest.raises(ConfigError, match=rf"{path}:4: batch\.size: 2 is smaller"):
        RunPlan.resolve(cfg, topology())


@pytest.mark.slow  # a whole CLI run in a subprocess (make test runs it)
def test_a_batch_the_data_set_cannot_fill_under_drop_names_its_file_and_line(tmp_path: Path
                                                                             ) -> None:
    """Refused by the session from the data set's size (one process, no mpiexec), at the
    line of the configuration the plan keeps."""
    db = tmp_path / "db"
    db.mkdir()
    write_db(db, tiny_datum_items(10, seed=3))
    job = tmp_path / "job.yaml"
    job.write_text(f"dataset: {{path: {db}}}\nworkers: {{device: cpu}}\n"
                   "metrics: {every: 0}\nbatch:\n  last: drop\n  size: 12\n")
    repo = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMIX_", "LMDBIO_"))}
    env["PYTHONPATH"] = str(repo)
    run = subprocess.run([sys.executable, "-m", "lmdbio.cli", "run", str(job)], cwd=repo,
                         env=env, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 2, run.stdout + run.stderr
    assert f"{job}:6: batch.size: the batch (batch.size) of 12 records is larger than the " \
        "data set" in run.stderr, run.stderr


def test_more_simulated_nodes_than_ranks_names_its_file_and_line(tmp_path: Path) -> None:
    """Refused by the topology, on every rank alike (its parameters are agreed on in one
    exchange), at the line of ``topology.simulate_nodes``; a one-process world here."""
    job = tmp_path / "job.yaml"
    job.write_text("dataset:\n  path: /data/x\ntopology:\n  simulate_nodes: 2\n")
    with pytest.raises(ConfigError, match=rf"^{job}:4: topology\.simulate_nodes "
                                          r"\(--simulate-nodes\) = 2 is more than the 1 ranks"):
        loaders.open(job)
