"""Run every benchmark script in bench/ and collect their JSON in one folder.

Usage: .venv/bin/python -m bench.run_all [--out bench/results] [--only scan,read,...]
(from the repository root; each script runs as ``python -m bench.NAME`` there)
Each script writes its own JSON (always with the baseline it was compared to, measured in
the same run); this only sequences them. MPI benchmarks start their own mpiexec.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from bench.common import REPO, RESULTS

BENCH = REPO / "bench"
ORDER = ["scan", "decode", "read", "targets", "service", "toc", "ibp", "pcr", "btable"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--only", default=None, help="comma-separated subset of " +
                        ",".join(ORDER))
    args = parser.parse_args()
    chosen = args.only.split(",") if args.only else ORDER
    failed = []
    for name in chosen:
        script = BENCH / f"{name}.py"
        if not script.exists():
            print(f"== {name}: no script", flush=True)
            continue
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", f"bench.{name}"]
        if "--out" in script.read_text():  # scripts without it write to bench/results/
            cmd += ["--out", args.out]
        rc = subprocess.run(cmd, cwd=REPO).returncode
        print(f"== {name}: exit {rc} after {time.perf_counter() - t0:.0f} s", flush=True)
        if rc:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
