"""What the agents layer raises when agents cannot be used: light to import (the CLI catches it
on every verb). Its place in the error tree (core/errors.py) says what it means: a missing
prerequisite."""

from ..core.errors import MissingPrerequisite


class AgentsUnusable(MissingPrerequisite):
    """One or more agents of a pool cannot be used; the message has one line per agent."""
