"""The reading engine's targets, checked on one ``lmdbio bench read`` JSON document.

The issue judges the engine by running the bench command on databases it has not seen and
checking what rank 0 writes. :func:`check_document` runs those checks on one document and
returns what failed, so that ``bench/targets.py`` can sweep generated files and the tests
can check their own runs the same way:

- every full epoch delivers every record exactly once over all consumers, plus the
  declared padding (``last: pad``), or the declared count with no record twice and no
  padding (``drop``); a final partial epoch delivers no record twice;
- every consumer delivers ``iterations x batch`` records, each a record of the database;
- indexed: no extra pages;
- dm-spec: no missed pages from the third ``iterations`` entry on, and redundant pages
  there at most 1 % of the pages those entries needed.

``last: partial`` (batches of uneven size at an epoch's end) is not checked: a
consumer's records cannot be cut into epochs from the document alone.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from lmdbio.plan.epoch import iterations_per_epoch

#: dm-spec's redundant pages after warm-up, as a share of the pages needed there
REDUNDANT_LIMIT = 0.01


def check_document(doc: dict[str, Any]) -> list[str]:
    """What in ``doc`` (a ``lmdbio bench read`` document) misses a target: one line
    each, empty when every target holds. Raises :class:`ValueError` for a document
    these checks do not apply to (``last: partial``, no consumers)."""
    n, batch, last = int(doc["records_in_database"]), int(doc["batch_size"]), doc["last"]
    if last not in ("pad", "drop"):
        raise ValueError(f"check_document: last={last!r} is not checked (pad or drop)")
    consumers = [r for r in doc["per_rank"] if r["worker"]]
    if not consumers:
        raise ValueError("check_document: no rank delivered records")
    per_epoch = iterations_per_epoch(n, len(consumers), batch, last)
    iters = sum(int(s["batches"]) for s in doc["iterations"])
    failures = _delivery_failures(consumers, n, batch, iters)
    if not failures and per_epoch:
        failures += _epoch_failures(consumers, n, batch, last, per_epoch, iters)
    failures += _page_failures(doc)
    return failures


def _delivery_failures(consumers: list[dict[str, Any]], n: int, batch: int,
                       iters: int) -> list[str]:
    out = []
    for r in consumers:
        records, padding = r["records"], r["padding"]
        if len(records) != iters * batch or len(padding) != len(records):
            out.append(f"rank {r['rank']}: {len(records)} records and {len(padding)} "
                       f"padding flags, expected {iters} iterations x {batch}")
        bad = [x for x in records if not 0 <= x < n]
        if bad:
            out.append(f"rank {r['rank']}: records outside 0..{n - 1}, e.g. {bad[:5]}")
    return out


def _epoch_failures(consumers: list[dict[str, Any]], n: int, batch: int, last: str,
                    per_epoch: int, iters: int) -> list[str]:
    out = []
    size = per_epoch * batch  # each consumer's records in one epoch
    for epoch in range(-(-iters // per_epoch)):
        full = (epoch + 1) * per_epoch <= iters
        seen: Counter[int] = Counter()
        padded = 0
        for r in consumers:
            span = slice(epoch * size, (epoch + 1) * size)
            for rec, pad in zip(r["records"][span], r["padding"][span], strict=True):
                if pad:
                    padded += 1
                else:
                    seen[rec] += 1
        twice = sorted(x for x, k in seen.items() if k > 1)
        if twice:
            out.append(f"epoch {epoch}: {len(twice)} records delivered more than once, "
                       f"e.g. {twice[:5]}")
        if not full:
            continue
        slots = size * len(consumers)
        if last == "pad":
            missing = n - len(seen)
            if missing:
                absent = sorted(set(range(n)) - set(seen))[:5]
                out.append(f"epoch {epoch}: {missing} records not delivered, e.g. {absent}")
            if padded != slots - n:
                out.append(f"epoch {epoch}: {padded} padding records, expected {slots - n}")
        elif padded or sum(seen.values()) != slots:
            out.append(f"epoch {epoch}: {sum(seen.values())} records and {padded} padding "
                       f"delivered, expected {slots} records and no padding (drop)")
    return out


def _page_failures(doc: dict[str, Any]) -> list[str]:
    out = []
    if doc["strategy"] == "indexed" and doc["totals"]["extra_pages"]:
        out.append(f"indexed: {doc['totals']['extra_pages']} extra pages, expected 0")
    if doc["strategy"] == "dm-spec":
        warm = doc["iterations"][2:]
        missed = sum(int(s["missed_pages"]) for s in warm)
        redundant = sum(int(s["redundant_pages"]) for s in warm)
        needed = sum(int(s["own_pages"]) for s in warm)
        if missed:
            out.append(f"dm-spec: {missed} missed pages from the third iterations entry on")
        if redundant > REDUNDANT_LIMIT * needed:
            out.append(f"dm-spec: {redundant} redundant pages from the third iterations "
                       f"entry on, more than {REDUNDANT_LIMIT:.0%} of the {needed} needed")
    return out
