"""Service ports (issue 23, item 1), the pure part: which host port each service gets, where it
is bound, its URL, and what a definition or pool may say about them."""

from __future__ import annotations

import pytest

from cluster_sessions.core.loader import parse_yaml, to_model
from cluster_sessions.core.plan import (
    build_plan,
    build_plans,
    plan_to_dict,
    public_warnings,
    with_service_ports,
)
from cluster_sessions.core.problems import DefinitionError
from cluster_sessions.core.review import diff_plans
from cluster_sessions.core.services import (
    allocate,
    bind_address,
    choose_port,
    service_url,
)
from cluster_sessions.core.spec import (
    Pool,
    PortRange,
    Service,
    Session,
    pool_problems,
    session_problems,
)

from . import factories

SPAN = PortRange(first=30000, last=30004)


def svc(name: str = "web", port: int = 8080, **over) -> Service:
    return Service.model_validate({"name": name, "port": port, **over})


# --- choosing a port ----------------------------------------------------------------------------

def test_the_preferred_port_is_given_when_the_range_holds_it_and_it_is_free():
    assert choose_port(SPAN, 30003, taken=()) == 30003


def test_a_taken_or_out_of_range_preferred_port_falls_back_to_the_first_free_one():
    assert choose_port(SPAN, 30003, taken={30003}) == 30000
    assert choose_port(SPAN, 30003, taken={30003, 30000, 30001}) == 30002
    assert choose_port(SPAN, 18888, taken=()) == 30000  # outside the range
    assert choose_port(SPAN, None, taken={30000}) == 30001


def test_the_port_a_session_holds_is_kept_over_its_preferred_one():
    assert choose_port(SPAN, 30003, taken=(), current=30001) == 30001
    # ... unless someone else publishes it now, or the range no longer holds it
    assert choose_port(SPAN, 30003, taken={30001}, current=30001) == 30003
    assert choose_port(SPAN, 30003, taken=(), current=29999) == 30003


def test_a_full_range_gives_no_port():
    assert choose_port(SPAN, None, taken=range(30000, 30005)) is None
    one = PortRange(first=30000, last=30000)
    assert choose_port(one, 30000, taken=()) == 30000
    assert choose_port(one, 30000, taken={30000}) is None


def test_services_of_one_session_never_share_a_port():
    got = allocate([svc("a", 1, preferred_port=30002), svc("b", 2, preferred_port=30002),
                    svc("c", 3)], SPAN, taken={30000})
    assert got.ok and got.ports == {"a": 30002, "b": 30001, "c": 30003}


def test_two_sessions_asking_the_same_preferred_port_get_different_ports_offline():
    first = allocate([svc(preferred_port=30002)], SPAN, taken=())
    second = allocate([svc(preferred_port=30002)], SPAN, taken=set(first.ports.values()))
    assert first.ports == {"web": 30002} and second.ports == {"web": 30000}


def test_services_keeping_their_ports_go_first_so_a_new_one_cannot_take_them():
    # "new" is declared first and prefers the port "old" holds
    got = allocate([svc("new", 1, preferred_port=30001), svc("old", 2)], SPAN, taken=(),
                   current={"old": 30001})
    assert got.ports == {"new": 30000, "old": 30001}
    assert list(got.ports) == ["new", "old"]  # declaration order kept


def test_a_full_range_is_a_reason_naming_the_agent_and_the_range():
    got = allocate([svc("a", 1), svc("b", 2)], PortRange(first=30000, last=30000), (),
                   agent="gpu1")
    assert not got.ok and got.ports == {}
    assert "30000-30000 of agent gpu1" in got.reason and "'b'" in got.reason
    assert allocate([svc("a", 1), svc("b", 2)], PortRange(first=30000, last=30000), ()).reason \
        == ("the service port range 30000-30000 has no free port left for service 'b' (main1's "
            "agent publishes all of them): widen the pool's service_ports, or destroy a session "
            "that holds some")


def test_only_public_services_are_warned_of_each_with_where_it_is_published():
    from types import SimpleNamespace as Shown
    shown = [Shown(name="ssh", public=False, port=22, bind="127.0.0.1", agent="gpu1"),
             Shown(name="web", public=True, port=8080, bind="10.0.0.11", agent="gpu1"),
             Shown(name="tb", public=True, port=6006, bind="0.0.0.0", agent="local")]
    plan = Shown(services=shown, session=Shown(ports=()), containers=[])
    assert public_warnings(plan) == [
        "service 'web' is public: port 8080 of main1 is published on agent gpu1's address "
        "10.0.0.11, not on its loopback; anyone who reaches it reaches the app, with no login in "
        "front of it (Backend.AI's AppProxy would stand there)",
        "service 'tb' is public: port 6006 of main1 is published on every address of this "
        "machine (a local agent has no address of its own), not on its loopback; anyone who "
        "reaches it reaches the app, with no login in front of it (Backend.AI's AppProxy would "
        "stand there)"]


