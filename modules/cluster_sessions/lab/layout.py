"""The lab's layout and records: the names and addresses derived from a state directory, a
prefix and a /24 (namespaces, veths, the bridge, sockets, keys), the public types ``lab_up``
and ``lab_status`` return, and the JSON records that let ``lab_down`` find everything again."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .processes import LabError, run

RUN_BASE = Path("/run/csl-lab")
NETNS_DIR = Path("/var/run/netns")
DEFAULT_PREFIX = "csl"
DEFAULT_SUBNET = "10.251.0.0/24"
MAX_AGENTS = 32
RECORD_VERSION = 1
# sun_path is 108 bytes including the terminating NUL
MAX_SOCKET_PATH = 107
# the one non-root account of every lab agent (the agents share this machine's accounts)
LAB_USER = "csl-ops"
DOCKER_GROUP = "docker"

SAFE_PATH = re.compile(r"^[A-Za-z0-9_./+@-]+$")
PREFIX = re.compile(r"^[a-z][a-z0-9]{0,7}$")


# --------------------------------------------------------------------------- public types


@dataclass(frozen=True)
class LabAgent:
    name: str  # agent1
    index: int  # 1
    address: str  # 10.251.0.11 (also the swarm advertise address)
    netns: str  # csl-agent1
    socket: Path  # <state_dir>/agent1/engine/docker.sock, this machine's path (lab internals)
    agent_socket: Path  # /run/csl-lab/<prefix>/engine/docker.sock, the path on the agent
    engine_id: str = ""

    @property
    def docker_host(self) -> str:
        """The engine as the pool names it: a socket on the agent, reached over SSH."""
        return f"unix://{self.agent_socket}"

    @property
    def netns_path(self) -> Path:
        return NETNS_DIR / self.netns


@dataclass(frozen=True)
class LabInfo:
    state_dir: Path
    pool_file: Path | None
    bridge: str
    bridge_address: str
    key_file: Path
    known_hosts: Path
    agents: tuple[LabAgent, ...]
    user: str = LAB_USER  # the non-root user (in the docker group) the pool logs in as

    @property
    def names(self) -> list[str]:
        return [a.name for a in self.agents]

    @property
    def addresses(self) -> list[str]:
        return [a.address for a in self.agents]

    @property
    def sockets(self) -> list[Path]:
        return [a.socket for a in self.agents]


@dataclass
class AgentStatus:
    name: str
    address: str
    netns: bool = False
    dockerd: bool = False
    containerd: bool = False
    sshd: bool = False
    engine_id: str = ""
    error: str = ""
    image: bool | None = None  # the demo image's tag is on its engine (None: not asked)

    @property
    def up(self) -> bool:
        return all((self.netns, self.dockerd, self.containerd, self.sshd, self.engine_id))


@dataclass
class LabStatus:
    state: str  # "down" | "up" | "degraded"
    state_dir: Path
    prefix: str = DEFAULT_PREFIX
    bridge: bool = False
    pool_file: Path | None = None
    agents: list[AgentStatus] = field(default_factory=list)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["state_dir"] = str(self.state_dir)
        d["pool_file"] = str(self.pool_file) if self.pool_file else None
        for a, st in zip(d["agents"], self.agents, strict=True):
            a["up"] = st.up
        return d


# --------------------------------------------------------------------------- naming


@dataclass(frozen=True)
class Layout:
    state_dir: Path
    prefix: str
    subnet: ipaddress.IPv4Network

    @property
    def run_dir(self) -> Path:
        return RUN_BASE / self.prefix

    @property
    def run_record(self) -> Path:
        return self.run_dir / "lab.json"

    @property
    def state_record(self) -> Path:
        return self.state_dir / "lab.json"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br0"

    @property
    def bridge_address(self) -> str:
        return str(self.subnet[1])

    @property
    def key_file(self) -> Path:
        return self.state_dir / "id_lab"

    @property
    def known_hosts(self) -> Path:
        return self.state_dir / "known_hosts"

    @property
    def authorized_keys(self) -> Path:
        return self.state_dir / "authorized_keys"

    @property
    def run_authorized_keys(self) -> Path:
        """The copy sshd reads: it reads as the user logging in, who cannot enter a state dir
        that is private (0700 below /tmp)."""
        return self.run_dir / "authorized_keys"

    @property
    def agent_engine_dir(self) -> Path:
        """The engine's directory as every agent sees it: in each sshd's private mount
        namespace a bind mount of that agent's ``engine_dir``, empty everywhere else."""
        return self.run_dir / "engine"

    @property
    def agent_socket(self) -> Path:
        return self.agent_engine_dir / "docker.sock"

    def netns(self, k: int) -> str:
        return f"{self.prefix}-agent{k}"

    def veth(self, k: int) -> str:
        return f"{self.prefix}-v{k}"

    def address(self, k: int) -> str:
        return str(self.subnet[10 + k])

    def bip(self, k: int) -> str:
        # docker0 inside the agent's namespace; distinct per agent so that addresses seen in
        # logs and traces tell the agents apart
        return f"172.31.{k}.1/24"

    def agent_dir(self, k: int) -> Path:
        return self.state_dir / f"agent{k}"

    def engine_dir(self, k: int) -> Path:
        return self.agent_dir(k) / "engine"

    def socket(self, k: int) -> Path:
        return self.engine_dir(k) / "docker.sock"

    def exec_root(self, k: int) -> Path:
        return self.run_dir / f"a{k}"

    def containerd_state(self, k: int) -> Path:
        return self.run_dir / f"c{k}"

    def containerd_socket(self, k: int) -> Path:
        return self.containerd_state(k) / "containerd.sock"

    def agent(self, k: int, engine_id: str = "") -> LabAgent:
        return LabAgent(
            name=f"agent{k}",
            index=k,
            address=self.address(k),
            netns=self.netns(k),
            socket=self.socket(k),
            agent_socket=self.agent_socket,
            engine_id=engine_id,
        )

    def iptables_rules(self) -> list[list[str]]:
        br = self.bridge
        rules = [
            # bridged frames pass the host FORWARD chain when br_netfilter is active
            ["FORWARD", "-i", br, "-o", br, "-j", "ACCEPT"],
            # nothing the agents route via the host may leave the lab
            ["FORWARD", "-i", br, "!", "-o", br, "-j", "REJECT"],
        ]
        if _iptables_chain_exists("DOCKER-USER"):
            rules.append(["DOCKER-USER", "-i", br, "-o", br, "-j", "ACCEPT"])
        return rules


