"""Names every layer shares, each decided here once (as Kubeflow keeps its ``Env*`` names):
the project, the labels on what a session makes, the stack configuration keys, the prefix of
the cluster variables, the default master port, the demo image, the default engine socket
and the project's stacks directory (docs/design-notes.md, "Where each fact is decided").

The plan writes the labels; the agents' facts, ``status``, ``ls`` and the cleanup read them
back; the driver sets the config keys and the programs read them.
"""

from __future__ import annotations

PROJECT = "cluster-sessions"  # the Pulumi project (Pulumi.yaml) and the config namespace

LABEL_PREFIX = PROJECT
SESSION_LABEL = f"{LABEL_PREFIX}.session"
SESSION_ID_LABEL = f"{LABEL_PREFIX}.session-id"
HOST_LABEL = f"{LABEL_PREFIX}.host"
ROLE_LABEL = f"{LABEL_PREFIX}.role"
# The SHA-256 of a container's public bundle files, so that a preview shows an entrypoint
# change (the bundle itself is a secret upload).
BUNDLE_DIGEST_LABEL = f"{LABEL_PREFIX}.bundle-digest"
# Where the engine a container or network was made on is (agents.reach.Reach.endpoint): labels
# force a new resource, so an agent that now points elsewhere gets its containers made anew
# there (deleted through the old provider) instead of keeping a state entry for the old host.
ENDPOINT_LABEL = f"{LABEL_PREFIX}.endpoint"
KERNEL_ID_LABEL = f"{LABEL_PREFIX}.kernel-id"
# What a container holds (capacity probes read them back: agents/facts.py)
CPU_LABEL = f"{LABEL_PREFIX}.cpu"
MEM_LABEL = f"{LABEL_PREFIX}.mem"
GPUS_LABEL = f"{LABEL_PREFIX}.gpus"
# A session network's MTU and encryption (the provider does not compare its ``options``)
MTU_LABEL = f"{LABEL_PREFIX}.mtu"
ENCRYPTED_LABEL = f"{LABEL_PREFIX}.encrypted"
# On the never-started marker containers of a pool's ledger (agents/pool_ledger.py): which
# kind (lock | reservation | queue), of which pool and session, who holds it, its lease
# (seconds from its creation), a queue entry's arrival, a reservation's holdings (JSON)
LEDGER_KIND_LABEL = f"{LABEL_PREFIX}.ledger"
LEDGER_POOL_LABEL = f"{LABEL_PREFIX}.ledger-pool"
LEDGER_SESSION_LABEL = f"{LABEL_PREFIX}.ledger-session"
LEDGER_STACK_LABEL = f"{LABEL_PREFIX}.ledger-stack-id"
LEDGER_HOLDER_LABEL = f"{LABEL_PREFIX}.ledger-holder"
LEDGER_LEASE_LABEL = f"{LABEL_PREFIX}.ledger-lease"
LEDGER_ARRIVAL_LABEL = f"{LABEL_PREFIX}.ledger-arrival"
LEDGER_HOLDS_LABEL = f"{LABEL_PREFIX}.ledger-holds"
# Whose a session's objects are (core/decisions.py): the stack's identity (``stack-id``), and
# to name it when another stack wants the same session name, the stack's name and who made it.
# Every verb touches only the objects carrying its own stack's id.
STACK_ID_LABEL = f"{LABEL_PREFIX}.stack-id"
# the project a session runs under (core/governance.py), on its containers, network and its
# reservations and queue entries; absent: the pool's default policy
PROJECT_LABEL = f"{LABEL_PREFIX}.project"
LEDGER_PROJECT_LABEL = f"{LABEL_PREFIX}.ledger-project"
# when the session's lifetime ends (epoch seconds): a container that is not running after it
# holds nothing (core.ledger.expired_container)
EXPIRES_LABEL = f"{LABEL_PREFIX}.expires-at"
# how many containers a reservation's session will have (a project's containers quota)
LEDGER_CONTAINERS_LABEL = f"{LABEL_PREFIX}.ledger-containers"
# a queue entry's priority (0-100): believed up to its project's max_priority (core.ledger)
LEDGER_PRIORITY_LABEL = f"{LABEL_PREFIX}.ledger-priority"
# a queue entry's ask in all, "MILLICPU,MEM,GPUS": who may pass it (core.admission)
LEDGER_ASKS_LABEL = f"{LABEL_PREFIX}.ledger-asks"
STACK_LABEL = f"{LABEL_PREFIX}.stack"
MADE_BY_LABEL = f"{LABEL_PREFIX}.made-by"
#: on the short-lived, never started container that makes a data folder (agents/folders.py)
FOLDER_HELPER_LABEL = f"{LABEL_PREFIX}.folder-helper"


