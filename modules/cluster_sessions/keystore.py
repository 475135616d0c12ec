"""Where :mod:`cluster_sessions.pulumi_layer.keystore` lived before the layers got folders.

A stack's state holds the key store's dynamic provider pickled *by reference* to this module;
Pulumi unpickles that old provider to update or delete the resource. Keeping the name here
lets stacks created before the move still be updated and destroyed.
"""

from .pulumi_layer.keystore import SessionKeysProvider

__all__ = ["SessionKeysProvider"]
