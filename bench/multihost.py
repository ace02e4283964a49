"""Real hosts on one machine: network namespaces, host names and a launch agent for Open MPI.

Every cross-node path of lmdbio is tested on *simulated* nodes elsewhere (one host's world
cut into groups). This module gives a test N "hosts" (2-4) that look like a small cluster
to Open MPI, so the same paths run as on one:

* each host is a network namespace (``ip netns``) with a veth pair to a bridge in the root
  namespace, on a private ``10.213.X.0/24`` subnet (the bridge has ``.1``: ``mpiexec`` runs
  in the root namespace and its daemons call back to it there; host ``i`` has ``.1{i}``);
* Open MPI starts its per-host daemon (``prted``) through a launch agent script instead of
  ``ssh`` (PRRTE's ``plm_ssh_agent``; ``plm_rsh_agent`` was Open MPI 4's name). The agent
  runs the daemon command under ``ip netns exec NS unshare --uts --mount``: a host name of
  its own (``h1`` ...) and a **private /dev/shm** (a per-host folder bind-mounted over it),
  in a clean environment as ``ssh`` gives (``env -i``: PATH, HOME, USER only), so a job
  only gets the variables Open MPI forwards or ``-x`` exports, as on a cluster;
* ``Split_type(COMM_TYPE_SHARED)`` then finds one node per host, ranks on different hosts
  talk over TCP on the private subnet, ranks of one host over shared memory.

Why a private /dev/shm: hosts of a cluster do not share one, and with a folder per host a
test sees what each host's ranks left behind (``Hosts.shm_files``), also after a host was
killed; the folders are removed at teardown. The page cache is still the machine's (nodes
that must not share one read through ``direct_io``).

The mapping trap: ``PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe`` (the Makefile
exports it) puts every rank on the first host, so runs on these hosts pass an explicit
``--map-by`` (:meth:`Hosts.mpiexec_args`), which wins over the variable.

Names carry the owning process id and a counter (``lmdbio-mh<pid>x<k>-h1`` for namespaces,
``lmbr<pid>x<k>`` for the bridge, ``lmv<pid>x<k>h1`` for veth ends, ``/dev/shm/lmdbio-mh
<pid>x<k>`` for the /dev/shm folders), so two test sessions at once never collide, and
:func:`sweep_stale` (run before every setup) removes whatever a dead process left behind
(a test run killed with SIGKILL cannot run its finalizers). :func:`unavailable` says why
hosts cannot be made here (not root, no iproute2, namespaces refused); tests skip with it.

Links can be shaped like a cluster's (:meth:`Hosts.shape`: a rate with ``tc tbf``, a delay
with ``tc netem`` where the kernel has it).

Shared by the tests (tests/test_multihost.py) and the benchmarks (bench/multihost_read.py),
so it lives in ``bench`` (tests import bench helpers; bench never imports tests).

By hand (root): ``python -m bench.multihost --hosts 2 [--rate 1gbit --delay 100us] --
COMMAND ...`` makes the hosts, runs COMMAND with ``MULTIHOST_HOSTS`` (``h1:2,h2:2``),
``MULTIHOST_HOSTFILE`` and the ``PRTE_MCA_*``/``OMPI_MCA_*`` settings in its environment,
and tears everything down.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Hosts", "make_hosts", "sweep_stale", "unavailable"]

#: prefixes of everything this module creates; the digits after them are the owner's pid
NS_PREFIX = "lmdbio-mh"
BRIDGE_PREFIX = "lmbr"
VETH_PREFIX = "lmv"
SHM_ROOT = Path("/dev/shm")
TMP_ROOT = Path(tempfile.gettempdir())
SUBNET_BASE = "10.213"
#: the environment the agent gives a daemon (what ``ssh`` to a cluster node gives)
AGENT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_OWNED = re.compile(rf"^(?:{NS_PREFIX}|{BRIDGE_PREFIX}|{VETH_PREFIX})(\d+)x")
_counter = 0


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``ip ARGS``; raise ``RuntimeError`` with its message when it fails and ``check``."""
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30,
                          check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner(name: str) -> int | None:
    m = _OWNED.match(name)
    return int(m.group(1)) if m else None