# --- where it is bound, and its URL -------------------------------------------------------------

def test_a_service_is_bound_to_loopback_unless_public_then_to_the_agents_address():
    assert bind_address(svc(), "10.0.0.11") == "127.0.0.1"
    assert bind_address(svc(public=True), "10.0.0.11") == "10.0.0.11"
    assert bind_address(svc(public=True), None) == "0.0.0.0"  # a local agent: this machine


def test_urls_follow_the_protocol_and_bracket_ipv6():
    assert service_url("http", "127.0.0.1", 30000) == "http://127.0.0.1:30000/"
    assert service_url("https", "10.0.0.1", 443) == "https://10.0.0.1:443/"
    assert service_url("tcp", "fd00::1", 30000) == "tcp://[fd00::1]:30000"


def test_the_plan_carries_services_on_main1s_agent_and_ports_once_chosen():
    pool = Pool.model_validate(factories.pool(
        "p", {**factories.agent("a1"), "ssh": {"host": "10.0.0.5", "user": "ops"},
              "service_ports": {"first": 31000, "last": 31009}}))
    session = Session.model_validate(factories.session("svc-plan", services=[
        {"name": "web", "port": 8080, "public": True}, {"name": "db", "port": 5432,
                                                         "protocol": "tcp"}]))
    plan = build_plan(session, pool)
    doc = plan_to_dict(plan)["services"]
    assert [(s["name"], s["agent"], s["bind"], s["port_range"], s["host_port"], s["url"])
            for s in doc] == [("web", "a1", "10.0.0.5", [31000, 31009], None, None),
                              ("db", "a1", "127.0.0.1", [31000, 31009], None, None)]
    chosen = plan_to_dict(with_service_ports(plan, {"web": 31003, "db": 31000}))["services"]
    assert [s["url"] for s in chosen] == ["http://10.0.0.5:31003/", "tcp://127.0.0.1:31000"]
    warnings = public_warnings(plan)
    assert len(warnings) == 1 and "'web' is public" in warnings[0] and "10.0.0.5" in warnings[0]


def test_diff_warns_of_a_public_service_and_shows_the_services_change():
    pool = Pool.model_validate(factories.pool("p", factories.agent("a1")))
    old = Session.model_validate(factories.session("svc-diff", services=[
        {"name": "web", "port": 8080}]))
    new = Session.model_validate(factories.session("svc-diff", services=[
        {"name": "web", "port": 8080, "public": True}]))
    review = diff_plans(build_plan(old, pool), build_plan(new, pool))
    assert any("'web' is public" in w and "every address of this machine" in w
               for w in review.warnings)
    assert [(c.what, c.old, c.new) for c in review.definition] == [  # the entry gone, and come
        ("services", "web=8080/http", None), ("services", None, "web=8080/http PUBLIC")]
    assert not any("public" in w for w in diff_plans(build_plan(old, pool),
                                                     build_plan(old, pool)).warnings)


def test_count_sessions_each_carry_their_services():
    pool = Pool.model_validate(factories.pool("p", factories.agent("a1")))
    session = Session.model_validate(factories.session("svc-count", count=2, services=[
        {"name": "web", "port": 8080}]))
    assert [len(p.services) for p in build_plans(session, pool)] == [1, 1]


# --- what a definition and a pool may say -------------------------------------------------------

def problems(text: str) -> list[str]:
    """``path: message`` of every problem of a definition's text (loader, model, rules)."""
    try:
        session = to_model(parse_yaml(text, "s.yaml"), "s.yaml")
    except DefinitionError as exc:
        return [f"{p.path}: {p.message}" for p in exc.problems]
    return [f"{path}: {message}" for path, message in session_problems(session)]


BASE = "kind: ClusterSession\nname: svc-rules\npool: local\nimage: img\n"


