"""The Pulumi program: this stack's session definition, planned and built as one Session.

``pulumi up -s <stack>`` runs this file from the project directory. The stack's configuration
(``stacks/Pulumi.<stack>.yaml``) names the definition; see
``cluster_sessions.pulumi_layer.program``.
"""

import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parent
MODULES = PROJECT / "modules"

# Run the code of this checkout even when the package is not installed.
if (MODULES / "cluster_sessions").is_dir() and str(MODULES) not in sys.path:
    sys.path.insert(0, str(MODULES))

from cluster_sessions.pulumi_layer.pool_program import is_pool_stack  # noqa: E402
from cluster_sessions.pulumi_layer.pool_program import run as run_pool  # noqa: E402
from cluster_sessions.pulumi_layer.program import run  # noqa: E402

# A pool stack (cluster-sessions:pool-definition) builds the pool's swarm; every other stack
# is one session.
(run_pool if is_pool_stack() else run)(PROJECT)
