"""What the agents layer raises when agents cannot be used: light to import (the CLI catches it
on every verb), and free of exit codes, which are the driver's to choose."""


class AgentsUnusable(Exception):
    """One or more agents of a pool cannot be used; the message has one line per agent."""
