"""``lmdbio run CONFIG [--set key.path=value ...]``: run a data-loading job.

Run it under ``mpiexec`` (or ``lmdbio launch``) for several ranks, or alone for one. Every
epoch of the configuration is delivered to the workers, which consume the batches (no
model: this measures and checks the data path). ``--record-log DIR`` writes, per worker
rank, the keys it received in order with their labels; ``--metrics-json OUT`` the summary
of every rank, written by rank 0.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML job configuration")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY.PATH=VALUE", help="override a config value (repeatable)")
    parser.add_argument("--metrics-json", metavar="OUT", default=None)
    parser.add_argument("--record-log", metavar="DIR", default=None,
                        help="write each worker's received keys, in order, to DIR")


def main(args: argparse.Namespace) -> int:
    from lmdbio.mpiutil import abort_on_error
    from loaders import open as open_loader

    with abort_on_error():
        loader = open_loader(args.config, args.overrides)
        with loader:
            log = None
            if args.record_log and loader.is_worker:
                d = Path(args.record_log)
                d.mkdir(parents=True, exist_ok=True)
                log = open(d / f"rank-{loader.topo.rank:05d}.log", "w")  # noqa: SIM115
                log.write("# epoch iteration key label padding\n")
            try:
                for epoch in range(loader.cfg.epochs):
                    loader.set_epoch(epoch)
                    for batch in loader:
                        if log is not None:
                            labels = [int(x) for x in batch.label.tolist()] \
                                if hasattr(batch.label, "tolist") else list(batch.label)
                            for key, label, pad in zip(batch.keys, labels,
                                                       batch.padding.tolist(), strict=False):
                                log.write(f"{epoch} {batch.iteration} {key.hex()} {label} "
                                          f"{int(pad)}\n")
            finally:
                if log is not None:
                    log.close()
            summaries = loader.topo.world.gather(loader.summary(), root=0)
            if loader.topo.rank == 0:
                workers = [s for s in summaries if s["worker"]]
                total = {
                    "ranks": loader.topo.size, "nodes": loader.topo.n_nodes,
                    "strategy": loader.cfg.readers.strategy,
                    "samples": sum(s["samples"] for s in workers),
                    "seconds": max(s["seconds"] for s in summaries),
                    "stall_fraction_mean": sum(s["stall_fraction"] for s in workers)
                    / max(len(workers), 1),
                }
                total["samples_per_second"] = total["samples"] / total["seconds"]
                result = {"totals": total, "per_rank": summaries}
                print(f"[lmdbio] done: {total['samples']} samples in {total['seconds']:.2f} s "
                      f"({total['samples_per_second']:.0f} samples/s), mean stall "
                      f"{100 * total['stall_fraction_mean']:.1f}%", flush=True)
                if args.metrics_json:
                    Path(args.metrics_json).write_text(json.dumps(result, indent=2) + "\n")
    return 0
