"""Command-line values are checked before any work: the error names the flag and what is
allowed (found by acceptance runs: ``--iters -1`` ran and delivered nothing, ``--batch-size
0`` failed inside the batch ring, an unwritable ``--json`` lost the result at the end)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmdbio.cli import build_parser


def parse_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(("flag", "value", "expected"), [
    ("--iters", "-1", "--iters: expected an integer >= 1, got -1"),
    ("--iters", "abc", "--iters: expected an integer >= 1, got 'abc'"),
    ("--batch-size", "0", "--batch-size: expected an integer >= 1, got 0"),
    ("--prefetch-depth", "0", "--prefetch-depth: expected an integer >= 1"),
    ("--simulate-nodes", "-2", "--simulate-nodes: expected an integer >= 0"),
    ("--timeout", "0", "--timeout: expected a number > 0, got 0"),
    ("--warmup", "-1", "--warmup: expected an integer >= 0"),
])
def test_bench_read_rejects_impossible_values(flag, value, expected, capsys):
    assert expected in parse_error(["bench", "read", "DB", flag, value], capsys)


def test_output_paths_are_checked_before_the_run(tmp_path: Path, capsys):
    missing = tmp_path / "no-such-folder" / "out.json"
    err = parse_error(["bench", "read", "DB", "--json", str(missing)], capsys)
    assert "--json" in err and "does not exist" in err
    err = parse_error(["run", "job.yaml", "--metrics-json", str(tmp_path)], capsys)
    assert "--metrics-json" in err and "is a folder" in err
    ok = build_parser().parse_args(["run", "job.yaml", "--metrics-json",
                                    str(tmp_path / "m.json"), "--step-seconds", "0"])
    assert ok.metrics_json == str(tmp_path / "m.json") and ok.step_seconds == 0.0


def test_run_rejects_a_negative_step(capsys):
    assert "--step-seconds: expected a number >= 0" in parse_error(
        ["run", "job.yaml", "--step-seconds", "-1"], capsys)


@pytest.mark.slow  # a whole CLI run in a subprocess (make test runs it)
def test_output_to_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """``lmdbio inspect DB | head -1``: once the reader of stdout is gone the command stops
    with the shell's SIGPIPE status and no traceback (here the pipe is closed before it
    writes anything)."""
    import os
    import subprocess
    import sys

    from bench.lmdbgen import random_items, write_db

    write_db(tmp_path / "db", random_items(20, 100, seed=1))
    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.run([sys.executable, "-m", "lmdbio.cli", "inspect",
                               str(tmp_path / "db")], stdout=w, stderr=subprocess.PIPE,
                              text=True, timeout=60)
    finally:
        os.close(w)
    assert proc.returncode == 141, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr


# ------------------------------------------------------------------ inspect: what records are
# ``lmdbio inspect`` names the record type from a sample (issue 36, point 7): Caffe Datum
# (shape, raw or encoded and the format, labels), lmdbio's own layouts, otherwise the
# typical size of an unknown value.


def _inspect(path, capsys, *extra: str) -> tuple[dict, str]:
    """``lmdbio inspect PATH --json`` (the records part) and the text output."""
    import json

    from lmdbio.cli import main

    capsys.readouterr()  # what ran before (a conversion's summary)
    assert main(["inspect", str(path), "--json", *extra]) == 0
    report = json.loads(capsys.readouterr().out)
    assert main(["inspect", str(path), *extra]) == 0
    return report["records"], capsys.readouterr().out


def _convert(*argv: str) -> None:
    from lmdbio.cli import main

    assert main(["convert", *argv, "--quiet"]) == 0


def _image_folder(root: Path, size: tuple[int, int] = (8, 10)) -> Path:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for cls, n in (("cat", 5), ("dog", 3)):
        (root / cls).mkdir(parents=True)
        for i in range(n):
            Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(
                root / cls / f"{i}.png")
    return root


def test_inspect_names_raw_caffe_datums_with_shape_and_labels(tmp_path: Path, capsys):
    import numpy as np

    from bench.lmdbgen import write_db
    from lmdbio.codecs.datum import datum_from_array, encode_datum

    rng = np.random.default_rng(2)
    write_db(tmp_path / "db", [(b"%08d" % i, encode_datum(datum_from_array(
        rng.integers(0, 256, (3, 5, 6), dtype=np.uint8), i % 4))) for i in range(200)])
    rec, text = _inspect(tmp_path / "db", capsys, "--sample", "200")
    assert rec["type"] == "caffe-datum" and rec["shape"] == [3, 5, 6]
    assert rec["encoded"] is False and rec["sampled"] == 200
    assert rec["label_histogram"] == {"0": 50, "1": 50, "2": 50, "3": 50}
    assert "records: Caffe Datum, 3x5x6 (CxHxW), raw uint8 pixels" in text
    assert "labels in the sample: 0: 50, 1: 50, 2: 50, 3: 50" in text


@pytest.mark.parametrize(("fmt", "name"), [("jpg", "JPEG"), ("png", "PNG")])
def test_inspect_names_encoded_datums_and_their_format(fmt, name, tmp_path: Path, capsys):
    _convert(str(_image_folder(tmp_path / "images")), str(tmp_path / "db"), "--layout",
             "caffe-datum", "--encoded", fmt)
    rec, text = _inspect(tmp_path / "db", capsys)
    assert rec["type"] == "caffe-datum" and rec["encoded"] is True
    assert rec["encoded_format"] == name and rec["shape"] == [3, 8, 10]
    assert rec["label_histogram"] == {"0": 5, "1": 3}
    assert f"Caffe Datum, 3x8x10 (CxHxW, once decoded), encoded {name} images" in text


def test_inspect_names_lmdbios_own_layouts(tmp_path: Path, capsys):
    import numpy as np

    from lmdbio.codecs import btable

    cases = {}
    _convert("sklearn:digits", str(tmp_path / "tensor"), "--layout", "tensor", "--limit", "30")
    cases["tensor"] = "lmdbio tensor records"
    _convert("sklearn:iris", str(tmp_path / "toc"), "--layout", "toc", "--batch-size", "50")
    cases["toc"] = "lmdbio TOC mini-batches"
    _convert("sklearn:wine", str(tmp_path / "ibp"), "--layout", "ibp", "--rows-per-record",
             "40")
    cases["ibp"] = "lmdbio IBP records"
    _convert(str(_image_folder(tmp_path / "images")), str(tmp_path / "pcr"), "--layout",
             "pcr", "--group-size", "4")
    cases["pcr"] = "lmdbio PCR records (Progressive Compressed Records: progressive JPEG"
    table = np.array([[0.0, 1.5, 0.0], [2.0, 0.0, 3.0], [0.0, 0.0, 4.0]])
    btable.write(tmp_path / "t.btable", ["a", "b", "c"], table)
    _convert(str(tmp_path / "t.btable"), str(tmp_path / "btable"), "--layout", "btable")
    cases["btable"] = "lmdbio BTable sparse rows (one table row per record), 3 columns"
    for layout, words in cases.items():
        rec, text = _inspect(tmp_path / layout, capsys)
        assert rec["type"] == layout, (layout, rec)
        assert rec["sidecar_layout"] == layout
        assert f"records: {words}" in text, (layout, text)
        assert "but lmdbio.json says" not in text
    rec, _ = _inspect(tmp_path / "toc", capsys)
    assert rec["rows_per_record"] == 50 and sum(rec["label_histogram"].values()) == 150
    rec, _ = _inspect(tmp_path / "pcr", capsys)
    assert rec["items_per_record"] == 4 and rec["label_histogram"] == {"0": 5, "1": 3}


def test_inspect_without_a_sidecar_still_recognizes_the_records(tmp_path: Path, capsys):
    _convert("sklearn:digits", str(tmp_path / "t"), "--layout", "tensor", "--limit", "10")
    (tmp_path / "t" / "lmdbio.json").unlink()
    rec, _ = _inspect(tmp_path / "t", capsys)
    assert rec["type"] == "tensor" and rec["sidecar_layout"] is None


def test_inspect_says_when_the_sidecar_disagrees(tmp_path: Path, capsys):
    import json

    _convert("sklearn:digits", str(tmp_path / "d"), "--layout", "caffe-datum", "--limit", "10")
    meta = tmp_path / "d" / "lmdbio.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "layout": "tensor"}))
    rec, text = _inspect(tmp_path / "d", capsys)
    assert rec["type"] == "caffe-datum"
    assert "but lmdbio.json says layout 'tensor'" in text


def test_inspect_foreign_and_unknown_values(tmp_path: Path, capsys):
    import io
    import pickle

    import numpy as np
    from PIL import Image

    from bench.lmdbgen import random_items, write_db

    write_db(tmp_path / "random", random_items(50, 300, seed=4))
    rec, text = _inspect(tmp_path / "random", capsys)
    assert rec["type"] == "unknown"
    assert "records: unknown binary, 300 bytes typical" in text
    write_db(tmp_path / "pickles", [(b"%04d" % i, pickle.dumps({"x": list(range(i))}))
                                    for i in range(20)])
    rec, text = _inspect(tmp_path / "pickles", capsys)
    assert rec["type"] == "pickle" and "not unpickled" in text

    def png(i: int) -> bytes:
        out = io.BytesIO()
        Image.fromarray(np.full((4, 4), i, np.uint8)).save(out, format="PNG")
        return out.getvalue()

    write_db(tmp_path / "pngs", [(b"%04d" % i, png(i)) for i in range(20)])
    rec, text = _inspect(tmp_path / "pngs", capsys)
    assert rec["type"] == "image-files" and "bare PNG image files" in text


def test_inspect_samples_the_whole_database() -> None:
    from lmdbio.lmdb.report import sample_indices

    idx = sample_indices(1_000_000, 64)
    assert idx[0] == 0 and idx[-1] == 999_999 and len(idx) == 64
    assert list(sample_indices(5, 64)) == [0, 1, 2, 3, 4]
