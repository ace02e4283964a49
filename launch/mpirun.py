"""``lmdbio-mpirun``: build (and run) the right ``mpiexec`` line for an lmdbio job.

    lmdbio-mpirun -n 8 --per-node 4 --hostfile hosts job.yaml -- python train.py --lr 0.1
    lmdbio launch -n 4 --hosts node1:2,node2:2 job.yaml
    lmdbio launch -n 4 --simulate-nodes 2 --dry-run job.yaml

Open MPI and MPICH (Hydra) spell the same request differently; this module knows both:

=================  =====================================  ===========================
request            Open MPI (5.x, 4.x)                    MPICH / Hydra
=================  =====================================  ===========================
ranks per node     ``--map-by ppr:P:node``                ``-ppn P``
host file          ``--hostfile F``                       ``-f F``
host list          ``--host h1:2,h2:2 --map-by slot``     ``-hosts h1:2,h2:2``
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
Open MPI's ``mpiexec`` runs as its child (:func:`run_openmpi`), which forwards them, gives a
one-host job a private /dev/shm folder, and turns a lost host into a non-zero exit (Open
MPI 5 ends such a job but exits 0).

With ``LMDBIO_TESTS_WITHOUT_MPIEXEC`` set (``make unit``, the loop that runs no MPI job) the
launcher refuses to start ``mpiexec`` (:func:`check_mpiexec_allowed`): a test that reaches a
real launch through ``lmdbio launch``, ``lmdbio demo`` or ``lmdbio-mpirun`` in a subprocess
lacks its ``mpiexec`` marker, and fails saying so instead of running an MPI job.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from launch.detect import MPI_LAUNCHERS, detect_launcher
from lmdbio.errors import ConfigError, LmdbioError

__all__ = [
    "FLAVORS",
    "LaunchPlan",
    "add_arguments",
    "build_launch",
    "check_mpiexec_allowed",
    "detect_mpi_flavor",
    "find_mpiexec",
    "flavor_from_version_text",
    "main",
    "parse_hosts",
    "run",
    "run_openmpi",
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
#: set by ``make unit`` (tests without MPI jobs): starting ``mpiexec`` is then an error
NO_MPIEXEC_ENV = "LMDBIO_TESTS_WITHOUT_MPIEXEC"


@dataclass
class LaunchPlan:
    """An ``mpiexec`` command line and the variables to set in ``mpiexec``'s environment."""

    flavor: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: every rank runs on the launching host (no host list or file, no --per-node below -n,
    #: not a multi-node Slurm allocation): only then can the launcher own the folder Open
    #: MPI's shared-memory files go to (a folder made here does not exist on other hosts)
    one_host: bool = True

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


_HOST_ENTRY = re.compile(r"^[A-Za-z0-9_.\[\]-]+(:[1-9][0-9]*)?$")


def parse_hosts(text: str) -> list[tuple[str, int | None]]:
    """``"h1:2,h2:2"`` -> ``[("h1", 2), ("h2", 2)]`` (slots ``None`` where not given).

    The syntax both Open MPI's ``--host`` and Hydra's ``-hosts`` take. Raises
    :class:`~lmdbio.errors.ConfigError` for an empty list, an empty or malformed entry or a
    host named twice (Open MPI would add the slots up, Hydra not: say it once).
    """
    entries = [e.strip() for e in text.split(",")]
    if not text.strip() or any(not e for e in entries):
        raise ConfigError(f"--hosts wants HOST[:SLOTS],HOST[:SLOTS],..., got {text!r}")
    out: list[tuple[str, int | None]] = []
    for entry in entries:
        if not _HOST_ENTRY.match(entry):
            raise ConfigError(f"--hosts: {entry!r} is not HOST or HOST:SLOTS (SLOTS >= 1)")
        name, _, slots = entry.partition(":")
        out.append((name, int(slots) if slots else None))
    names = [n for n, _ in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"--hosts names {', '.join(twice)} more than once")
    return out


def _has_option(args: Sequence[str], *names: str) -> bool:
    """Whether ``args`` hold one of the options ``names`` (``--opt v`` or ``--opt=v``)."""
    return any(a in names or a.split("=", 1)[0] in names for a in args)


# --------------------------------------------------------------------------- building


def build_launch(
    nprocs: int,
    command: Sequence[str],
    *,
    config: str | os.PathLike[str] | None = None,
    per_node: int | None = None,
    hostfile: str | os.PathLike[str] | None = None,
    hosts: str | None = None,
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
    Open MPI jobs on one host (no host file or list, no ``--per-node`` below ``nprocs``,
    not a multi-node Slurm allocation) get ``OMPI_MCA_osc=^ucx`` unless it is set (see
    :data:`OPENMPI_ONE_HOST_ENV`); jobs run as root get :data:`OPENMPI_ROOT_ENV`; more ranks
    than cores get ``--oversubscribe``. ``hosts`` (``"h1:2,h2:2"``, see :func:`parse_hosts`)
    names the hosts on the line instead of a ``hostfile``; an Open MPI job on a host file
    or list gets ``--map-by slot`` (fill each host's slots in order) unless ``per_node`` or
    a ``--map-by`` in ``mpi_args`` says how to map: a default mapping policy in the
    environment (``PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe``, what the
    Makefile exports for one host) would otherwise put every rank on the first host.
    Raises :class:`~lmdbio.errors.ConfigError` for impossible requests (``nprocs < 1``,
    ``simulate_nodes > nprocs``, missing files, both ``hosts`` and ``hostfile``).
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
    if hosts is not None:
        if host_path is not None:
            raise ConfigError("--hosts and --hostfile both name the hosts; give one of them")
        parse_hosts(hosts)  # raises on a malformed list
        hosts = hosts.replace(" ", "")
    several_hosts = host_path is not None or hosts is not None
    plan_one_host = not several_hosts and (per_node is None or per_node >= nprocs) \
        and _slurm_nodes(environ) <= 1

    plan = LaunchPlan(flavor=flavor, argv=[mpiexec, "-n", str(nprocs)],
                      one_host=plan_one_host)
    if flavor == "openmpi":
        # Without a host file or list the job runs on this host (or a batch allocation):
        # compare with local cores. With --per-node, assume nodes like this one.
        over = (not several_hosts and nprocs > cores) or (
            per_node is not None and per_node > cores
        )
        if per_node is not None:
            plan.argv += ["--map-by", f"ppr:{per_node}:node" + (":oversubscribe" if over else "")]
        elif over:
            plan.argv.append("--oversubscribe")
        elif several_hosts and not _has_option(mpi_args, "--map-by", "-map-by"):
            plan.argv += ["--map-by", "slot"]
        if over:
            plan.notes.append(f"{nprocs} ranks on {cores} cores: oversubscribing")
        if host_path is not None:
            plan.argv += ["--hostfile", str(host_path)]
        if hosts is not None:
            plan.argv += ["--host", hosts]
        for name, value in ranks_env.items():
            plan.argv += ["-x", f"{name}={value}"]
        if is_root:
            plan.env.update(OPENMPI_ROOT_ENV)
        if plan_one_host:
            plan.env.update({k: v for k, v in OPENMPI_ONE_HOST_ENV.items() if k not in environ})
    else:
        if per_node is not None:
            plan.argv += ["-ppn", str(per_node)]
        if host_path is not None:
            plan.argv += ["-f", str(host_path)]
        if hosts is not None:
            plan.argv += ["-hosts", hosts]
        for name, value in ranks_env.items():
            plan.argv += ["-genv", name, value]
    if per_node is not None and not several_hosts and per_node < nprocs and not environ.get(
        "SLURM_JOB_NODELIST"
    ):
        plan.notes.append(
            f"--per-node {per_node} with {nprocs} ranks and no host file needs "
            f"{-(-nprocs // per_node)} hosts; on one host use --simulate-nodes instead"
        )
    plan.argv += list(mpi_args)
    plan.argv += list(command)
    return plan


def check_mpiexec_allowed(argv: Sequence[str],
                          environ: Mapping[str, str] | None = None) -> None:
    """Refuse to start the ``mpiexec`` line ``argv`` where :data:`NO_MPIEXEC_ENV` is set.

    ``make unit`` sets it to run the tests that start no MPI job; the test harness refuses
    its own ``mpiexec`` runs then, and this refuses the launcher's, so a test that starts a
    job through ``lmdbio launch``/``lmdbio demo`` in a subprocess without its ``mpiexec``
    marker fails loudly instead of running MPI in the quick loop. Raises
    :class:`~lmdbio.errors.LmdbioError` naming the variable.
    """
    value = (os.environ if environ is None else environ).get(NO_MPIEXEC_ENV)
    if value:
        raise LmdbioError(
            f"not starting {argv[0] if argv else 'mpiexec'}: {NO_MPIEXEC_ENV}={value} is set "
            "(make unit runs no MPI jobs; a test that launches one must be marked "
            "@pytest.mark.mpiexec and run by make mpi or make test)"
        )


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
    hosts = parser.add_mutually_exclusive_group()
    hosts.add_argument("--hostfile", default=None, metavar="F", help="MPI host file")
    hosts.add_argument(
        "--hosts",
        default=None,
        metavar="H[:S],...",
        help="hosts and their slots, e.g. node1:4,node2:4 (Open MPI --host, Hydra -hosts)",
    )
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
        hosts=getattr(args, "hosts", None),
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
    check_mpiexec_allowed(plan.argv)
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
    if plan.flavor == "openmpi":
        return run_openmpi(plan.argv, env, private_shm=plan.one_host)
    try:
        os.execve(plan.argv[0], plan.argv, env)
    except OSError as exc:
        raise LmdbioError(f"cannot run {plan.argv[0]}: {exc.strerror}") from exc
    return 0  # pragma: no cover - execve does not return


#: PRRTE's banners when a host's daemon is gone (host down, killed, network cut): the
#: daemon lost (it was running) or its launch (ssh) ended before or while it ran; each
#: followed by a line naming the host
_LOST_BANNERS = (
    (b"PRTE has lost communication with a remote daemon",
     re.compile(rb"Remote daemon:\s*\S+ on node (\S+)")),
    (b"A daemon failed to report back after being spawned",
     re.compile(rb"Remote host:\s*(\S+)")),
)


class _LostHosts:
    """Scans ``mpiexec``'s output (while passing it on) for PRRTE's lost-daemon banners and
    collects the hosts they name: Open MPI 5 ends a job whose host died but exits 0. The
    banners come on stdout or stderr (PRRTE prints "failed to report back" on stdout);
    a banner's lines arrive together on one stream, so one scanner serves both."""

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()
        self.lost = False
        self.hosts: list[str] = []
        self._host_line: re.Pattern[bytes] | None = None

    def feed(self, line: bytes) -> None:
        for banner, host_line in _LOST_BANNERS:
            if banner in line:
                self.lost = True
                self._host_line = host_line
                return
        if self._host_line is not None and (m := self._host_line.search(line)):
            host = m.group(1).decode(errors="replace")
            if host not in self.hosts:
                self.hosts.append(host)
            self._host_line = None

    def message(self) -> str:
        names = ", ".join(self.hosts) or "a host"
        return (f"lost host {names}: Open MPI's daemon there died or lost contact (host "
                "down, killed or cut off), and the job was ended on every host")


#: the (empty) places right after a newline or a carriage return
_AFTER_EOL = re.compile(rb"(?<=[\r\n])")


def _pieces(buffer: bytes) -> tuple[list[bytes], bytes]:
    """Split ``buffer`` after every ``\\n`` and ``\\r`` (each piece keeps its terminator):
    the complete pieces, and the unterminated rest."""
    pieces = _AFTER_EOL.split(buffer)
    return pieces[:-1], pieces[-1]


def _pass_on(stream: IO[bytes], out: IO[str] | None, scan: _LostHosts) -> None:
    """Copy ``stream`` to ``out`` as it comes, feeding ``scan`` its lines (under its lock:
    stdout and stderr are read by a thread each). A line ends in a newline or a carriage
    return, and what arrived is passed on at once, a line's end or not: a progress bar
    redrawn in place (``\\r`` then the bar) shows as it is drawn, not when the job ends. A
    reader that went away (a closed pipe) stops the copying, never the draining:
    ``mpiexec`` must not block on a full pipe."""
    import codecs

    binary = getattr(out, "buffer", None)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    read = getattr(stream, "read1", None) or stream.read
    rest = b""  # the line being received, for ``scan``
    while True:
        chunk = read(65536)
        if chunk:
            pieces, rest = _pieces(rest + chunk)
            rest = rest[-65536:]  # a line without an end: its tail is enough to scan
        else:  # the end of the output: what is left, unterminated
            pieces, rest = ([rest] if rest else []), b""
        with scan.lock:
            for piece in pieces:
                scan.feed(piece)
        if out is not None:
            try:
                if binary is not None:
                    binary.write(chunk)
                else:
                    out.write(decoder.decode(chunk, final=not chunk))
                out.flush()
            except (OSError, ValueError):  # closed pipe or file
                out = None
        if not chunk:
            break
    stream.close()


def run_openmpi(argv: Sequence[str], env: dict[str, str], private_shm: bool = True) -> int:
    """Run Open MPI's ``mpiexec`` as a child: forward SIGINT/SIGTERM/SIGHUP to it, pass its
    output on as it comes (stdout to stdout, stderr to stderr) and say when a host was
    lost, and (``private_shm``) keep its shared-memory files in a private
    folder of /dev/shm, removed when it ends.

    Open MPI unlinks its segments when ranks exit normally, but a rank killed with SIGKILL
    (or an aborted job) leaves them in /dev/shm; with the folder removed afterwards, a job
    leaves no shared memory behind however it ends. Folders set by the user are kept. Only
    for a job on this host: the folder would not exist on other hosts (Open MPI passes the
    setting to every rank), whose daemons remove their ranks' segments when the job ends.
    A job ended by Ctrl-C (SIGINT) returns 130 and says "interrupted" (``mpiexec`` ends
    its ranks with SIGTERM and reports 1). A job that lost a host (PRRTE's "lost
    communication with a remote daemon") returns non-zero, 1 where ``mpiexec`` said 0, and
    names the host.
    """
    import shutil
    import signal
    import subprocess
    import tempfile
    import threading

    folder = None
    if private_shm and Path("/dev/shm").is_dir():
        folder = Path(tempfile.mkdtemp(prefix="lmdbio-job-", dir="/dev/shm"))
        for key, sub in (("OMPI_MCA_btl_sm_backing_directory", "btl"),
                         ("OMPI_MCA_osc_sm_backing_directory", "osc")):
            if key not in env:
                (folder / sub).mkdir()
                env[key] = str(folder / sub)
    try:
        child = subprocess.Popen(list(argv), env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
    except BaseException:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    scan = _LostHosts()
    assert child.stdout is not None and child.stderr is not None
    copiers = [threading.Thread(target=_pass_on, args=(stream, out, scan), daemon=True)
               for stream, out in ((child.stdout, sys.stdout), (child.stderr, sys.stderr))]
    for copier in copiers:
        copier.start()
    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward)
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        code = child.wait()
        for copier in copiers:  # the rest of the output (a lost-host banner may be last)
            copier.join(timeout=10)
        if signal.SIGINT in received and code != 0:
            print("lmdbio launch: interrupted", file=sys.stderr)
            return 130
        if scan.lost:
            print(f"lmdbio launch: error: {scan.message()}", file=sys.stderr)
            return code or 1
        return code
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if folder is not None:
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
