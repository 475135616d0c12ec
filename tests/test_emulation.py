"""The emulated provider (tests.standin.provider): no perpetual diff for any
stack, and ``sessionctl diff`` (review.py) agrees with what an emulated ``up`` would do."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import yaml

from cluster_sessions.core import review
from cluster_sessions.core.plan import build_plan
from tests.standin import connhelper, provider
from tests.standin.docker_builder import DockerBuilder
from tests.standin.engine import STACKS, Engine, Registration, run_program

from .factories import load_session
from .test_session import EXAMPLES, FIXTURE_STACKS, config_of

CONTAINER = provider.CONTAINER
SESSION_NETWORK = "pulumi-python:dynamic/cluster-sessions:SessionNetwork"
PROVIDER = "pulumi:providers:docker"


@pytest.mark.parametrize("stack", EXAMPLES + sorted(FIXTURE_STACKS))
def test_an_unchanged_definition_shows_no_change_against_the_read_back_state(stack):
    """up, then up again: every docker resource compares its inputs with what the provider
    read back after the first, and finds nothing (a perpetual diff would replace it)."""
    config = config_of(stack)
    engine = Engine()
    run_program(engine, stack, config)
    assert {a for a, _ in engine.actions.values()} == {provider.CREATE}
    run_program(engine, stack, config)
    docker = {r.urn for r in engine.registrations if r.type in (CONTAINER, SESSION_NETWORK)}
    assert {r.type for r in engine.registrations if r.urn in docker} == {CONTAINER,
                                                                        SESSION_NETWORK}
    changed = {urn: engine.actions[urn] for urn in docker
               if engine.actions[urn][0] != provider.SAME}
    assert not changed, changed
    assert not engine.failed, engine.failed


# The strict emulation's findings about the program, fixed there (issue 20): ``memory_swap``
# is passed (the provider reads back twice ``memory`` otherwise: an in-place update on every
# up), and GPU lists are ``device_requests`` (``gpus="device=0,1"`` is count 1 plus device 0,
# which the engine refuses; quoting does not help: rcf.go l. 705-718 strips the quotes first).
@pytest.mark.parametrize("stack", ["train-demo", "gpu-pair", "remote-gpus"])
def test_the_program_passes_nothing_the_provider_refuses_or_reads_back_differently(stack):
    engine = Engine()
    run_program(engine, stack, config_of(stack))
    run_program(engine, stack, config_of(stack))
    assert not engine.failed
    assert all(a == (provider.SAME, ()) for urn, a in engine.actions.items()
               if CONTAINER in urn), engine.actions


def test_the_read_back_is_what_makes_a_diff_perpetual():
    """Without the read-back spelling the same definition would replace every container."""
    state = provider.create(CONTAINER, {"cpus": "1"}, {"cpus": "1"})
    assert state["cpus"] == "1.0"
    assert provider.diff(CONTAINER, state, {"cpus": "1"}, []) == (provider.REPLACE, ("cpus",))
    assert provider.diff(CONTAINER, state, {"cpus": "1.0"}, []) == (provider.SAME, ())
    assert provider.diff(CONTAINER, state, {"cpus": "1"}, ["cpus"]) == (provider.SAME, ())

TRAIN = (STACKS / "sessions" / "train-demo.yaml").read_text()
CHANGES = {
    "restart": ("restart:", lambda d: {**d, "restart": "always"}),
    "memory": ("resources", lambda d: {**d, "resources": {**d["resources"], "mem": "3g"}}),
    "image": ("image", lambda d: {**d, "image": "cluster-sessions/debian-sshd:other"}),
    "env": ("env", lambda d: {**d, "env": {**(d.get("env") or {}), "NEW": "value"}}),
    "command": ("command", lambda d: {**d, "command": ["sleep", "123"]}),
    "size": ("cluster", lambda d: {**d, "cluster": {**d["cluster"], "size": 3}}),
    "readiness": ("readiness", lambda d: {**d, "readiness": {"timeout": 77}}),
    "nothing": ("", lambda d: d),
    "batch": ("type", lambda d: {**d, "type": "batch", "command": ["sh", "-c", "exit 0"]}),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_diff_agrees_with_what_an_emulated_up_does(tmp_path, change):
    definition = yaml.safe_load(TRAIN)
    pool = STACKS / "pools" / "local.yaml"
    old_file, new_file = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old_file.write_text(yaml.safe_dump(definition))
    new_file.write_text(yaml.safe_dump(CHANGES[change][1](definition)))
    engine = Engine()
    name = definition["name"]
    for path in (old_file, new_file):
        run_program(engine, name, {"cluster-sessions:definition": str(path),
                                   "cluster-sessions:pool": str(pool)})
    emulated = {r.name.removeprefix(f"{name}-"): engine.actions[r.urn][0]
                for r in engine.registrations if r.type == CONTAINER}
    old, new = (load_session(p, Path(pool)) for p in (old_file, new_file))
    predicted = review.diff_plans(build_plan(old.session, old.pool),
                                  build_plan(new.session, new.pool))
    said = {a.host: a.action for a in predicted.containers if a.action != review.REMOVE}
    translate = {review.ADD: provider.CREATE, review.SAME: provider.SAME,
                 review.UPDATE: provider.UPDATE, review.REPLACE: provider.REPLACE}
    assert {h: translate[a] for h, a in said.items()} == emulated


# --- the strict witness: each of these fails against an emulation that accepts more ----------

def _registration(type_: str, name: str, provider_urn: str = "") -> Registration:
    urn = f"urn:pulumi:t::p::{type_}::{name}"
    return Registration(type=type_, name=name, urn=urn, parent="", custom=True,
                        provider=f"{provider_urn}::id" if provider_urn else "", inputs={},
                        dependencies=[], additional_secret_outputs=[],
                        delete_before_replace=True)


def test_a_provider_whose_unix_socket_does_not_exist_fails_like_the_provider(tmp_path):
    """No fallback to some default client: the provider pings the engine its ``host`` names
    and fails every resource of it when that does not answer (config.go l. 193-199)."""
    builder = DockerBuilder()
    prov = _registration(PROVIDER, "agent")
    builder(prov, {"host": f"unix://{tmp_path}/absent.sock"})
    container = _registration(CONTAINER, "main1", prov.urn)
    with pytest.raises(connhelper.EngineUnreachable, match="Error pinging Docker server"):
        builder(container, {"name": "t-main1", "image": "nothing"})
    assert not builder.made


OPTS = ["-o", "IdentityFile=/k/id", "-o", "IdentitiesOnly=yes", "-o",
        "UserKnownHostsFile=/k/known", "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
        "-o", "ConnectTimeout=10"]


def test_an_ssh_host_runs_the_argv_docker_clis_connhelper_builds():
    """connhelper.go l. 40-72 and ssh.go l. 110-165 (docker/cli v28.5.2): user and port as
    ``-l``/``-p``, the provider's ssh_opts as given, ``-T``, ``--``, host, and a socket path as
    a quoted ``--host=unix://PATH`` of the remote ``docker system dial-stdio``."""
    assert connhelper.ssh_argv("ssh://ops@10.0.0.11:2222/run/user/1000/docker.sock", OPTS) == [
        "ssh", "-l", "ops", "-p", "2222", *OPTS, "-T", "--", "10.0.0.11",
        "docker '--host=unix:///run/user/1000/docker.sock' system dial-stdio"]
    assert connhelper.ssh_argv("ssh://agent1") == [
        "ssh", "-o ConnectTimeout=30", "-T", "--", "agent1", "docker system dial-stdio"]
    assert connhelper.ssh_argv("ssh://ops@agent1/", ["-T"])[-3:] == [
        "--", "agent1", "docker system dial-stdio"]
    for url, why in [("ssh://ops:secret@agent1", "plain-text password is not supported"),
                     ("ssh://ops:@agent1", "plain-text password is not supported"),
                     ("ssh://agent1?socket=x", "query parameters are not allowed"),
                     ("ssh://agent1#x", "fragments are not allowed"),
                     ("ssh://ops@:22", "hostname is empty")]:
        with pytest.raises(connhelper.ProviderConfigError, match=why):
            connhelper.ssh_argv(url)


