"""Verbs that live outside ``cli.py``: each module named here has ``register(subparsers)``.

Keeping the list in one place means ``sessionctl --help`` shows every verb, while each verb's
code stays next to the concept it drives. Add one line per module.
"""

from __future__ import annotations

import argparse
import functools
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
    "cluster_sessions.driver.open_verb",
    "cluster_sessions.driver.top",
    "cluster_sessions.driver.extend_verb",
]


def register_all(subparsers) -> None:
    for name in MODULES:
        import_module(name).register(subparsers)


@functools.cache
def pulumi_verbs() -> tuple[str, ...]:
    """Every verb marked with :func:`.session_args.needs_pulumi` (``pool up`` for a verb of a
    verb), in ``--help`` order, read from the parsers themselves: the missing-CLI message
    names each one that prints it, and a new verb cannot be left out of it."""
    parser = argparse.ArgumentParser()
    register_all(parser.add_subparsers())
    return tuple(_marked(parser, ""))


def _marked(parser: argparse.ArgumentParser, prefix: str) -> list[str]:
    found = []
    for action in parser._actions:  # argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if sub.get_default("needs_pulumi"):
                    found.append(prefix + name)
                found += _marked(sub, f"{prefix}{name} ")
    return found
