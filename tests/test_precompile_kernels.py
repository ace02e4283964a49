"""The precompile step of ``make unit`` (tests/precompile_kernels.py): its manifest reads
back into numba types, modules are handed out heaviest first (one that touches no shared
kernel beside those), and a recording merges into one entry per signature."""

from __future__ import annotations

import json
from pathlib import Path

from tests.precompile_kernels import (
    Signature,
    by_module_heaviest_first,
    independent_of_shared,
    kernel_module_names,
    merge_recording,
    parse_types,
    read_manifest,
)


def test_every_manifest_signature_reads_back_as_numba_types() -> None:
    kernel_modules = set(kernel_module_names())
    signatures = read_manifest()
    assert signatures
    for sig in signatures:
        assert sig.module in kernel_modules
        assert repr(parse_types(sig.types)) == sig.types


def test_the_forms_numba_writes_that_are_not_type_names_read_back() -> None:
    from numba.core import types

    written = (types.Array(types.uint8, 1, "C", readonly=True), types.literal(32),
               types.literal(False), types.Omitted(None), types.boolean,
               types.UniTuple(types.int64, 2))
    assert parse_types(repr(written)) == written


def test_modules_are_handed_out_heaviest_first_each_whole() -> None:
    sigs = [Signature("a", "f", "()", 1.0), Signature("b", "g", "()", 2.0),
            Signature("a", "h", "()", 1.5), Signature("c", "k", "()", 0.1)]
    groups = by_module_heaviest_first(sigs)
    assert [[s.function for s in group] for group in groups] == [["f", "h"], ["g"], ["k"]]


def test_the_module_compiled_beside_the_shared_kernels_touches_none_of_them() -> None:
    """The heaviest module that neither defines nor imports a shared kernel compiles while
    they do; with none such, nothing does."""
    groups = by_module_heaviest_first([Signature("a", "f", "()", 5.0),
                                       Signature("b", "g", "()", 3.0),
                                       Signature("c", "h", "()", 2.0),
                                       Signature("d", "k", "()", 1.0)])
    # a imports b's kernel x: a (a caller) and b (its owner) wait, c is the heaviest left
    early = independent_of_shared(groups, {"a": {("b", "x")}, "b": set(), "c": set(),
                                           "d": set()})
    assert early is not None and [s.module for s in early] == ["c"]
    assert independent_of_shared(groups, {"a": {("b", "x")}, "b": set(), "c": {("d", "y")},
                                          "d": set()}) is None


def test_a_recording_merges_into_one_entry_per_signature(tmp_path: Path) -> None:
    lines = [{"module": "m.kernels", "function": "f", "types": "(int64,)", "seconds": 0.5},
             {"module": "m.kernels", "function": "f", "types": "(int64,)", "seconds": 2.0},
             {"module": "numba.np.arrayobj", "function": "impl", "types": "()", "seconds": 1},
             {"module": "m.kernels", "function": "f", "types": "(float64,)", "seconds": 1.0}]
    for process, part in ((1, lines[:2]), (2, lines[2:])):
        (tmp_path / f"compiles-{process}.jsonl").write_text(
            "".join(json.dumps(line) + "\n" for line in part))
    assert merge_recording(tmp_path, ["m.kernels"]) == [
        Signature("m.kernels", "f", "(float64,)", 1.0),
        Signature("m.kernels", "f", "(int64,)", 2.0)]