def test_a_tcp_host_needs_tls_material():
    with pytest.raises(connhelper.ProviderConfigError, match="cert_path"):
        connhelper.connect(connhelper.config_of({"host": "tcp://127.0.0.1:2376"}))


@pytest.mark.docker
def test_the_relay_carries_the_docker_api_through_a_dial_stdio_command(docker_client):
    """Every connection runs the command and relays both ways: the SDK pings and lists
    through ``docker system dial-stdio`` (here local; over ssh it is the argv above)."""
    relay = connhelper.DialStdioRelay(["docker", "system", "dial-stdio"])
    try:
        import docker

        client = docker.DockerClient(base_url=relay.url, timeout=30)
        assert client.ping()
        assert client.version()["ApiVersion"] == docker_client.version()["ApiVersion"]
        client.close()
    finally:
        relay.close()


def test_gpus_parse_as_docker_clis_gpu_opts():
    """opts/gpus.go l. 36-99: one CSV record, so an unquoted device list is a device and a
    count; each key once; a bare number is a count."""
    assert provider.parse_gpus('"device=0,1"').device_ids == ["0", "1"]
    assert provider.parse_gpus('"device=0,1"').count == 0
    split = provider.parse_gpus("device=0,1")
    assert (split.device_ids, split.count) == (["0"], 1)
    assert provider.parse_gpus("all").count == -1
    assert provider.parse_gpus("2").count == 2
    assert provider.parse_gpus("capabilities=compute").capabilities == [["compute", "gpu"]]
    assert provider.parse_gpus("count=1,2").count == 2  # the bare "2" is checked as key "2"
    for bad, why in [("2,count=1", "'count' can be specified only once"),
                     ("device=0,foo=1", "unexpected key 'foo'"),
                     ("count=x", "invalid count"), ('dev"ice=0', 'bare "')]:
        with pytest.raises(provider.ProviderRefused, match=why):
            provider.parse_gpus(bad)


