"""Old module paths of the pickled dynamic providers, so stacks made before a move still change.

A stack's state holds each dynamic provider pickled by dill *by reference*: a module path and a
class name. Pulumi's dynamic provider host unpickles it to update or delete the resource, and a
provider whose diff reports no change keeps the pickle it was created with. Stacks created
before the layers got folders (commit 7f9e439) therefore name the providers where they lived
then. :data:`MOVED` answers those paths with the modules that hold the providers now: the same
module object, so the same classes. Importing :mod:`cluster_sessions` (unpickling does that
first) installs the finder; nothing is imported until an old path is asked for.

When it can go: when no stack's state names an old path any more, that is once every session and
pool stack created before 7f9e439 has been destroyed (or its key store and swarm resources
replaced). Each ``__provider`` in ``pulumi stack export`` is the base64 of the pickle; decoded,
it shows the module path.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType

#: old module path -> the module that holds its dynamic providers now
MOVED = {
    "cluster_sessions.keystore": "cluster_sessions.pulumi_layer.keystore",
    "cluster_sessions.agents.swarm": "cluster_sessions.pulumi_layer.swarm",
}


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path of :data:`MOVED` and loads it as the module at its new path."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec) -> ModuleType:
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module at the new path is already loaded."""


def install() -> None:
    """Answer the old paths from now on (once; after the normal finders, so a file wins)."""
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(MovedModules())