def layout_for(state_dir: Path, prefix: str, subnet: str) -> Layout:
    if not PREFIX.match(prefix):
        raise LabError(f"prefix {prefix!r} must be 1-8 lowercase letters/digits, starting a letter")
    try:
        net = ipaddress.IPv4Network(subnet)
    except ValueError as exc:
        raise LabError(f"subnet {subnet!r}: {exc}") from None
    if net.prefixlen != 24 or not net.is_private:
        raise LabError(f"subnet {subnet!r} must be a private /24")
    return Layout(Path(state_dir).absolute(), prefix, net)


def write_private(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    tmp.replace(path)


# --------------------------------------------------------------------------- records


def read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("version") == RECORD_VERSION else None


def write_records(lay: Layout, record: dict) -> None:
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    lay.run_dir.mkdir(parents=True, exist_ok=True)
    lay.state_dir.mkdir(parents=True, exist_ok=True)
    write_private(lay.run_record, text)
    write_private(lay.state_record, text)


def find_record(state_dir: Path) -> dict | None:
    """The lab recorded for ``state_dir``: its own record, else a runtime record naming it."""
    state_dir = Path(state_dir).absolute()
    rec = read_json(state_dir / "lab.json")
    if rec is not None:
        return rec
    with contextlib.suppress(OSError):
        for run_rec in sorted(RUN_BASE.glob("*/lab.json")):
            rec = read_json(run_rec)
            if rec is not None and rec.get("state_dir") == str(state_dir):
                return rec
    return None


def layout_from_record(rec: dict) -> Layout:
    return layout_for(Path(rec["state_dir"]), rec["prefix"], rec["subnet"])


def _iptables_chain_exists(chain: str) -> bool:
    return run(["iptables", "-w", "-n", "-L", chain], check=False).returncode == 0