def test_a_gpus_device_list_is_refused_quoted_or_not():
    """The engine refuses count and device IDs together; and the provider strips surrounding
    quotes before parsing (rcf.go l. 705-718), so quoting the whole value does not help."""
    for value in ("device=0,1", '"device=0,1"', "'\"device=0,1\"'"):
        with pytest.raises(provider.ProviderRefused, match="cannot set both Count and DeviceIDs"):
            provider.gpus_request(value)
    req = provider.gpus_request('driver=nvidia,"device=0,1"')
    assert (req.device_ids, req.count) == (["0", "1"], 0)
    state = provider.create(CONTAINER, {"gpus": 'driver=nvidia,"device=0,1"'},
                            {"gpus": 'driver=nvidia,"device=0,1"'})
    assert state["gpus"] == "device=0,1"  # rcf.go l. 720-748: a replacement on every up
    assert provider.gpus_request("device=0").device_ids == ["0"]


def test_the_builder_parses_gpus_before_it_says_this_engine_has_none():
    builder = DockerBuilder()
    reg = _registration(CONTAINER, "c")
    with pytest.raises(provider.ProviderRefused, match="cannot set both"):
        builder(reg, {"name": "t-c", "gpus": "device=0,1"})
    with pytest.raises(provider.ProviderRefused, match="no GPUs on this engine"):
        builder(reg, {"name": "t-c", "gpus": "device=0"})


