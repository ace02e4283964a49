"""``lmdbio plan-scale DB --ranks R --nodes N``: project every read strategy to a cluster.

Runs each strategy's own code over the database for every simulated reader (no MPI: one
process) to get the exact pages each rank reads, then times one epoch with the scaling
model (lmdbio.scale, docs/scaling.md) under the costs of ``--fs FS.yaml`` (default: the
Lustre-like costs of lmdbio/scale/lustre.yaml). Prints a table; ``--json OUT`` writes the
whole projection.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lmdbio.commands.argtypes import non_negative_int, output_file, positive_int
from lmdbio.errors import ConfigError
from lmdbio.plan.strategies import STRATEGIES

#: the default cost file, next to the package in a checkout
DEFAULT_FS = Path(__file__).resolve().parents[1] / "scale" / "lustre.yaml"

DESCRIPTION = """\
Project how long one epoch of a database takes with every read strategy on a cluster
of R ranks on N nodes, without the cluster. The strategies' own code runs over the
database for every simulated reader (one process, no MPI) to find the exact pages each
rank reads; a cost model of the file system (Lustre-like by default, --fs FS.yaml for
your own) then times them (docs/scaling.md). Prints one row per strategy: epoch
seconds, samples/s, where the time goes, extra pages read and bytes from the file
system."""

EXAMPLES = """\
lmdbio plan-scale build/demo/digits-datum --ranks 512 --nodes 32
lmdbio plan-scale DB --ranks 64 --nodes 8 --strategies indexed,dm-spec
lmdbio plan-scale DB --ranks 16 --nodes 4 --fs my-filesystem.yaml"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="LMDB directory or data.mdb")
    parser.add_argument("--ranks", type=positive_int, required=True, metavar="R",
                        help="ranks of the job")
    parser.add_argument("--nodes", type=positive_int, required=True, metavar="N",
                        help="nodes (ranks split into consecutive groups)")
    parser.add_argument("--batch-size", type=positive_int, default=None, metavar="B",
                        help="records per rank and iteration (default: 4096 / ranks, at "
                             "least 1: the paper's global batch)")
    parser.add_argument("--fs", metavar="FS.yaml", default=None,
                        help="cost file (a mapping of lmdbio.scale.Costs fields, or one "
                             "under `costs:`); default lmdbio/scale/lustre.yaml, else "
                             "the built-in costs")
    parser.add_argument("--strategies", default="all", metavar="S1,S2",
                        help=f"comma-separated strategies (default all {len(STRATEGIES)}: "
                             f"{', '.join(STRATEGIES)})")
    parser.add_argument("--iterations", type=positive_int, default=None, metavar="I",
                        help="iterations to trace (default: one epoch); the model scales "
                             "them to one epoch")
    parser.add_argument("--batches-per-slot", type=non_negative_int, default=1, metavar="K",
                        help="batches per ring slot of the node-level strategies (1: "
                             "read iteration by iteration, as LMDBIO does; 0: a job's "
                             "default)")
    parser.add_argument("--json", metavar="OUT", default=None, type=output_file,
                        help="also write the whole projection to OUT as JSON")


def main(args: argparse.Namespace) -> int:
    from lmdbio.scale.costs import Costs, load_costs
    from lmdbio.scale.project import ALL_STRATEGIES, Job, project

    if args.nodes > args.ranks:
        raise ConfigError(f"--nodes {args.nodes} is more than --ranks {args.ranks}: every "
                          "node runs at least one rank")
    fs = args.fs or (str(DEFAULT_FS) if DEFAULT_FS.exists() else None)
    costs = load_costs(fs) if fs else Costs()
    names = ALL_STRATEGIES if args.strategies == "all" else tuple(
        s.strip() for s in args.strategies.split(",") if s.strip())
    if not names:
        raise ConfigError("--strategies: name at least one strategy")
    batch = args.batch_size or max(1, 4096 // args.ranks)
    job = Job(args.ranks, args.nodes, batch, args.iterations, args.batches_per_slot)
    result = project(args.path, job, costs, names)
    result["costs_file"] = fs
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=float)
            f.write("\n")
    _print(result)
    return 0


def _print(result: dict) -> None:
    db, job = result["database"], result["job"]
    out = sys.stdout
    print(f"{db['path']}: {db['records']} records, {db['pages']} pages of {db['page_size']} B; "
          f"{job['ranks']} ranks on {job['nodes']} nodes, global batch {job['global_batch']}"
          f", {job['epoch_iterations']} iterations an epoch", file=out)
    print(f"{'strategy':<13} {'epoch s':>10} {'samples/s':>12} {'io s':>9} {'cpu s':>9} "
          f"{'msg s':>9} {'extra pages':>12} {'FS GB':>9}", file=out)
    for s, r in result["strategies"].items():
        b = r["breakdown_seconds"]
        print(f"{s:<13} {r['epoch_seconds']:>10.3f} {r['samples_per_second']:>12.0f} "
              f"{b.get('io', 0):>9.3f} {b.get('cpu', 0) + b.get('consume', 0):>9.3f} "
              f"{b.get('messages', 0):>9.4f} {r['extra_pages_total']:>12} "
              f"{r['fs_bytes_total'] / 1e9:>9.3f}", file=out)
    print(f"(model: {result['model_seconds']:.1f} s; costs: {result.get('costs_file')})",
          file=out)
