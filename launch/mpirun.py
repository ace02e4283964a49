"""``lmdbio-mpirun``: build (and run) the right ``mpiexec`` line for an lmdbio job.

    lmdbio-mpirun -n 8 --per-node 4 --hostfile hosts job.yaml -- python train.py --lr 0.1
    lmdbio launch -n 4 --simulate-nodes 2 --dry-run job.yaml

Open MPI and MPICH (Hydra) spell the same request differently; this module knows both:

=================  =====================================  ===========================
request            Open MPI (5.x, 4.x)                    MPICH / Hydra
=================  =====================================  ===========================
ranks per node     ``--map-by ppr:P:node``                ``-ppn P``
host file          ``--hostfile F``                       ``-f F``
export a variable  ``-x NAME=value``                      ``-genv NAME value``
more ranks than    ``--oversubscribe`` (or the            allowed by default
cores                ``:oversubscribe`` map modifier)
running as root    ``OMPI_ALLOW_RUN_AS_ROOT=1`` and       allowed
                     ``OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1``
one host           ``OMPI_MCA_osc=^ucx`` unless set       nothing
                     (no UCX one-sided component: it
                     prints errors where there is no
                     network for it)
=================  =====================================  ===========================

The ranks receive ``LMDBIO_CONFIG`` (absolute path of the job file) and, with
``--simulate-nodes K``, ``LMDBIO_SIMULATE_NODES=K`` (read by ``Topology.build``). Without a
command after ``--`` the job runs ``python -m lmdbio.cli run CONFIG``. The MPI flavour is
the one the installed mpi4py loads (``MPI.Get_library_version()``, read without
initializing MPI), unless ``--mpi`` says otherwise. With MPICH the launcher replaces
itself with ``mpiexec`` (``exec``), so signals from a scheduler reach ``mpiexec`` directly;
Open MPI's ``mpiexec`` runs as its child (:func:`run_with_private_shm`), which forwards them.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from launch.detect import MPI_LAUNCHERS, detect_launcher
from lmdbio.errors import ConfigError, LmdbioError

__all__ = [
    "FLAVORS",
    "LaunchPlan",
    "add_arguments",
    "build_launch",
    "detect_mpi_flavor",
    "find_mpiexec",
    "flavor_from_version_text",
    "main",
    "run",
    "split_command",
]

log = logging.getLogger(__name__)

FLAVORS = ("openmpi", "mpich")
CONFIG_ENV = "LMDBIO_CONFIG"
SIMULATE_NODES_ENV = "LMDBIO_SIMULATE_NODES"
OPENMPI_ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
#: Open MPI on one host: its UCX one-sided component is for networks (InfiniBand); where
#: there is none its component query prints ``osc_ucx_component.c ... Error`` lines in
#: every rank. The shared-memory component serves the ranks of one host.
OPENMPI_ONE_HOST_ENV = {"OMPI_MCA_osc": "^ucx"}


@dataclass
class LaunchPlan:
    """An ``mpiexec`` command line and the variables to set in ``mpiexec``'s environment."""

    flavor: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def shell_line(self) -> str:
        """The line as a shell would run it (``NAME=value ... mpiexec ...``)."""
        prefix = [f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        return " ".join([*prefix, shlex.join(self.argv)])


# --------------------------------------------------------------------------- detection


def flavor_from_version_text(text: str) -> str | None:
    """``"openmpi"`` / ``"mpich"`` from an MPI library or ``mpiexec --version`` banner."""
    low = text.lower()
    if "open mpi" in low or "open-mpi" in low or "openrte" in low:
        return "openmpi"
    if any(s in low for s in ("mpich", "hydra", "intel(r) mpi", "mvapich")):
        return "mpich"
    return None


_LIBRARY_VERSION_CODE = (
    "import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; "
    "print(MPI.Get_library_version())"
)


def _library_flavor() -> str | None:
    """The flavour of the MPI library mpi4py loads.

    Asked in a child interpreter when this process has not imported ``mpi4py.MPI`` yet: the
    launcher must not become an MPI rank itself, and changing ``mpi4py.rc`` here would leave
    a later import in this process uninitialized.
    """
    if "mpi4py.MPI" in sys.modules:
        return flavor_from_version_text(sys.modules["mpi4py.MPI"].Get_library_version())
    try:
        out = subprocess.run(
            [sys.executable, "-c", _LIBRARY_VERSION_CODE],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return flavor_from_version_text(out.stdout)


def _mpiexec_flavor(mpiexec: str) -> str | None:
    try:
        out = subprocess.run(
            [mpiexec, "--version"], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return flavor_from_version_text(out.stdout + out.stderr)


def find_mpiexec() -> str:
    """``mpiexec`` next to the running interpreter (a venv's), else the first on ``PATH``."""
    local = Path(sys.executable).parent / "mpiexec"
    if local.exists():
        return str(local)
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if found is None:
        raise LmdbioError(
            "no mpiexec found next to the Python interpreter or on PATH; install an MPI "
            "(pip install 'lmdbio[mpi]') or pass --mpiexec"
        )
    return found


def detect_mpi_flavor(mpiexec: str | None = None) -> str:
    """The MPI flavour to build the line for: mpi4py's library, else ``mpiexec --version``."""
    flavor = _library_flavor()
    if flavor is None and mpiexec is not None:
        flavor = _mpiexec_flavor(mpiexec)
    if flavor is None:
        raise LmdbioError(
            "cannot tell which MPI is installed (mpi4py missing and mpiexec --version "
            "unrecognized); pass --mpi openmpi or --mpi mpich"
        )
    return flavor


def _cores(sysfs: str | os.PathLike[str] = "/sys/devices/system/cpu") -> int:
    """Cores this process may use, counted as Open MPI's mapper counts its slots: physical
    cores, not hardware threads (a 4-core laptop with 8 threads has 4 slots, so 8 ranks
    need ``--oversubscribe`` there). Logical CPUs where the topology is unreadable."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1
    cores = set()
    for cpu in cpus:
        topo = Path(sysfs) / f"cpu{cpu}" / "topology"
        try:
            cores.add(((topo / "physical_package_id").read_text().strip(),
                       (topo / "core_id").read_text().strip()))
        except OSError:
            return len(cpus)
    return max(len(cores), 1)


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _slurm_nodes(environ: Mapping[str, str]) -> int:
    """Nodes of the Slurm allocation this runs in (1 outside Slurm or when unreadable)."""
    raw = (environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES") or "1").strip()
    try:
        return int(raw)
    except ValueError:
        return 1


# --------------------------------------------------------------------------- building


def build_launch(
    nprocs: int,
    command: Sequence[str],
    *,
    config: str | os.PathLike[str] | None = None,
    per_node: int | None = None,
    hostfile: str | os.PathLike[str] | None = None,
    simulate_nodes: int = 0,
    flavor: str = "auto",
    mpiexec: str | None = None,
    cores: int | None = None,
    is_root: bool | None = None,
    mpi_args: Sequence[str] = (),
    export: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> LaunchPlan:
    """The ``mpiexec`` line that runs ``command`` on ``nprocs`` ranks.

    ``cores`` (default: CPUs this process may use) and ``is_root`` (default: the effective
    uid) are parameters so the line can be built for another machine or tested.
    ``export`` adds variables for the ranks. ``environ`` (default ``os.environ``) is the
    environment ``mpiexec`` will start in: Open MPI settings the user set there are kept.
    Open MPI jobs on one host (no host file, no ``--per-node`` below ``nprocs``, not a
    multi-node Slurm allocation) get ``OMPI_MCA_osc=^ucx`` unless it is set (see
    :data:`OPENMPI_ONE_HOST_ENV`); jobs run as root get :data:`OPENMPI_ROOT_ENV`; more ranks
    than cores get ``--oversubscribe``. Raises :class:`~lmdbio.errors.ConfigError` for
    impossible requests (``nprocs < 1``, ``simulate_nodes > nprocs``, missing files).
    """
    if nprocs < 1:
        raise ConfigError(f"-n must be at least 1, got {nprocs}")
    if per_node is not None and per_node < 1:
        raise ConfigError(f"--per-node must be at least 1, got {per_node}")
    if simulate_nodes < 0 or simulate_nodes > nprocs:
        raise ConfigError(
            f"--simulate-nodes must be between 0 and -n ({nprocs}), got {simulate_nodes}"
        )
    if not command:
        raise ConfigError("no command to run")
    mpiexec = mpiexec or find_mpiexec()
    if flavor == "auto":
        flavor = detect_mpi_flavor(mpiexec)
    if flavor not in FLAVORS:
        raise ConfigError(f"--mpi must be one of {(*FLAVORS, 'auto')}, got {flavor!r}")
    cores = _cores() if cores is None else cores
    is_root = _is_root() if is_root is None else is_root
    environ = os.environ if environ is None else environ

    ranks_env: dict[str, str] = {}
    if config is not None:
        cfg = Path(config)
        if not cfg.is_file():
            raise ConfigError(f"job config {cfg} does not exist")
        ranks_env[CONFIG_ENV] = str(cfg.resolve())
    if simulate_nodes:
        ranks_env[SIMULATE_NODES_ENV] = str(simulate_nodes)
    if export:
        ranks_env.update(export)
    host_path = None
    if hostfile is not None:
        host_path = Path(hostfile)
        if not host_path.is_file():
            raise ConfigError(f"hostfile {host_path} does not exist")
        host_path = host_path.resolve()

    plan = LaunchPlan(flavor=flavor, argv=[mpiexec, "-n", str(nprocs)])
    if flavor == "openmpi":
        # Without a host file the job runs on this host (or a batch allocation): compare
        # with local cores. With --per-node, assume nodes like this one.
        over = (host_path is None and nprocs > cores) or (
            per_node is not None and per_node > cores
        )
        if per_node is not None:
            plan.argv += ["--map-by", f"ppr:{per_node}:node" + (":oversubscribe" if over else "")]
        elif over:
            plan.argv.append("--oversubscribe")
        if over:
            plan.notes.append(f"{nprocs} ranks on {cores} cores: oversubscribing")
        if host_path is not None:
            plan.argv += ["--hostfile", str(host_path)]
        for name, value in ranks_env.items():
            plan.argv += ["-x", f"{name}={value}"]
        if is_root:
            plan.env.update(OPENMPI_ROOT_ENV)
        if host_path is None and (per_node is None or per_node >= nprocs) \
                and _slurm_nodes(environ) <= 1:
            plan.env.update({k: v for k, v in OPENMPI_ONE_HOST_ENV.items() if k not in environ})
    else:
        if per_node is not None:
            plan.argv += ["-ppn", str(per_node)]
        if host_path is not None:
            plan.argv += ["-f", str(host_path)]
        for name, value in ranks_env.items():
            plan.argv += ["-genv", name, value]
    if per_node is not None and host_path is None and per_node < nprocs and not environ.get(
        "SLURM_JOB_NODELIST"
    ):
        plan.notes.append(
            f"--per-node {per_node} with {nprocs} ranks and no host file needs "
            f"{-(-nprocs // per_node)} hosts; on one host use --simulate-nodes instead"
        )
    plan.argv += list(mpi_args)
    plan.argv += list(command)
    return plan


def split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split ``argv`` at the first ``--`` into (launcher options, trainer command)."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by ``lmdbio launch`` and ``lmdbio-mpirun``."""
    parser.add_argument("-n", "--nprocs", type=int, required=True, help="number of ranks")
    parser.add_argument("--per-node", type=int, default=None, metavar="P", help="ranks per node")
    parser.add_argument("--hostfile", default=None, metavar="F", help="MPI host file")
    parser.add_argument(
        "--simulate-nodes",
        type=int,
        default=0,
        metavar="K",
        help="run the ranks as K simulated nodes of consecutive ranks (one host)",
    )
    parser.add_argument(
        "--mpi",
        choices=("auto", *FLAVORS),
        default="auto",
        help="MPI flavour of the mpiexec line (default: the one mpi4py uses)",
    )
    parser.add_argument("--mpiexec", default=None, metavar="PATH", help="mpiexec to run")
    parser.add_argument(
        "--mpi-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for mpiexec (repeatable), e.g. --mpi-arg=--bind-to --mpi-arg=none",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the mpiexec line instead of running it"
    )
    parser.add_argument("config", metavar="CONFIG", help="job configuration (YAML)")


def run(args: argparse.Namespace, command: Sequence[str]) -> int:
    """Build the plan from parsed ``args``; print it (``--dry-run``) or exec ``mpiexec``."""
    command = list(command)
    if command and command[0].startswith("-"):
        raise ConfigError(
            f"unrecognized option {command[0]!r}; put the trainer command after '--'"
        )
    if not command:
        command = [sys.executable, "-m", "lmdbio.cli", "run", str(Path(args.config).resolve())]
    inside = detect_launcher()
    if not args.dry_run and inside is not None and inside.name in MPI_LAUNCHERS:
        raise LmdbioError(
            f"already running as rank {inside.rank} of a {inside.name} job of {inside.size}; "
            "run the launcher from a shell or a batch script, not under mpiexec"
        )
    plan = build_launch(
        args.nprocs,
        command,
        config=args.config,
        per_node=args.per_node,
        hostfile=args.hostfile,
        simulate_nodes=args.simulate_nodes,
        flavor=args.mpi,
        mpiexec=args.mpiexec,
        mpi_args=args.mpi_arg,
    )
    for note in plan.notes:
        print(f"lmdbio launch: note: {note}", file=sys.stderr)
    if args.dry_run:
        print(plan.shell_line())
        return 0
    if args.mpi == "auto":
        actual = _mpiexec_flavor(plan.argv[0])
        if actual is not None and actual != plan.flavor:
            print(
                f"lmdbio launch: warning: mpi4py uses {plan.flavor} but {plan.argv[0]} is "
                f"{actual}'s; every rank would start as a singleton. Pass --mpiexec.",
                file=sys.stderr,
            )
    env = dict(os.environ)
    env.update(plan.env)
    sys.stdout.flush()
    sys.stderr.flush()
    if plan.flavor == "openmpi" and Path("/dev/shm").is_dir():
        return run_with_private_shm(plan.argv, env)
    try:
        os.execve(plan.argv[0], plan.argv, env)
    except OSError as exc:
        raise LmdbioError(f"cannot run {plan.argv[0]}: {exc.strerror}") from exc
    return 0  # pragma: no cover - execve does not return


def run_with_private_shm(argv: Sequence[str], env: dict[str, str]) -> int:
    """Run ``mpiexec`` with Open MPI's shared-memory files in a private folder of /dev/shm,
    forward SIGINT/SIGTERM/SIGHUP to it, and remove the folder when it ends.

    Open MPI unlinks its segments when ranks exit normally, but a rank killed with SIGKILL
    (or an aborted job) leaves them in /dev/shm; with the folder removed afterwards, a job
    leaves no shared memory behind however it ends. Folders set by the user are kept.
    A job ended by Ctrl-C (SIGINT) returns 130 and says "interrupted" (``mpiexec`` ends
    its ranks with SIGTERM and reports 1).
    """
    import shutil
    import signal
    import subprocess
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="lmdbio-job-", dir="/dev/shm"))
    for key, sub in (("OMPI_MCA_btl_sm_backing_directory", "btl"),
                     ("OMPI_MCA_osc_sm_backing_directory", "osc")):
        if key not in env:
            (folder / sub).mkdir()
            env[key] = str(folder / sub)
    child = subprocess.Popen(list(argv), env=env)
    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward)
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        code = child.wait()
        if signal.SIGINT in received and code != 0:
            print("lmdbio launch: interrupted", file=sys.stderr)
            return 130
        return code
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lmdbio-mpirun`` console script."""
    options, command = split_command(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="lmdbio-mpirun",
        description=__doc__.splitlines()[0],
        epilog="Everything after '--' is the command each rank runs.",
    )
    add_arguments(parser)
    args = parser.parse_args(options)
    try:
        return run(args, command)
    except LmdbioError as exc:
        print(f"lmdbio-mpirun: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
