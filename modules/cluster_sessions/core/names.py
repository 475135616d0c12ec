"""Names every layer shares, each decided here once (as Kubeflow keeps its ``Env*`` names):
the project, the labels on what a session makes, the stack configuration keys, the prefix of
the cluster variables, the default master port and the demo image.

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

CONFIG_NAMESPACE = PROJECT
DEFINITION_KEY = "definition"  # a session stack's ClusterSession file
POOL_KEY = "pool"  # a pool file that replaces the definition's own
INDEX_KEY = "index"  # which of a count's sessions the stack runs
POOL_DEFINITION_KEY = "pool-definition"  # a pool stack's AgentPool file


def config_key(name: str) -> str:
    """The full stack config key, e.g. ``cluster-sessions:definition``."""
    return f"{CONFIG_NAMESPACE}:{name}"


CLUSTER_ENV_PREFIX = "BACKENDAI_"  # the cluster variables; a definition may not set them
DEFAULT_MASTER_PORT = 29500  # PyTorch's convention; Kubeflow uses it too

DEMO_IMAGE_REPOSITORY = f"{PROJECT}/debian-sshd"
DEMO_IMAGE = f"{DEMO_IMAGE_REPOSITORY}:latest"
