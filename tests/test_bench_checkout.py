"""``lmdbio bench`` is a thin entry point: the benchmarks live in the source checkout's
``bench/kinds/`` (not in the wheel), and an install without one says so in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmdbio.cli import main
from lmdbio.commands import bench

REPO = Path(__file__).resolve().parents[1]


def test_the_checkout_it_runs_from_is_found() -> None:
    assert bench.checkout_root() == REPO


def test_the_package_holds_no_benchmarks() -> None:
    """pyproject packages lmdbio*: a folder of benchmarks under lmdbio would ship."""
    import lmdbio

    assert not (Path(lmdbio.__file__).parent / "benchmarks").exists()


@pytest.mark.parametrize("kind", list(bench.BENCHMARKS))
def test_without_a_checkout_every_kind_says_why_in_one_line(kind, monkeypatch, capsys) -> None:
    monkeypatch.setattr(bench, "checkout_root", lambda: None)
    assert main(["bench", kind, "DB", "--repeat", "2"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == bench.NEEDS_CHECKOUT + "\n"
    assert "source checkout" in out.err
