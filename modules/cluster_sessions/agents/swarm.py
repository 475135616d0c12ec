"""Where :mod:`cluster_sessions.pulumi_layer.swarm` lived before the layers got folders.

A pool stack's state holds the swarm resources' dynamic providers pickled *by reference* to
this module; Pulumi unpickles those old providers to update or delete them. Keeping the names
here lets pool stacks created before the move still be updated and destroyed.
"""

from ..pulumi_layer.swarm import SwarmManagerProvider, SwarmWorkerProvider

__all__ = ["SwarmManagerProvider", "SwarmWorkerProvider"]