def unavailable() -> str | None:
    """Why namespaced hosts cannot be made here (``None`` when they can): the reason a test
    skips with. Checks root, iproute2 and unshare, then really adds and deletes a namespace
    (a container without CAP_SYS_ADMIN refuses that)."""
    if os.geteuid() != 0:
        return "multi-host tests need root (network namespaces, veth pairs, a bridge)"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"multi-host tests need {tool} (iproute2 / util-linux), not found on PATH"
    probe = f"{NS_PREFIX}{os.getpid()}xprobe"
    proc = _ip("netns", "add", probe, check=False)
    if proc.returncode != 0:
        return f"network namespaces are not allowed here (ip netns add: {proc.stderr.strip()})"
    _ip("netns", "delete", probe, check=False)
    return None


def _netns_pids(ns: str) -> list[int]:
    proc = _ip("netns", "pids", ns, check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit()]


def kill_netns(ns: str, timeout: float = 10.0) -> None:
    """SIGKILL every process in namespace ``ns`` until none is left (daemons fork)."""
    deadline = time.monotonic() + timeout
    while pids := _netns_pids(ns):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)


def sweep_stale() -> list[str]:
    """Remove namespaces, links and folders of this module whose owning process is dead.

    A test session killed with SIGKILL (or a machine crash) leaves them; they would pile up
    and, for a bridge, keep a subnet's route. Anything owned by a live process (another
    test session running now) is left alone. Returns the names removed.
    """
    removed = []
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        ns = line.split()[0] if line.strip() else ""
        pid = _owner(ns)
        if pid is not None and not _alive(pid):
            kill_netns(ns)
            _ip("netns", "delete", ns, check=False)
            removed.append(ns)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@")[0]
        pid = _owner(name)
        if pid is not None and not _alive(pid):
            _ip("link", "delete", name, check=False)
            removed.append(name)
    for root in (SHM_ROOT, TMP_ROOT):
        for path in root.glob(f"{NS_PREFIX}*"):
            pid = _owner(path.name)
            if pid is not None and not _alive(pid):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(str(path))
    return removed


def _free_subnet(seed: int) -> str:
    """A ``10.213.X`` prefix no interface of the root namespace uses (probing from ``seed``:
    two sessions starting at once most likely pick different ones)."""
    used = _ip("-o", "-4", "addr", "show", check=False).stdout
    for k in range(250):
        x = (seed + k) % 250 + 1
        prefix = f"{SUBNET_BASE}.{x}"
        if f" {prefix}." not in used:
            return prefix
    raise RuntimeError(f"no free {SUBNET_BASE}.X.0/24 subnet")


AGENT = """#!/bin/sh
# Open MPI launch agent for namespaced hosts (PRRTE plm_ssh_agent): called as
# `AGENT [options] HOST COMMAND...` like ssh, it runs COMMAND on HOST: in the host's network
# namespace, with its host name and its own /dev/shm, in the clean environment ssh gives.
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
host="$1"; shift
case "$host" in
{cases}
  *) echo "multihost agent: unknown host '$host'" >&2; exit 255 ;;
esac
echo "$(date +%T.%N) $host" >> {log}
exec ip netns exec "$ns" unshare --uts --mount env -i PATH={path} HOME="${{HOME:-/root}}" \\
  USER="${{USER:-root}}" sh -c 'hostname "$1" && mount --bind "$2" /dev/shm || exit 255
shift 2; exec sh -c "$*"' agent "$host" "$shm" "$@"
"""