def test_read_back_only_keys_are_in_the_state_and_diffed_as_the_bridge_does():
    """``memory_swap`` (Optional, not Computed, no Default: rc.go 856-861) is read back as
    twice the memory (rcf.go 940-944) though not passed: an in-place update on the next up
    (then 0 in the state, the update reads nothing back, until a refresh reads it again).
    ``destroy_grace_seconds`` is not ForceNew (rc.go 827-831) and not read back."""
    state = provider.create(CONTAINER, {"memory": 512}, {"memory": 512})
    assert state["memorySwap"] == 1024
    assert provider.diff(CONTAINER, state, {"memory": 512}, []) == (
        provider.UPDATE, ("memorySwap",))
    assert provider.diff(CONTAINER, state, {"memory": 512, "memorySwap": 1024}, []) == (
        provider.SAME, ())
    updated = provider.after_update(CONTAINER, state, {"memory": 512}, ("memorySwap",))
    assert provider.diff(CONTAINER, updated, {"memory": 512}, []) == (provider.SAME, ())
    graced = provider.create(CONTAINER, {"destroyGraceSeconds": 10}, {"destroyGraceSeconds": 10})
    assert provider.diff(CONTAINER, graced, {"destroyGraceSeconds": 20}, []) == (
        provider.UPDATE, ("destroyGraceSeconds",))
    assert provider.diff(CONTAINER, {"init": True}, {}, []) == (provider.SAME, ())  # Computed


