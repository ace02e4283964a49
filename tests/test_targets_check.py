"""``bench.targets_check.check_document``: the issue's checks on a bench document
hold on a well-formed one and name each fault put into it."""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest

from bench.targets_check import check_document

N, BATCH, CONSUMERS = 10, 3, 2  # pad: 2 iterations an epoch, 12 slots, 2 padding


def document(last: str = "pad", epochs: float = 2.5, strategy: str = "naive-stride") -> dict:
    """A document whose consumers deliver shuffled epochs as the engine would."""
    per_epoch = -(-N // (BATCH * CONSUMERS)) if last == "pad" else N // (BATCH * CONSUMERS)
    iters = int(epochs * per_epoch)
    rng = np.random.default_rng(1)
    records: list[list[int]] = [[] for _ in range(CONSUMERS)]
    padding: list[list[bool]] = [[] for _ in range(CONSUMERS)]
    for it in range(iters):
        epoch, k = divmod(it, per_epoch)
        order = np.random.default_rng([7, epoch]).permutation(N).tolist()
        slots = per_epoch * BATCH * CONSUMERS
        flat = order + order[:max(slots - N, 0)] if last == "pad" else order[:slots]
        flags = [False] * N + [True] * max(slots - N, 0) if last == "pad" else \
            [False] * slots
        for c in range(CONSUMERS):
            lo = (c * per_epoch + k) * BATCH
            records[c] += flat[lo:lo + BATCH]
            padding[c] += flags[lo:lo + BATCH]
    entries = [{"batches": 1, "missed_pages": 0, "redundant_pages": 0,
                "own_pages": int(rng.integers(50, 60))} for _ in range(iters)]
    return {"records_in_database": N, "batch_size": BATCH, "last": last,
            "strategy": strategy, "iterations": entries, "totals": {"extra_pages": 0},
            "per_rank": [{"rank": c, "worker": True, "records": records[c],
                          "padding": padding[c]} for c in range(CONSUMERS)]
            + [{"rank": CONSUMERS, "worker": False, "records": [], "padding": []}]}


@pytest.mark.parametrize("last", ["pad", "drop"])
@pytest.mark.parametrize("strategy", ["naive-stride", "indexed", "dm-spec"])
def test_a_well_formed_document_passes(last, strategy):
    assert check_document(document(last, strategy=strategy)) == []


def _with(doc: dict, change) -> dict:
    doc = copy.deepcopy(doc)
    change(doc)
    return doc


def _swap_in_first_epoch(doc: dict) -> None:
    doc["per_rank"][0]["records"][0] = doc["per_rank"][1]["records"][0]


FAULTS = [
    ("pad", _swap_in_first_epoch, r"epoch 0: 1 records delivered more than once"),
    ("pad", _swap_in_first_epoch, r"epoch 0: 1 records not delivered"),
    ("drop", _swap_in_first_epoch, r"epoch 0: 1 records delivered more than once"),
    # the partial third epoch (iterations 4 on): a record twice there
    ("pad", lambda d: d["per_rank"][1]["records"].__setitem__(
        -1, d["per_rank"][0]["records"][-1]), r"epoch 2: 1 records delivered more than"),
    ("pad", lambda d: d["per_rank"][0]["padding"].__setitem__(0, True),
     r"epoch 0: .*3 padding records, expected 2"),
    ("drop", lambda d: d["per_rank"][0]["padding"].__setitem__(0, True),
     r"expected 6 records and no padding"),
    ("pad", lambda d: d["per_rank"][0]["records"].__setitem__(2, N),
     r"records outside 0..9, e.g. \[10\]"),
    ("pad", lambda d: d["per_rank"][1]["records"].pop(), r"rank 1: 14 records"),
]


@pytest.mark.parametrize(("last", "change", "message"), FAULTS)
def test_each_fault_is_named(last, change, message):
    failures = check_document(_with(document(last), change))
    assert any(re.search(message, f) for f in failures), failures


def test_page_targets():
    doc = document(strategy="indexed")
    doc["totals"]["extra_pages"] = 3
    assert check_document(doc) == ["indexed: 3 extra pages, expected 0"]
    spec = document(strategy="dm-spec")
    spec["iterations"][1]["missed_pages"] = 9  # warm-up: not counted
    assert check_document(spec) == []
    spec["iterations"][2]["missed_pages"] = 1
    assert check_document(spec) == ["dm-spec: 1 missed pages from the third iterations "
                                    "entry on"]
    spec["iterations"][2]["missed_pages"] = 0
    needed = sum(s["own_pages"] for s in spec["iterations"][2:])
    spec["iterations"][3]["redundant_pages"] = needed // 100  # at the limit
    assert check_document(spec) == []
    spec["iterations"][3]["redundant_pages"] = needed // 100 + 1
    assert check_document(spec)[0].startswith("dm-spec: ")


def test_documents_it_cannot_check_are_refused():
    with pytest.raises(ValueError, match="last='partial'"):
        check_document({**document(), "last": "partial"})
    doc = document()
    for r in doc["per_rank"]:
        r["worker"] = False
    with pytest.raises(ValueError, match="no rank delivered"):
        check_document(doc)
