"""Writing LMDB databases with py-lmdb, the way every layout needs it.

Records are written in key order in commits of ``commit_every`` records (as Caffe's
``convert_imageset`` does), so the file is laid out close to key order; the map grows by
doubling when full, so no size has to be guessed up front. Dataset metadata (layout, shape,
codec parameters...) goes in a JSON sidecar ``lmdbio.json`` beside ``data.mdb``
(:mod:`lmdbio.dataset_meta`): it keeps the main database holding data records only, so Caffe
and py-lmdb readers see exactly the records.

Progress: inside :func:`lmdbio.commands.progress.enabled` ``(True)`` (``lmdbio convert`` on a
terminal) :func:`write_records` draws a bar of the records written, with the ``total`` the
layout passes (every layout's converter knows its record count before writing).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lmdbio.commands import progress
from lmdbio.dataset_meta import write_dataset_meta
from lmdbio.errors import LmdbioError

__all__ = ["prepare_destination", "write_records"]


def prepare_destination(dst: str | os.PathLike, overwrite: bool) -> Path:
    """Create ``dst`` as an empty directory; refuse to clobber one unless ``overwrite``."""
    d = Path(dst)
    if d.exists():
        if not overwrite:
            raise LmdbioError(f"{d}: destination exists (pass --overwrite to replace it)")
        if d.is_dir():
            shutil.rmtree(d)
        else:
            d.unlink()
    d.mkdir(parents=True)
    return d


def write_records(
    dst: str | os.PathLike,
    records: Iterable[tuple[bytes, bytes]],
    *,
    meta: dict[str, Any] | None = None,
    format_version: int = 1,
    commit_every: int = 1000,
    overwrite: bool = False,
    initial_map_size: int = 1 << 26,
    total: int | None = None,
) -> dict[str, Any]:
    """Write ``(key, value)`` pairs into a new LMDB at ``dst``; return a summary.

    ``format_version`` 1 writes LMDB 0.9's format (what Caffe writes), 3 writes LMDB 1.0's.
    Keys need not arrive sorted, but sorted keys give the file order that readers prefer.
    ``total``: the number of records coming, for the progress bar (see the module's doc).
    """
    if format_version not in (1, 3):
        raise LmdbioError(f"format_version must be 1 or 3, not {format_version}")
    d = prepare_destination(dst, overwrite)
    env = _open_new_env(d, format_version, initial_map_size)
    show = progress.active()
    bar = progress.bar(total if show else None, "writing", " records",
                       show=show, unit_scale=True)
    try:
        count, nbytes = _write_in_commits(env, records, commit_every, bar)
        if show and bar.total != count:  # a count announced from the source was off
            bar.total = count
        bar.set_postfix_str(f"{nbytes / 1e6:.1f} MB", refresh=False)
    finally:
        bar.close()
        env.close()
    if meta is not None:
        write_dataset_meta(d, {**meta, "records": count, "format_version": format_version})
    return {"path": str(d), "records": count, "value_bytes": nbytes,
            "file_bytes": (d / "data.mdb").stat().st_size}


def _open_new_env(d: Path, format_version: int, initial_map_size: int) -> Any:
    """A writable py-lmdb environment in the directory ``d``: LMDB 0.9's file format for
    ``format_version`` 1, LMDB 1.0's for 3."""
    import lmdb

    kwargs: dict[str, Any] = {"map_size": initial_map_size, "subdir": True}
    if format_version == 3:
        kwargs["lib_version"] = 1
    return lmdb.open(str(d), **kwargs)


def _write_in_commits(env: Any, records: Iterable[tuple[bytes, bytes]], commit_every: int,
                      bar: Any) -> tuple[int, int]:
    """Put every record, one transaction per ``commit_every`` records (the bar advanced per
    record, its size shown per commit); returns ``(records, value bytes)``."""
    count = 0
    nbytes = 0
    pending: list[tuple[bytes, bytes]] = []
    for key, value in records:
        pending.append((bytes(key), bytes(value)))
        count += 1
        nbytes += len(value)
        bar.update(1)
        if len(pending) >= commit_every:
            _commit(env, pending)
            pending.clear()
            bar.set_postfix_str(f"{nbytes / 1e6:.1f} MB", refresh=False)
    if pending:
        _commit(env, pending)
    return count, nbytes


def _commit(env: Any, pending: list[tuple[bytes, bytes]]) -> None:
    """Put ``pending`` in one write transaction, doubling the map size until they fit (so
    that no size has to be guessed up front)."""
    import lmdb

    while True:
        try:
            with env.begin(write=True) as txn:
                for k, v in pending:
                    txn.put(k, v)
            return
        except lmdb.MapFullError:
            env.set_mapsize(env.info()["map_size"] * 2)
