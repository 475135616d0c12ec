"""``sessionctl`` with the emulated Automation API, as a process of its own (one a test can
interrupt): ``python -m tests.standin.sessionctl up FILE --yes``.

The stand-in (the tests that still use it: docs/testing.md), with its stacks kept in
the file backend ``PULUMI_BACKEND_URL`` names, so that the next process sees what this one
finished. Each stack's config is the project's ``stacks/Pulumi.<stack>.yaml``, as the CLI
keeps it, or in the directory ``CLUSTER_SESSIONS_EMULATION_CONFIG_DIR`` names (tests: the
checkout's ``stacks/`` holds the committed example stacks).
``CLUSTER_SESSIONS_EMULATION_FAULT`` (see :mod:`.docker_builder`) says where to interrupt it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cluster_sessions.driver import cli, stacks

from .automation import CONFIG_DIR_ENV, Backend  # noqa: F401 (the tests' name for it)


def install(backend: Backend, setattr_: Callable[[Any, str, Any], None] = setattr) -> None:
    """What the stand-in patches, so the engine verbs reach ``backend``."""
    setattr_(stacks, "open_stack", backend.open_stack)
    setattr_(stacks, "open_workspace", backend.open_workspace)
    setattr_(stacks, "find_pulumi", lambda environ: Path("/emulated/bin/pulumi"))


def main(argv: list[str]) -> None:
    url = os.environ["PULUMI_BACKEND_URL"]
    # the stacks' config: $CLUSTER_SESSIONS_EMULATION_CONFIG_DIR, else the project's (the CLI's)
    install(Backend(Path(url.removeprefix("file://"))))
    code = cli.main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # an interrupted run's engine threads must not keep the process alive


if __name__ == "__main__":
    main(sys.argv[1:])