@pytest.mark.parametrize("services, path, words", [
    ("[{name: Web, port: 80}]", "services.0.name", "lower-case"),
    ("[{name: web-, port: 80}]", "services.0.name", "lower-case"),
    ("[{name: 'a b', port: 80}]", "services.0.name", "lower-case"),
    ("[{name: " + "a" * 33 + ", port: 80}]", "services.0.name", "1-32"),
    ("[{name: web, port: 80}, {name: web, port: 81}]", "services.1.name", "duplicate"),
    ("[{name: web, port: 0}]", "services.0.port", "greater than or equal to 1"),
    ("[{name: web, port: 65536}]", "services.0.port", "less than or equal to 65535"),
    ("[{name: web, port: 2200}]", "services.0.port", "sshd's port"),
    ("[{name: web, port: 80, preferred_port: 80}]", "services.0.preferred_port", "1024"),
    ("[{name: web, port: 80, preferred_port: 65536}]", "services.0.preferred_port", "65535"),
    ("[{name: web, port: 80, protocol: ftp}]", "services.0.protocol", "'http', 'https'"),
    ("[{name: web, port: 80, public: yes}]", "services.0.public", "YAML 1.1"),
    ("[{name: web, port: 80, public: 'true'}]", "services.0.public", "boolean"),
    ("[{name: web, port: 80, public: 1}]", "services.0.public", "boolean"),
    ("[{name: web, port: '80'}]", "services.0.port", "integer"),
    ("[{name: web, port: 80, url: x}]", "services.0.url", ""),
    ("[{name: a, port: 8080}, {name: b, port: 8080}]", "services.1.port", "already published"),
])
def test_bad_services_are_refused_naming_the_field(services, path, words):
    found = problems(BASE + f"services: {services}\n")
    assert any(p.startswith(f"{path}:") and words in p for p in found), found


def test_a_service_may_not_take_a_port_the_distributed_variables_use_or_a_published_one():
    text = BASE + ("cluster: {size: 3}\ndistributed: {master_port: 29500}\n"
                   "ports: [{container: 9000}]\n"
                   "services: [{name: a, port: 29502}, {name: b, port: 9000}, "
                   "{name: c, port: 29503}]\n")
    found = problems(text)
    assert any(p.startswith("services.0.port:") and "29500-29502" in p for p in found), found
    assert any(p.startswith("services.1.port:") and "ports.0" in p for p in found), found
    assert not any(p.startswith("services.2") for p in found), found
    # one container derives nothing: 29500 is then free to use
    assert problems(BASE + "services: [{name: a, port: 29500}]\n") == []


def test_a_good_service_passes_and_public_defaults_to_false():
    text = BASE + ("services: [{name: jupyter, port: 8888, protocol: http, "
                   "preferred_port: 18888}]\n")
    assert problems(text) == []
    session = to_model(parse_yaml(text, "s.yaml"), "s.yaml")
    assert session.services[0].public is False


def test_yaml_1_1_booleans_are_refused_everywhere_not_only_in_services():
    found = problems(BASE + "mounts: [{source: /tmp, target: /home/work/t, read_only: on}]\n")
    assert any(p.startswith("mounts.0.read_only:") and "'on'" in p for p in found), found
    assert problems(BASE + "mounts: [{source: /tmp, target: /home/work/t, read_only: True}]\n"
                    ) == []


@pytest.mark.parametrize("ports, path, words", [
    ({"first": 31000, "last": 30000}, "service_ports.first", "above last"),
    ({"first": 80, "last": 90}, "service_ports.first", "1024"),
    ({"first": 30000, "last": 70000}, "service_ports.last", "65535"),
    ({"first": 30000}, "service_ports.last", "required"),
])
def test_bad_port_ranges_are_refused_naming_the_field(ports, path, words):
    doc = factories.pool("p", factories.agent("a1"), service_ports=ports)
    try:
        pool = Pool.model_validate(doc)
    except Exception as exc:  # noqa: BLE001 - the model's own message
        assert path.replace(".", "") in str(exc).replace(".", "").replace("\n", "")
        assert words in str(exc) or words == "required" and "Field required" in str(exc)
        return
    found = pool_problems(pool)
    assert any(p == path and words in m for p, m in found), found


def test_an_agent_may_have_its_own_port_range_else_the_pools():
    pool = Pool.model_validate(factories.pool(
        "p", factories.agent("a1"), {**factories.agent("a2"),
                                     "service_ports": {"first": 40000, "last": 40010}}))
    assert (pool.service_ports_of("a1").first, pool.service_ports_of("a2").first) == (
        30000, 40000)
    bad = Pool.model_validate(factories.pool(
        "p", {**factories.agent("a1"), "service_ports": {"first": 40010, "last": 40000}}))
    assert [p for p, _ in pool_problems(bad)] == ["agents.0.service_ports.first"]
