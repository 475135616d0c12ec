"""``sessionctl schema`` and the loader agree (issue 21, class 11): for generated documents,
whatever the loader accepts validates against the schema, and whatever the schema accepts
the models accept. The rules across fields (``session_problems``, ``pool_problems``: names,
shmem below mem, mount targets, ...) and the range of a size written with a unit are the
loader's alone; the schema is the shape every field has."""

from __future__ import annotations

import copy

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from cluster_sessions.core.loader import as_json_numbers, parse_yaml, to_model
from cluster_sessions.core.problems import DefinitionError
from cluster_sessions.core.spec import KINDS
from cluster_sessions.driver.cli import definitions_schema

from . import factories

VALIDATOR = jsonschema.Draft202012Validator(definitions_schema())
SESSION = {**factories.session("agree-demo", pool="/nonexistent/pool.yaml", size=2),
           "env": {"A": "b"}, "command": ["sleep", "1"],
           "mounts": [{"source": "vol", "target": "/data/x", "read_only": True}],
           "ports": [{"container": 8888}], "user": {"name": "alice", "uid": 2000, "gid": 2000},
           "distributed": {"master_port": 29500, "slots": 1}, "readiness": {"timeout": 60},
           "count": 1, "type": "interactive", "restart": "no"}
POOL = {**factories.pool("agree", factories.agent(gpus=(0, 1))),
        "swarm": {"manager": "agent1"}, "network": {"mtu": 1450, "encrypted": False},
        "mount_sources": ["/srv"], "scheduler": {"selector": "dispersed"}}

SCALARS = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-2**70, max_value=2**70),
    st.sampled_from([0, 1, 2, 576, 999, 1000, 1024, 2048, 2049, 9216, 29500, 59999, 60000,
                     65534, 65535, 65536, 2**31 - 2, 2**31 - 1, 2**63 - 1, 2**63]),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.sampled_from([0.0, 1.0, 2.0, 0.5, 2.5, 1e3, 4096.0, 0.001, 0.0005]),
    st.text(max_size=8),
    st.sampled_from(["", "x", "work", "single-node", "multi-node", "batch", "tcp", "udp",
                     "no", "always", "ClusterSession", "AgentPool", "concentrated",
                     "roundrobin"]),
)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3),
    st.dictionaries(st.sampled_from(["name", "size", "mode", "x", "cpu", "mem", "gpus",
                                     "source", "target", "container", "A"]), inner,
                    max_size=3)), max_leaves=6)


def paths(doc: object, prefix: tuple = ()) -> list[tuple]:
    """Every place in ``doc`` a value can be replaced (sizes left out: their unit strings are
    range-checked by the loader only)."""
    found = [prefix] if prefix else []
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key in ("mem", "shmem", "kind"):
                continue
            found += paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            found += paths(value, (*prefix, i))
    return found


def replaced(doc: dict, path: tuple, value: object) -> dict:
    out = copy.deepcopy(doc)
    node = out
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return out


def shape_accepts(data: dict) -> bool:
    try:
        KINDS[data["kind"]].model_validate(as_json_numbers(data))
    except ValidationError:
        return False
    return True


def judged(text: str) -> tuple[object, bool, bool, bool]:
    """(the data an editor sees, loader accepts, schema accepts, the loader's YAML reading
    and the models accept)."""
    data = yaml.safe_load(text)
    try:
        to_model(parse_yaml(text, "doc.yaml"), "doc.yaml")
        loader = True
    except DefinitionError:
        loader = False
    try:
        shape = shape_accepts(parse_yaml(text, "doc.yaml"))
    except DefinitionError:
        shape = False
    return data, loader, VALIDATOR.is_valid(data), shape


@pytest.mark.parametrize("base", [SESSION, POOL], ids=["session", "pool"])
def test_the_examples_are_valid_for_both(base):
    _, loader, schema, shape = judged(yaml.safe_dump(base))
    assert loader and schema and shape


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([SESSION, POOL]), st.data())
def test_the_loader_and_the_schema_agree_on_generated_documents(base, data):
    changes = data.draw(st.lists(st.tuples(st.sampled_from(paths(base)), VALUES),
                                 min_size=1, max_size=3))
    doc = base
    for path, value in changes:
        try:
            doc = replaced(doc, path, value)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change replaced what this path went through
    text = yaml.safe_dump(doc, sort_keys=False)
    data, loader, schema, shape = judged(text)
    if loader:
        assert schema, (text, [e.message for e in VALIDATOR.iter_errors(data)][:3])
    if schema:
        assert shape, text


@pytest.mark.parametrize(("path", "value"), [
    (("command",), []),  # minLength on an array: the schema took an empty command
    (("cluster", "size"), 2.0),  # a float where an integer is meant: 2 to both
    (("distributed", "slots"), 2**64),  # beyond int64: the loader refuses it
    (("resources", "mem"), 1024),  # whole bytes below Docker's 6 MiB minimum
    (("resources", "mem"), "4\u00a0g"),  # a space only Unicode calls one
    (("user", "uid"), 65534),  # nobody
])
def test_the_disagreements_found_are_gone(path, value):
    doc = replaced(SESSION, path, value)
    _, loader, schema, shape = judged(yaml.safe_dump(doc))
    assert schema == loader == shape, (value, loader, schema, shape)
