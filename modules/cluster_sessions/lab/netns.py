"""A local multi-agent lab: several Docker Engines on one machine, each in its own netns.

Layout (defaults; ``prefix`` and ``subnet`` change the names and the /24):

* a Linux bridge ``csl-br0`` holding the host address ``10.251.0.1/24``;
* per agent K a network namespace ``csl-agentK`` joined to the bridge by a veth pair
  (host side ``csl-vK``, namespace side ``eth0`` with ``10.251.0.(10+K)/24``, default route via
  the bridge address);
* in each namespace its own ``containerd``, its own ``dockerd`` (started with
  ``nsenter --net=...``, not ``ip netns exec``, which remounts /sys and hides the cgroup mounts
  dockerd needs) listening on ``<state_dir>/agentK/engine/docker.sock`` (root:docker 0660), and
  its own ``sshd`` on ``10.251.0.(10+K):22`` (key-only logins with the lab key
  ``<state_dir>/id_lab`` for the non-root user ``csl-ops``, a member of the ``docker`` group,
  and for root, which the lab's own steps use);
* the lab is a *remote* pool, as real GPU hosts are: the pool file names each engine by its
  path on the agent, ``unix:///run/csl-lab/<prefix>/engine/docker.sock``, the same on every
  agent, and says to log in as ``csl-ops``. Each sshd runs in a private mount namespace where
  that directory is a bind mount of its agent's ``engine`` directory (the directory, not the
  socket, so a restarted dockerd's new socket appears there); on this machine the directory is
  empty, so a program that hands the path to a local Docker client fails, as it would against
  a remote host. ``SetEnv DOCKER_HOST=`` names that path. The lab's own steps (waiting for the
  engines, engine IDs, stopping containers, importing images) use the local sockets;
* iptables on the host: bridged traffic between lab ports is accepted (with br_netfilter
  active, bridged frames traverse the host's FORWARD chain, whose policy Docker sets to DROP),
  anything the lab would route off the bridge is rejected (the lab never reaches beyond this
  machine); each engine resolves external names via the bridge address, where nothing answers.

Only one lab per ``prefix`` exists on a machine: the names above are machine-wide. The lab is
recorded in ``<state_dir>/lab.json`` and in ``/run/csl-lab/<prefix>/lab.json`` (the latter also
holds the short runtime directories dockerd needs: its exec-root must stay short because
libnetwork puts a socket named after a 64-character id inside it; the copy of
``authorized_keys`` sshd reads as the user logging in; the agent-side engine directory). The
``csl-ops`` account (and the ``docker`` group, if the lab had to create it) is shared by every
lab on the machine and stays after ``lab_down``.

This module brings the lab up, reports it and takes it down, in that order of steps; each step's
own module says how: ``requirements`` (root, programs), ``network`` (bridge, namespaces, veths,
iptables), ``ssh_access`` (the ``csl-ops`` account, keys, each agent's sshd), ``engines`` (each
agent's containerd and dockerd), ``pool_file`` (the AgentPool written for the lab), ``layout``
(names, addresses, records) and ``processes`` (starting, finding and stopping daemons). It is a
library (no argument parsing); ``sessionctl lab up/down/status`` wraps it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..core.names import DEMO_IMAGE
from .engines import (
    DOCKERD_GRACE,
    ENGINE_TIMEOUT,
    engine_id,
    has_tag,
    log_tails,
    spawn_containerd,
    spawn_dockerd,
    stop_containers,
    wait_for,
)
from .layout import (
    DEFAULT_PREFIX,
    DEFAULT_SUBNET,
    LAB_USER,
    MAX_AGENTS,
    MAX_SOCKET_PATH,
    NETNS_DIR,
    RECORD_VERSION,
    RUN_BASE,
    SAFE_PATH,
    AgentStatus,
    LabInfo,
    LabStatus,
    Layout,
    find_record,
    layout_for,
    layout_from_record,
    read_json,
    write_records,
)
from .network import (
    create_network,
    iptables_has,
    link_exists,
    links_left,
    netns_exists,
    remove_network,
)
from .pool_file import POOL_FILE_HEADER, scratch_root, storage_root, write_pool
from .processes import (
    LabError,
    alive,
    kill,
    pid_matching,
    pids_in_cgroups,
    pids_in_netns,
    read_pid,
    remove_cgroups,
    run,
    terminate,
    unmount_under,
)
from .requirements import check_root, check_tools
from .ssh_access import (
    SSHD_TIMEOUT,
    account_locked,
    ensure_keys,
    ensure_lab_user,
    spawn_sshd,
    sshd_answers,
)

Progress = Callable[[str], None]


def _noop(_msg: str) -> None:
    pass


def _info(lay: Layout, agents: int, pool_file: Path | None, ids: dict[int, str]) -> LabInfo:
    return LabInfo(
        state_dir=lay.state_dir,
        pool_file=pool_file,
        bridge=lay.bridge,
        bridge_address=lay.bridge_address,
        key_file=lay.key_file,
        known_hosts=lay.known_hosts,
        agents=tuple(lay.agent(k, ids.get(k, "")) for k in range(1, agents + 1)),
    )



def _start_agent_daemons(lay: Layout, agents: int, progress: Progress) -> dict:
    pids: dict[str, dict[str, int]] = {}
    # 1) one containerd per agent
    for k in range(1, agents + 1):
        pids[f"agent{k}"] = {"containerd": spawn_containerd(lay, k)}
    progress(f"started {agents} containerd")
    wait_for(
        lambda: all(lay.containerd_socket(k).exists() for k in range(1, agents + 1)),
        20, "containerd sockets", lay, agents,
    )
    # 2) dockerd
    for k in range(1, agents + 1):
        pids[f"agent{k}"]["dockerd"] = spawn_dockerd(lay, k)
    progress(f"started {agents} dockerd")
    # 3) sshd
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # its privilege-separation directory
    for k in range(1, agents + 1):
        pids[f"agent{k}"]["sshd"] = spawn_sshd(lay, k)
    progress(f"started {agents} sshd")
    return pids


# --------------------------------------------------------------------------- public API


def lab_up(
    agents: int,
    state_dir: Path,
    pool_file: Path | None,
    progress: Progress | None = None,
    *,
    prefix: str = DEFAULT_PREFIX,
    subnet: str = DEFAULT_SUBNET,
) -> LabInfo:
    """Bring up ``agents`` Docker Engines in network namespaces and write the pool file.

    Idempotent: when the same lab (same ``state_dir``, ``prefix`` and number of agents) is
    already up and healthy, it only rewrites the pool file. A lab with another number of agents
    is an error (``lab_down`` first); a half-working one is torn down and rebuilt. If bring-up
    fails, everything created so far is removed before the error is raised.
    """
    progress = progress or _noop
    check_root()
    check_tools()
    if not isinstance(agents, int) or not 1 <= agents <= MAX_AGENTS:
        raise LabError(f"agents must be between 1 and {MAX_AGENTS}, got {agents!r}")
    lay = layout_for(state_dir, prefix, subnet)
    if not SAFE_PATH.match(str(lay.state_dir)):
        raise LabError(f"state dir {lay.state_dir} may only contain letters, digits and _./+@-")
    if len(str(lay.socket(agents)).encode()) > MAX_SOCKET_PATH:
        raise LabError(f"state dir {lay.state_dir} is too long for a unix socket path "
                       f"({lay.socket(agents)}); choose a shorter one")
    if account_locked("root"):
        raise LabError("root's password is locked ('!' in /etc/shadow): sshd (UsePAM no) then "
                       "refuses key logins; unlock it without a password: usermod -p '*' root")
    pool_file = Path(pool_file).absolute() if pool_file is not None else None

    own = read_json(lay.state_record)
    if own is not None and own.get("prefix") != prefix:
        other = read_json(RUN_BASE / str(own.get("prefix")) / "lab.json")
        if other is not None and other.get("state_dir") == str(lay.state_dir):
            raise LabError(f"{lay.state_dir} holds a running lab with prefix "
                           f"{own.get('prefix')!r}; take it down first or use another state dir")

    existing = read_json(lay.run_record)
    if existing is not None:
        if existing.get("state_dir") != str(lay.state_dir):
            raise LabError(
                f"a lab with prefix {prefix!r} is already up from state dir "
                f"{existing.get('state_dir')}; take it down first (lab_down on that dir)"
            )
        if (existing.get("agents"), existing.get("subnet")) != (agents, str(lay.subnet)):
            raise LabError(
                f"the lab in {lay.state_dir} is up with {existing.get('agents')} agents on "
                f"{existing.get('subnet')}, not {agents} on {lay.subnet}; take it down first "
                f"(sessionctl lab down)"
            )
        status = lab_status(lay.state_dir)
        current = existing.get("user") == LAB_USER  # an older lab took root logins only
        if status.state == "up" and current:
            ids = {i + 1: a.engine_id for i, a in enumerate(status.agents)}
            for rule in lay.iptables_rules():  # a restarted host dockerd may have flushed them
                if not iptables_has(rule):
                    run(["iptables", "-w", "-I", rule[0], "1", *rule[1:]])
            info = _info(lay, agents, pool_file, ids)
            write_pool(info)
            existing["pool_file"] = str(pool_file) if pool_file else None
            write_records(lay, existing)
            progress(f"lab already up: {', '.join(info.names)}")
            return info
        state = status.state if current else "of an older kind (root logins only)"
        progress(f"lab in {lay.state_dir} is {state}; rebuilding it")
        lab_down(lay.state_dir, progress)
    else:
        clash = [n for n in [lay.bridge] if link_exists(n)]
        clash += [lay.netns(k) for k in range(1, agents + 1) if netns_exists(lay.netns(k))]
        if clash:
            raise LabError(
                f"{', '.join(clash)} exist(s) but no lab is recorded in {lay.run_record}; "
                f"remove them (ip link del / ip netns del) or choose another prefix"
            )

    t0 = time.monotonic()
    record = {
        "version": RECORD_VERSION,
        "prefix": prefix,
        "subnet": str(lay.subnet),
        "state_dir": str(lay.state_dir),
        "agents": agents,
        "pool_file": str(pool_file) if pool_file else None,
        "user": LAB_USER,
        "iptables": [],
        "pids": {},
        "state": "starting",
        "creator_pid": os.getpid(),
    }
    # recorded before anything is created, so lab_down always knows what to remove
    record["iptables"] = lay.iptables_rules()
    write_records(lay, record)
    try:
        ensure_lab_user()
        ensure_keys(lay, agents)
        create_network(lay, agents, progress)
        record["pids"] = _start_agent_daemons(lay, agents, progress)
        write_records(lay, record)

        ids: dict[int, str] = {}

        def engines_ready() -> bool:
            for k in range(1, agents + 1):
                if k not in ids:
                    dpid = record["pids"][f"agent{k}"]["dockerd"]
                    if not alive(dpid):
                        raise LabError(f"dockerd of agent{k} exited; see "
                                       f"{lay.agent_dir(k) / 'dockerd.log'}"
                                       + log_tails(lay, agents))
                    eid = engine_id(lay.socket(k), timeout=2)
                    if eid:
                        ids[k] = eid
            return len(ids) == agents

        wait_for(engines_ready, ENGINE_TIMEOUT, "the engines", lay, agents)
        if len(set(ids.values())) != agents:
            raise LabError(f"engines report duplicate IDs: {ids}")
        progress(f"{agents} engines answer")
        wait_for(lambda: all(sshd_answers(lay.address(k)) for k in range(1, agents + 1)),
                 SSHD_TIMEOUT, "sshd", lay, agents)
        info = _info(lay, agents, pool_file, ids)
        write_pool(info)
        record["state"] = "up"
        record["engine_ids"] = {f"agent{k}": v for k, v in ids.items()}
        write_records(lay, record)
    except BaseException:
        progress("bring-up failed; removing what was created")
        with contextlib.suppress(Exception):
            lab_down(lay.state_dir, progress)
        raise
    progress(f"lab up: {agents} agents in {time.monotonic() - t0:.1f}s"
             + (f", pool file {pool_file}" if pool_file else ""))
    return info


def lab_status(state_dir: Path) -> LabStatus:
    """What is running of the lab recorded in ``state_dir`` (never raises for a missing lab)."""
    state_dir = Path(state_dir).absolute()
    rec = find_record(state_dir)
    if rec is None:
        return LabStatus(state="down", state_dir=state_dir)
    lay = layout_from_record(rec)
    run_rec = read_json(lay.run_record)
    owned = run_rec is not None and run_rec.get("state_dir") == str(lay.state_dir)
    st = LabStatus(
        state="down",
        state_dir=lay.state_dir,
        prefix=lay.prefix,
        bridge=owned and link_exists(lay.bridge),
        pool_file=Path(rec["pool_file"]) if rec.get("pool_file") else None,
    )
    pids = rec.get("pids", {})
    for k in range(1, int(rec.get("agents", 0)) + 1):
        a = AgentStatus(name=f"agent{k}", address=lay.address(k))
        if owned:
            p = pids.get(f"agent{k}", {})
            a.netns = netns_exists(lay.netns(k))
            a.containerd = pid_matching(p.get("containerd"), str(lay.agent_dir(k))) is not None
            a.dockerd = pid_matching(p.get("dockerd"), str(lay.exec_root(k))) is not None
            a.engine_id = engine_id(lay.socket(k), timeout=2) if a.dockerd else ""
            a.image = has_tag(lay.socket(k), DEMO_IMAGE, timeout=2) if a.engine_id else None
            a.sshd = pid_matching(p.get("sshd"), str(lay.agent_dir(k))) is not None and (
                sshd_answers(lay.address(k))
            )
        else:
            a.error = "not running (another lab uses this prefix, or it was torn down)"
        st.agents.append(a)
    if st.agents and st.bridge and all(a.up for a in st.agents):
        st.state = "up"
    elif st.bridge or any(a.netns or a.dockerd or a.containerd or a.sshd for a in st.agents):
        st.state = "degraded"
    return st

def lab_down(state_dir: Path, progress: Progress | None = None, *,
             keep_keys: bool = False) -> None:
    """Tear the lab recorded in ``state_dir`` down completely. Idempotent.

    Stops containers, sshd, dockerd and containerd, kills whatever else still runs in the
    agents' namespaces or cgroups, unmounts and deletes the engines' data, removes namespaces,
    veths, the bridge and the iptables rules; then the lab's files: its SSH key, the agents'
    host keys, ``known_hosts``, the logs and the pool file ``lab_up`` wrote (``keep_keys``
    keeps the keys, ``known_hosts`` and logs, so that the next ``lab_up`` is known to the same
    clients). Raises ``LabError`` only if something is still there afterwards.
    """
    progress = progress or _noop
    check_root()
    state_dir = Path(state_dir).absolute()
    rec = find_record(state_dir)
    if rec is None:
        progress(f"no lab recorded in {state_dir}; nothing to do")
        return
    lay = layout_from_record(rec)
    run_rec = read_json(lay.run_record)
    n = int(rec.get("agents", 0))
    if run_rec is None or run_rec.get("state_dir") != str(lay.state_dir):
        # the machine-wide names are not ours (or already gone): only forget our record
        progress("lab is not running; removing its record")
        _cleanup_files(lay, n, run_record=False)
        _forget(lay, n, rec.get("pool_file"), progress, keep_keys=keep_keys)
        return
    t0 = time.monotonic()
    n = int(run_rec.get("agents", n))
    pids = run_rec.get("pids", {}) or rec.get("pids", {})

    def recorded(kind: str, k: int) -> int | None:
        marker = str(lay.exec_root(k)) if kind == "dockerd" else str(lay.agent_dir(k))
        pid = pid_matching(pids.get(f"agent{k}", {}).get(kind), marker)
        if kind == "dockerd" and pid is None:
            pid = pid_matching(read_pid(lay.agent_dir(k) / "docker.pid"), marker)
        return pid

    agent_nums = range(1, n + 1)
    sshd = [p for k in agent_nums if (p := recorded("sshd", k))]
    dockerd = {k: p for k in agent_nums if (p := recorded("dockerd", k))}
    containerd = {k: p for k in agent_nums if (p := recorded("containerd", k))}
    # an engine whose containerd is gone hangs on every container operation and on shutdown
    healthy = [k for k in dockerd if k in containerd]
    broken = [dockerd[k] for k in dockerd if k not in containerd]

    # 1) containers (all at once, no grace period), then the daemons
    threads = [threading.Thread(target=stop_containers, args=(lay.socket(k),), daemon=True)
               for k in healthy]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    progress(f"stopping {len(dockerd)} dockerd, {len(sshd)} sshd")
    for pid in broken:
        kill(pid, signal.SIGKILL)
    # a swarm member's graceful shutdown can wait 5 s on a gossip "leave" no peer will ever
    # receive (they all stop at once); the engines' data is deleted anyway, so be brief
    terminate(sshd + broken + [dockerd[k] for k in healthy], timeout=DOCKERD_GRACE)
    terminate(list(containerd.values()), timeout=10)

    # 2) anything left in the namespaces (shims, docker-proxy, ssh sessions) or in the agents'
    #    cgroups (container processes of a killed engine)
    for _ in range(3):
        rest: set[int] = set()
        for k in range(1, n + 1):
            rest |= pids_in_netns(NETNS_DIR / lay.netns(k))
            rest |= pids_in_cgroups(lay.netns(k))
        if not rest:
            break
        progress(f"killing {len(rest)} leftover processes")
        for pid in rest:
            kill(pid, signal.SIGKILL)
        terminate(rest, timeout=5)

    # 3) mounts, cgroups, namespaces, links, firewall
    roots = [lay.run_dir]
    for k in range(1, n + 1):
        roots += [lay.agent_dir(k) / "docker", lay.agent_dir(k) / "containerd"]
    unmount_under(roots)
    for k in range(1, n + 1):
        remove_cgroups(lay.netns(k))
    rules = run_rec.get("iptables") or lay.iptables_rules()
    remove_network(lay, n, rules)

    # 4) verify
    left = links_left(lay, n)
    survivors = [p for p in [*sshd, *dockerd.values(), *containerd.values()] if alive(p)]
    if survivors:
        left.append(f"processes {survivors}")
    left += [f"iptables rule {' '.join(r)}" for r in rules if iptables_has(r)]
    if left:
        raise LabError("lab_down could not remove: " + "; ".join(left))
    _cleanup_files(lay, n, run_record=True)
    _forget(lay, n, rec.get("pool_file"), progress, keep_keys=keep_keys)
    progress(f"lab down in {time.monotonic() - t0:.1f}s")


def _forget(lay: Layout, agents: int, pool_file: str | None, progress: Progress, *,
            keep_keys: bool) -> None:
    """Remove the files ``lab_up`` wrote outside the engines, and nothing else: the pool file
    if ``lab_up`` wrote it (it describes a lab that is gone); unless ``keep_keys``, the key
    pair, ``known_hosts``, ``authorized_keys``, each agent's folder (host keys, sshd config,
    logs) and the state directory once empty."""
    if pool_file:
        path = Path(pool_file)
        with contextlib.suppress(OSError):
            if path.read_text(errors="replace").startswith(POOL_FILE_HEADER):
                path.unlink()
                progress(f"removed the pool file {path}")
    if keep_keys:
        return
    for path in (lay.key_file, Path(f"{lay.key_file}.pub"), lay.known_hosts,
                 lay.authorized_keys):
        path.unlink(missing_ok=True)
    for k in range(1, agents + 1):
        shutil.rmtree(lay.agent_dir(k), ignore_errors=True)
    shutil.rmtree(scratch_root(lay.state_dir), ignore_errors=True)  # bundles: of no session now
    storage = storage_root(lay.state_dir)
    with contextlib.suppress(OSError):  # its data folders outlive sessions, and the lab too
        storage.rmdir()
    if storage.exists():
        progress(f"kept the lab's data folders in {storage} (remove them yourself)")
    with contextlib.suppress(OSError):
        lay.state_dir.rmdir()
    if lay.state_dir.exists():
        progress(f"left {lay.state_dir} in place: it holds files the lab did not write")


def _cleanup_files(lay: Layout, agents: int, *, run_record: bool) -> None:
    """Delete the engines' data and runtime files; keep keys, known_hosts and logs."""
    for k in range(1, agents + 1):
        d = lay.agent_dir(k)
        for sub in ("docker", "containerd", "engine"):
            if (d / sub).exists():
                unmount_under([d / sub])
                shutil.rmtree(d / sub, ignore_errors=True)
        # docker.sock: where a lab before the engine directory had its socket
        for name in ("docker.sock", "docker.pid", "sshd.pid", "key.json"):
            (d / name).unlink(missing_ok=True)
    if run_record:
        shutil.rmtree(lay.run_dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            RUN_BASE.rmdir()
    lay.state_record.unlink(missing_ok=True)