def session_label_filter(session: str | None = None) -> str:
    """The engine's label filter for one session's objects, or (no name) any session's."""
    return f"{SESSION_LABEL}={session}" if session else SESSION_LABEL


CONFIG_NAMESPACE = PROJECT
DEFINITION_KEY = "definition"  # a session stack's ClusterSession file
POOL_KEY = "pool"  # a pool file that replaces the definition's own
INDEX_KEY = "index"  # which of a count's sessions the stack runs
POOL_DEFINITION_KEY = "pool-definition"  # a pool stack's AgentPool file
# the host port of each service of main1, JSON {"name": port}: chosen by `sessionctl up` from
# what main1's agent publishes (core.services), read by the program
SERVICE_PORTS_KEY = "service-ports"
# kept decisions (core/decisions.py): the stack's identity on a pool, and where each container
# runs (agent, GPU ids) with the shape it was decided for
STACK_ID_KEY = "stack-id"
# who made the stack (user@host), written with a new stack-id: a holder named in a refusal
MADE_BY_KEY = "made-by"
PLACEMENT_KEY = "placement"
# the image every container runs, resolved once to a content digest (a registry's) or an image
# ID (one only the agents hold), JSON {"ref", "digest", "local"}: core/decisions.py
IMAGE_KEY = "image"
# governance (core/governance.py): the project the operator's run granted, and when the
# session's lifetime ends (epoch seconds), decided at its first `up`
PROJECT_KEY = "project"
EXPIRES_KEY = "expires-at"


# The project's folder of stack configs and the files they name, beside Pulumi.yaml; the
# built-in pools are in its ``pools`` folder.
STACKS_DIR = "stacks"
POOLS_DIR = "pools"


def config_key(name: str) -> str:
    """The full stack config key, e.g. ``cluster-sessions:definition``."""
    return f"{CONFIG_NAMESPACE}:{name}"


CLUSTER_ENV_PREFIX = "BACKENDAI_"  # the cluster variables; a definition may not set them
# What sshd sets for each session (SSH_CONNECTION, SSH_ORIGINAL_COMMAND, SSH_AUTH_SOCK, ...) and
# ssh and ssh-agent read: a definition may not set them either (it would steer the ForceCommand
# wrapper and the user's ssh, whose values must be sshd's)
SSH_ENV_PREFIX = "SSH_"
DEFAULT_MASTER_PORT = 29500  # PyTorch's convention; Kubeflow uses it too

DEMO_IMAGE_REPOSITORY = f"{PROJECT}/debian-sshd"
DEMO_IMAGE = f"{DEMO_IMAGE_REPOSITORY}:latest"

# Where Docker Engines listen by default; an agent's docker_host defaults to it (on the agent,
# when the agent has an ssh block).
DEFAULT_DOCKER_SOCKET = "/var/run/docker.sock"
DEFAULT_DOCKER_HOST = f"unix://{DEFAULT_DOCKER_SOCKET}"
# The same engine by the name most distributions also give it (/var/run links to /run)
DEFAULT_DOCKER_HOSTS = (DEFAULT_DOCKER_HOST, "unix:///run/docker.sock")
# What the docker provider reads from its environment when the program leaves the key unset
# (kreuzwerker provider.go 59-102): DOCKER_CONTEXT even *overrides* an explicit host
# (204-217), and DOCKER_CERT_PATH or *_MATERIAL make it try TLS before SSH (config.go
# 129-166). The program refuses to run with any of them set.
PROVIDER_STEERING_ENV = ("DOCKER_CONTEXT", "DOCKER_CERT_PATH", "DOCKER_CA_MATERIAL",
                         "DOCKER_CERT_MATERIAL", "DOCKER_KEY_MATERIAL", "DOCKER_SSH_OPTS")
# What the caller's shell may hold that would steer a Docker client (docker/cli, the SDK) or
# the provider elsewhere than the pool says; the driver removes them before it starts pulumi.
DOCKER_CLIENT_ENV = ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_TLS", *PROVIDER_STEERING_ENV)
