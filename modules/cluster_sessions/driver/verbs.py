"""Verbs that live outside ``cli.py``: each module named here has ``register(subparsers)``.

Keeping the list in one place means ``sessionctl --help`` shows every verb, while each verb's
code stays next to the concept it drives. Add one line per module.
"""

from __future__ import annotations

from importlib import import_module

MODULES: list[str] = [
    "cluster_sessions.driver.render_verb",
    "cluster_sessions.driver.stacks",
    "cluster_sessions.driver.status",
    "cluster_sessions.driver.logs",
    "cluster_sessions.driver.wait_verb",
    "cluster_sessions.driver.jobs",
    "cluster_sessions.driver.listing",
    "cluster_sessions.driver.diff_verb",
    "cluster_sessions.driver.pool_verbs",
    "cluster_sessions.driver.lab_verbs",
    "cluster_sessions.driver.access",
]


def register_all(subparsers) -> None:
    for name in MODULES:
        import_module(name).register(subparsers)
