"""Dynamic providers pickled at their old module paths still load (compat_pickle).

The pickles below were made by ``pulumi.dynamic.dynamic.serialize_provider`` at commit
7f9e439^, the last one before the layers got folders: what a stack created then holds in its
state as ``__provider``. Pulumi's dynamic provider host is a fresh interpreter that only
unpickles, so that is where they are loaded.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import dill
import pytest

from cluster_sessions import compat_pickle
from cluster_sessions.pulumi_layer.keystore import SessionKeysProvider
from cluster_sessions.pulumi_layer.swarm import SwarmManagerProvider, SwarmWorkerProvider

PICKLED_BEFORE_THE_MOVE = {
    "cluster_sessions.keystore.SessionKeysProvider":
        "gASVOAAAAAAAAACMGWNsdXN0ZXJfc2Vzc2lvbnMua2V5c3RvcmWUjBNTZXNzaW9uS2V5c1Byb3ZpZGVylJOUKYGULg==",
    "cluster_sessions.agents.swarm.SwarmManagerProvider":
        "gASVPQAAAAAAAACMHWNsdXN0ZXJfc2Vzc2lvbnMuYWdlbnRzLnN3YXJtlIwUU3dhcm1NYW5hZ2VyUHJvdmlkZXKUk5QpgZQu",
    "cluster_sessions.agents.swarm.SwarmWorkerProvider":
        "gASVPAAAAAAAAACMHWNsdXN0ZXJfc2Vzc2lvbnMuYWdlbnRzLnN3YXJtlIwTU3dhcm1Xb3JrZXJQcm92aWRlcpSTlCmBlC4=",
}
NOW = {
    "cluster_sessions.keystore.SessionKeysProvider": SessionKeysProvider,
    "cluster_sessions.agents.swarm.SwarmManagerProvider": SwarmManagerProvider,
    "cluster_sessions.agents.swarm.SwarmWorkerProvider": SwarmWorkerProvider,
}

PACKAGE = Path(compat_pickle.__file__).parent


def fresh_python(code: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a new interpreter that imports this checkout's package."""
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=60, env=env)


@pytest.mark.parametrize("old_path", sorted(PICKLED_BEFORE_THE_MOVE))
def test_a_provider_pickled_at_its_old_path_loads_as_the_class_that_holds_it_now(old_path):
    raw = base64.b64decode(PICKLED_BEFORE_THE_MOVE[old_path])
    assert old_path.rsplit(".", 1)[0].encode() in raw, "the pickle names the old path"
    assert type(dill.loads(raw)) is NOW[old_path]


def test_old_pickles_load_and_work_in_a_fresh_interpreter_like_pulumi_s_provider_host():
    code = (
        "import base64, json, sys, dill\n"
        "pickles = json.loads(sys.argv[1])\n"
        "for old, blob in sorted(pickles.items()):\n"
        "    p = dill.loads(base64.b64decode(blob))\n"
        "    print(old, type(p).__module__ + '.' + type(p).__qualname__)\n"
        "blob = pickles['cluster_sessions.keystore.SessionKeysProvider']\n"
        "p = dill.loads(base64.b64decode(blob))\n"
        "print('hosts', sorted(p.create({'hosts': ['main1']}).outs['host_public']))\n"
    )
    out = fresh_python(code, json.dumps(PICKLED_BEFORE_THE_MOVE))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:-1] == [f"{old} {cls.__module__}.{cls.__qualname__}"
                          for old, cls in sorted(NOW.items())]
    assert lines[-1] == "hosts ['main1']"


def test_an_old_path_imports_as_the_same_module_not_a_copy():
    import cluster_sessions.agents.swarm as old_swarm
    import cluster_sessions.keystore as old_keystore
    from cluster_sessions.pulumi_layer import keystore, swarm

    assert old_keystore is keystore and old_swarm is swarm
    assert old_swarm.SwarmWorkerProvider is SwarmWorkerProvider


def test_the_old_paths_are_answered_only_by_the_compat_module():
    for old in compat_pickle.MOVED:
        relative = old.removeprefix("cluster_sessions.").replace(".", "/")
        assert not (PACKAGE / f"{relative}.py").exists(), old
        assert not (PACKAGE / relative).is_dir(), old


def test_importing_the_package_imports_no_provider_and_other_names_still_fail():
    code = (
        "import sys, cluster_sessions\n"
        "print(sorted(m for m in sys.modules if m.startswith(('pulumi', 'cluster_sessions.'))))\n"
        "try:\n"
        "    import cluster_sessions.agents.keystore\n"
        "except ModuleNotFoundError as e:\n"
        "    print(e.name)\n"
    )
    out = fresh_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["['cluster_sessions.compat_pickle']",
                                       "cluster_sessions.agents.keystore"]


def test_installing_twice_adds_one_finder():
    compat_pickle.install()
    compat_pickle.install()
    assert sum(isinstance(f, compat_pickle.MovedModules) for f in sys.meta_path) == 1