class Recorder:
    """Engine hooks that record what a builder would be asked to do, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict]] = []

    def create(self, reg: Registration, inputs: dict) -> None:
        if reg.type != PROVIDER:
            self.calls.append(("create", reg.name, inputs))

    def delete(self, urn: str) -> None:
        self.calls.append(("delete", urn.rsplit("::", 1)[-1], {}))


def two_resources(label: str = "a", envs: tuple[str, ...] = (), image: str = "img",
                  on: str = "p1"):
    """A container ``a`` (fixed name, delete-before-replace, its ``envs`` ignored) and a
    container ``c`` whose labels name it, under one of two explicit providers."""
    import pulumi
    import pulumi_docker as docker

    def program() -> None:
        providers = {n: docker.Provider(n, host=f"unix:///run/{n}.sock") for n in ("p1", "p2")}
        a = docker.Container(
            "a", name="t-a", image="img", envs=list(envs),
            labels=[docker.ContainerLabelArgs(label="l", value=label)],
            opts=pulumi.ResourceOptions(provider=providers[on], delete_before_replace=True,
                                        ignore_changes=["envs"]))
        docker.Container("c", name="t-c", image=image, labels=[
            docker.ContainerLabelArgs(label="peer", value=a.name)],
            opts=pulumi.ResourceOptions(provider=providers[on], delete_before_replace=True))
    return program


def _run(engine: Engine, **kwargs) -> dict:
    run_program(engine, "t", {}, program=two_resources(**kwargs))
    return {r.name: r for r in engine.registrations}


def test_ignore_changes_keeps_the_old_input_also_on_a_replacement():
    """step_generator.go ``processIgnoreChanges``: the replacement is created with the old
    value of an ignored input, and that is what gets built."""
    rec = Recorder()
    engine = Engine(on_create=rec.create, on_delete=rec.delete)
    _run(engine, envs=("MTU=1450",))
    regs = _run(engine, label="b", envs=("MTU=9000",))
    a = regs["a"].urn
    assert engine.actions[a] == (provider.REPLACE, ("labels",))
    assert engine.state[a][1]["envs"] == ["MTU=1450"]
    built = [inputs for op, name, inputs in rec.calls if (op, name) == ("create", "a")]
    assert built[-1]["envs"] == ["MTU=1450"]


def test_a_replaced_resource_replaces_those_whose_force_new_input_came_from_it():
    """calculateDependentReplacements: ``c``'s labels come from ``a``'s name and are ForceNew,
    so the delete-before-replace of ``a`` replaces ``c`` too, deleting it first."""
    rec = Recorder()
    engine = Engine(on_create=rec.create, on_delete=rec.delete)
    regs = _run(engine)
    assert regs["c"].property_dependencies["labels"] == [regs["a"].urn]
    rec.calls.clear()
    regs = _run(engine, label="b")
    assert engine.actions[regs["c"].urn][0] == provider.REPLACE
    assert [(op, name) for op, name, _ in rec.calls] == [
        ("delete", "c"), ("delete", "a"), ("create", "a"), ("create", "c")]


def test_a_resource_moved_to_another_provider_is_replaced_only_when_its_diff_says_so():
    """providerChanged (pulumi >= 3.152, #18509) asks the new provider's DiffConfig, and the
    bridged docker provider never asks for a replacement: with unchanged inputs the resource
    is *not* replaced and stays on the old engine (``moved``); a ForceNew change replaces it
    through the new provider."""
    rec = Recorder()
    engine = Engine(on_create=rec.create, on_delete=rec.delete)
    regs = _run(engine)
    p1 = regs["p1"].urn
    rec.calls.clear()
    regs = _run(engine, on="p2")
    c = regs["c"].urn
    assert engine.actions[c] == (provider.SAME, ())
    assert engine.moved[c] == (p1, regs["p2"].urn)
    assert rec.calls == []
    regs = _run(engine, on="p2", image="img2")
    assert engine.actions[c] == (provider.REPLACE, ("image",))
    assert c not in engine.moved


def test_provider_config_is_read_as_the_provider_reads_it():
    """List-valued provider config arrives JSON-encoded; what the program leaves unset comes
    from the provider process's environment (provider.go DefaultFuncs), so the emulation is
    steered exactly where the real provider would be."""
    opts = ["-o", "BatchMode=yes", "-o", "IdentityFile=/k"]
    config = connhelper.config_of({"host": "ssh://u@h:22", "sshOpts": json.dumps(opts)}, {})
    assert config["ssh_opts"] == opts
    steered = connhelper.config_of({"host": "ssh://u@h:22"},
                                   {"DOCKER_CERT_PATH": "/c", "DOCKER_SSH_OPTS": "-o X=1"})
    assert steered["cert_path"] == "/c" and steered["ssh_opts"] == ["-o", "X=1"]
    with pytest.raises(connhelper.ProviderConfigError, match="context"):
        connhelper.config_of({"host": "ssh://u@h:22"}, {"DOCKER_CONTEXT": "other"})


# --- the mock monitor's one-pass reading and writing (issue 35: registration at scale) -------


def _checking(monkeypatch) -> dict[str, int]:
    """Check every registration's one-pass reading and writing against the SDK's own
    (``json_format.MessageToDict``, ``rpc.deserialize_properties``, ``rpc.serialize_properties``)
    as the run goes; count what each path took."""
    from google.protobuf import json_format
    from pulumi.runtime import rpc
    from pulumi.runtime.sync_await import _sync_await

    from tests.standin import engine as em

    seen = {"fast inputs": 0, "sdk inputs": 0, "fast state": 0, "sdk state": 0}
    last = threading.local()  # the struct each registering thread read last
    struct_to_dict, deserialized, state_struct = (em.struct_to_dict, em.deserialized,
                                                  em.state_struct)

    def read(struct):
        got = struct_to_dict(struct)
        want = json_format.MessageToDict(struct)
        assert got == want and repr(got) == repr(want)  # the same floats, keys in order
        last.struct = struct
        return got

    def derive(inputs):
        got = deserialized(inputs)
        seen["sdk inputs" if got is None else "fast inputs"] += 1
        if got is not None:
            want = rpc.deserialize_properties(last.struct)
            assert got == want and repr(got) == repr(want)
        return got

    def write(state, *source):
        got = state_struct(state, *source)
        seen["sdk state" if got is None else "fast state"] += 1
        if got is not None:
            assert got == _sync_await(rpc.serialize_properties(state, {}))
        return got

    monkeypatch.setattr(em, "struct_to_dict", read)
    monkeypatch.setattr(em, "deserialized", derive)
    monkeypatch.setattr(em, "state_struct", write)
    return seen


@pytest.mark.parametrize("stack", EXAMPLES + sorted(FIXTURE_STACKS))
def test_the_mock_monitor_reads_and_answers_each_registration_as_the_sdks_does(monkeypatch,
                                                                                stack):
    """An up, a second up and a preview of each stack: every registration's inputs as the
    engine records them, what the mocks get and the state the program gets back are, where
    the one-pass path takes them, what the SDK's mock monitor makes of them."""
    seen = _checking(monkeypatch)
    engine = Engine()
    run_program(engine, stack, config_of(stack))
    run_program(engine, stack, config_of(stack))
    engine.dry_run = True
    run_program(engine, stack, config_of(stack))
    assert seen["fast inputs"] and seen["fast state"], seen


def test_what_the_one_pass_path_leaves_to_the_sdk():
    import pulumi
    from google.protobuf import struct_pb2
    from pulumi.runtime import rpc
    from pulumi.runtime.sync_await import _sync_await

    from tests.standin.engine import (
        SECRET_SIG,
        SECRET_VALUE,
        deserialized,
        state_struct,
        struct_to_dict,
    )

    def secret(value):
        return {SECRET_SIG: SECRET_VALUE, "value": value}

    struct = struct_pb2.Struct()
    struct.update({"a": [1, "x", secret("s")], "m": {"k": secret(2), "n": None},
                   "plain": {"k": None, "l": [True, None]}, "top": None, "t": secret({"u": 1})})
    inputs = struct_to_dict(struct)
    assert deserialized(inputs) == rpc.deserialize_properties(struct) == {
        "a": secret([1.0, "x", "s"]), "m": secret({"k": 2.0}), "plain": {"l": [True, None]},
        "t": secret({"u": 1.0})}
    for left in ({"u": rpc.UNKNOWN}, {"l": [rpc.UNKNOWN]},
                 {"r": {SECRET_SIG: rpc._special_resource_sig, "urn": "u"}},
                 {SECRET_SIG: SECRET_VALUE, "value": "x"}):
        assert deserialized(left) is None, left
    state = {"a": (1, "x"), "n": None, "m": {"k": None}, "s": secret("v")}
    written = state_struct(state)
    assert struct_to_dict(written) == {"a": [1.0, "x"], "m": {"k": None}, "s": secret("v")}
    for left in ({"u": pulumi.output.Unknown()}, {"o": object()}, {"k": {1: "x"}}):
        assert state_struct(left) is None, left
    # what the state took unchanged is copied from the request, unless reading it changed it
    # (a secret moved up: "a", "m"; a null left out: "plain")
    args = deserialized(inputs)
    state = {**args, "extra": [1, None]}
    assert state_struct(state, struct, inputs, args) == _sync_await(
        rpc.serialize_properties(state, {}))
    assert struct_to_dict(state_struct(state, struct, inputs, args))["plain"] == {
        "l": [True, None]}


def test_the_program_collects_less_while_it_runs_and_each_run_starts_from_the_same(
        monkeypatch):
    """The program raises the collector's threshold for its process (issue 35); the stand-in
    puts it back after each run, so no run (the benchmarks' bare floor among them) inherits
    another's."""
    import gc

    from cluster_sessions.pulumi_layer import program

    during = []
    session = program.Session

    def recording(*args, **kwargs):
        during.append(gc.get_threshold())
        return session(*args, **kwargs)

    monkeypatch.setattr(program, "Session", recording)
    before = gc.get_threshold()
    run_program(Engine(), "train-demo", config_of("train-demo"))
    assert during and during[0][0] == max(before[0], program.GC_THRESHOLD)
    assert during[0][1:] == before[1:]
    assert gc.get_threshold() == before
