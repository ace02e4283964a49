"""The comparison of ``lmdbio demo`` (``make run``): the loader alone against the per-rank
py-lmdb loop, interleaved inside one MPI job.

Run on every rank (``lmdbio launch -n N ... -- python -m lmdbio.commands.demo_compare``).
Each repeat runs ``lmdbio run CONFIG`` (the loader, no model), then
:mod:`lmdbio.pylmdb_per_rank` (every rank reads its own records with py-lmdb in
``DistributedSampler`` order, parses each Datum with protobuf, stacks a float32 batch,
scaled as the job's ``transform.scale`` scales lmdbio's: what PyTorch and Caffe users run)
with the same ranks, batch size and batches per rank. Both
print their own summary; their JSON goes to ``OUT/lmdbio-R.json`` and
``OUT/pylmdb-R.json``. Repeats alternate the two so that a machine busy with other work
for a moment slows both alike; the demo keeps the best steady state of each (the usual way
to time on a shared machine), with its CPU time per sample, which depends little on what
else runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from lmdbio import pylmdb_per_rank
from lmdbio.cli import main as lmdbio
from lmdbio.config import JobConfig, load_config
from lmdbio.mpiutil import start_mpi


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lmdbio.commands.demo_compare",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("config", help="YAML job configuration (a caffe-datum data set)")
    parser.add_argument("out", help="folder for the JSON results")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY.PATH=VALUE", help="override a configuration value")
    parser.add_argument("--repeat", type=int, default=2, help="repeats of each (default 2)")
    args = parser.parse_args(argv)

    world = start_mpi().COMM_WORLD
    cfg = load_config(args.config, args.overrides)
    out = Path(args.out)
    sets = [x for o in args.overrides for x in ("--set", o)]
    for rep in range(args.repeat):
        ours = out / f"lmdbio-{rep}.json"
        code = lmdbio(["run", args.config, *sets, "--quiet", "--metrics-json", str(ours)])
        if code:
            return code
        world.Barrier()  # rank 0 wrote the figures: how many batches every worker took
        totals = _read_totals(ours)
        batches = totals["samples"] // max(totals["workers"], 1) // cfg.batch.size
        pylmdb_per_rank.main(baseline_arguments(cfg, batches, out / f"pylmdb-{rep}.json"))
        world.Barrier()
    return 0


def baseline_arguments(cfg: JobConfig, batches: int, json_out: Path) -> argparse.Namespace:
    """The per-rank loop's arguments for the job ``cfg`` (its parser's, so that every
    option has its default): the same records per batch, batches and seed, float32
    multiplied by the job's ``transform.scale``: the job's output where its transform is
    a scale alone (configs/quickstart.yaml's); mean, crop and mirror the loop leaves out."""
    parser = argparse.ArgumentParser()
    pylmdb_per_rank.add_arguments(parser)
    argv = [str(cfg.dataset.path), "--batch-size", str(cfg.batch.size), "--batches",
            str(batches), "--seed", str(cfg.shuffle.seed), "--json", str(json_out)]
    if cfg.transform.scale != 1.0:
        argv += ["--scale", repr(cfg.transform.scale)]
    return parser.parse_args(argv)


def _read_totals(path: Path) -> dict:
    for _ in range(100):  # the file system of one host: there at once, but be kind
        try:
            return json.loads(path.read_text())["totals"]
        except (OSError, ValueError):
            time.sleep(0.05)
    return json.loads(path.read_text())["totals"]


if __name__ == "__main__":
    sys.exit(main())