@dataclass
class Hosts:
    """N namespaced hosts and what a job needs to run on them; :meth:`close` removes all."""

    names: list[str]
    slots: int
    tag: str
    subnet: str
    bridge: str
    netns: dict[str, str]
    addresses: dict[str, str]
    shm: dict[str, Path]
    workdir: Path
    agent: Path
    hostfile: Path
    closed: bool = False
    _links: list[str] = field(default_factory=list)

    @property
    def host_list(self) -> str:
        """``h1:S,h2:S,...``: what ``--host`` / ``lmdbio launch --hosts`` take."""
        return ",".join(f"{h}:{self.slots}" for h in self.names)

    def mpi_env(self) -> dict[str, str]:
        """Open MPI settings for ``mpiexec``'s environment: the agent instead of ssh, no
        tree spawn (the root namespace starts every daemon), the private subnet for
        PRRTE's out-of-band and MPI's TCP traffic (else they may pick eth0's addresses,
        which the namespaces cannot reach), and no UCX (there is no InfiniBand)."""
        return {
            "PRTE_MCA_plm_ssh_agent": str(self.agent),
            "PRTE_MCA_plm_ssh_no_tree_spawn": "1",
            "PRTE_MCA_prte_if_include": self.subnet,
            "OMPI_MCA_btl_tcp_if_include": self.subnet,
            # no InfiniBand between these hosts: Open MPI's UCX one-sided component would
            # print an error line in every rank
            "OMPI_MCA_osc": "^ucx",
        }

    def mca_args(self) -> list[str]:
        """The same settings as ``mpiexec`` options (what ``--mpi-arg`` passes on)."""
        out = []
        for key, value in self.mpi_env().items():
            name = key.split("_MCA_", 1)[1]
            out += ["--prtemca" if key.startswith("PRTE_") else "--mca", name, value]
        return out

    def mpiexec_args(self, ranks_per_host: int | None = None, map_by: str = "slot",
                     export: Sequence[str] = ()) -> list[str]:
        """``--host`` with ``ranks_per_host`` slots per host, an explicit ``--map-by``
        (``slot``: fill h1 then h2; ``node``: round robin) and ``-x NAME`` per variable to
        export: the daemons start in a clean environment, as over ssh."""
        per = self.slots if ranks_per_host is None else ranks_per_host
        args = ["--host", ",".join(f"{h}:{per}" for h in self.names), "--map-by", map_by]
        for name in export:
            args += ["-x", name]
        return args

    def run_on(self, host: str, command: str, timeout: float = 30
               ) -> subprocess.CompletedProcess:
        """Run a shell ``command`` on ``host`` through the agent (as a daemon would run)."""
        return subprocess.run([str(self.agent), host, command], capture_output=True,
                              text=True, timeout=timeout, check=False)

    def pids(self, host: str) -> list[int]:
        """Processes running on ``host`` now (its daemon and ranks)."""
        return _netns_pids(self.netns[host])

    def kill(self, host: str) -> None:
        """Kill ``host`` as a power cut would: SIGKILL to its daemon and every rank."""
        kill_netns(self.netns[host])

    def wait_idle(self, host: str, timeout: float = 20.0) -> bool:
        """Wait until no process runs on ``host``; whether that happened in time."""
        deadline = time.monotonic() + timeout
        while self.pids(host):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def shm_files(self, host: str) -> list[str]:
        """What ``host``'s private /dev/shm holds."""
        return sorted(os.listdir(self.shm[host]))

    def shape(self, rate: str | None = None, delay: str | None = None) -> None:
        """Make the links cluster-like: limit each direction of every host's link (its
        sending side in its namespace, its receiving side on the bridge port) to ``rate``
        (``"1gbit"``; ``tc tbf``, a token bucket of 1 MB), and with ``delay`` (``"100us"``)
        add latency (``tc netem``, which also takes the rate then; kernels without the
        netem module refuse, and the error says so). ``None`` for both removes it."""
        if delay:
            qdisc = ["netem", "delay", delay, *(["rate", rate] if rate else [])]
        elif rate:
            qdisc = ["tbf", "rate", rate, "burst", "1mb", "latency", "50ms"]
        for h in self.names:
            for where in (["-n", self.netns[h]], []):
                dev = "eth0" if where else f"{VETH_PREFIX}{self.tag}{h}"
                if rate is None and delay is None:
                    subprocess.run(["tc", *where, "qdisc", "del", "dev", dev, "root"],
                                   capture_output=True, check=False)
                    continue
                proc = subprocess.run(["tc", *where, "qdisc", "replace", "dev", dev, "root",
                                       *qdisc], capture_output=True, text=True, check=False)
                if proc.returncode != 0:
                    raise RuntimeError(f"tc qdisc {' '.join(qdisc)} on {dev}: "
                                       f"{proc.stderr.strip()}")

    def traffic(self) -> dict[str, tuple[int, int]]:
        """Bytes each host has sent and received on its link so far: ``{host: (tx, rx)}``."""
        out = {}
        for h in self.names:
            stats = [int(self.run_in_netns(h, f"cat /sys/class/net/eth0/statistics/{k}_bytes"))
                     for k in ("tx", "rx")]
            out[h] = (stats[0], stats[1])
        return out

    def run_in_netns(self, host: str, command: str) -> str:
        """The output of a shell ``command`` run in ``host``'s network namespace (with
        its /sys), without the agent's host name and /dev/shm."""
        return subprocess.run(["ip", "netns", "exec", self.netns[host], "sh", "-c", command],
                              capture_output=True, text=True, timeout=30,
                              check=True).stdout.strip()

    def agent_log(self) -> str:
        log = self.workdir / "agent.log"
        return log.read_text() if log.exists() else ""

    def close(self) -> None:
        """Kill every process on the hosts, delete namespaces, links and folders (idempotent,
        never raises: it runs in finalizers)."""
        if self.closed:
            return
        self.closed = True
        for ns in self.netns.values():
            with contextlib.suppress(Exception):
                kill_netns(ns)
            _ip("netns", "delete", ns, check=False)
        for link in [*self._links, self.bridge]:
            _ip("link", "delete", link, check=False)
        for path in {*(p.parent for p in self.shm.values()), self.workdir}:
            shutil.rmtree(path, ignore_errors=True)

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_hosts(n: int = 2, slots: int = 2) -> Hosts:
    """Make ``n`` hosts ``h1..hn`` of ``slots`` slots each (sweeping stale ones first).

    Raises ``RuntimeError`` when a step fails (everything made so far is removed first);
    call :func:`unavailable` before to skip cleanly where namespaces are not allowed.
    """
    global _counter
    if not 1 <= n <= 9:
        raise ValueError(f"1 to 9 hosts, got {n}")
    sweep_stale()
    _counter += 1
    tag = f"{os.getpid()}x{_counter}"
    prefix = _free_subnet(os.getpid() * 7 + _counter)
    names = [f"h{i}" for i in range(1, n + 1)]
    workdir = Path(tempfile.mkdtemp(prefix=f"{NS_PREFIX}{tag}-", dir=TMP_ROOT))
    shm_dir = SHM_ROOT / f"{NS_PREFIX}{tag}"
    hosts = Hosts(
        names=names, slots=slots, tag=tag, subnet=f"{prefix}.0/24",
        bridge=f"{BRIDGE_PREFIX}{tag}",
        netns={h: f"{NS_PREFIX}{tag}-{h}" for h in names},
        addresses={h: f"{prefix}.{10 + i}" for i, h in enumerate(names, 1)},
        shm={h: shm_dir / h for h in names},
        workdir=workdir, agent=workdir / "agent", hostfile=workdir / "hostfile",
    )
    try:
        _ip("link", "add", hosts.bridge, "type", "bridge")
        _ip("addr", "add", f"{prefix}.1/24", "dev", hosts.bridge)
        _ip("link", "set", hosts.bridge, "up")
        for h in names:
            ns, veth = hosts.netns[h], f"{VETH_PREFIX}{tag}{h}"
            _ip("netns", "add", ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            hosts._links.append(veth)
            _ip("link", "set", veth, "master", hosts.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{hosts.addresses[h]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            hosts.shm[h].mkdir(parents=True)
        cases = "\n".join(f"  {h}) ns={shlex.quote(hosts.netns[h])}; "
                          f"shm={shlex.quote(str(hosts.shm[h]))} ;;" for h in names)
        hosts.agent.write_text(AGENT.format(cases=cases, path=AGENT_PATH,
                                            log=shlex.quote(str(workdir / "agent.log"))))
        hosts.agent.chmod(0o755)
        hosts.hostfile.write_text("".join(f"{h} slots={slots}\n" for h in names))
        probe = hosts.run_on(names[-1], "hostname; ls -A /dev/shm")
        if probe.returncode != 0 or probe.stdout.split() != [names[-1]]:
            raise RuntimeError(f"the launch agent does not work here: {probe.stdout!r} "
                               f"{probe.stderr.strip()!r}")
    except BaseException:
        hosts.close()
        raise
    return hosts


@contextlib.contextmanager
def hosts_up(n: int = 2, slots: int = 2) -> Iterator[Hosts]:
    """:func:`make_hosts` as a context manager: torn down however the block ends."""
    hosts = make_hosts(n, slots)
    try:
        yield hosts
    finally:
        hosts.close()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.multihost --hosts N [--slots S] -- COMMAND...``: run COMMAND with
    N namespaced hosts up (see the module docstring), then remove them."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--rate", default=None, help="link rate (tc tbf), e.g. 1gbit")
    parser.add_argument("--delay", default=None, help="link delay (tc netem), e.g. 100us")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    why = unavailable()
    if why:
        print(f"multihost: {why}", file=sys.stderr)
        return 2
    with hosts_up(args.hosts, args.slots) as hosts:
        if args.rate or args.delay:
            hosts.shape(args.rate, args.delay)
        env = dict(os.environ)
        env.pop("PRTE_MCA_rmaps_default_mapping_policy", None)
        env.update(hosts.mpi_env(), MULTIHOST_HOSTS=hosts.host_list,
                   MULTIHOST_HOSTFILE=str(hosts.hostfile))
        print(f"multihost: {hosts.host_list} on {hosts.subnet} (bridge {hosts.bridge})",
              file=sys.stderr)
        if not command:
            return 0
        proc = subprocess.Popen(command, env=env)
        try:
            return proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            return proc.wait()


if __name__ == "__main__":
    sys.exit(main())
