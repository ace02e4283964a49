"""lmdbio's benchmarks, in the source checkout only (not part of the wheel).

``bench/kinds/`` holds the kinds ``lmdbio bench KIND`` runs; the scripts beside it
(``python -m bench.scan``, ``python -m bench.run_all``, ...) run them over generated and
real databases and write their JSON under ``bench/results``; :mod:`bench.common` is what
they share and :mod:`bench.lmdbgen` writes the generated databases (the tests use it too).
Run from the repository root, which puts the checkout on ``sys.path`` (``python -m``; the
tests get it from pytest's ``pythonpath``; ``lmdbio bench`` adds it itself).
"""
