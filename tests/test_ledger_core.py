"""What the ledger's markers and our resource labels mean (core/ledger.py, issue 47), offline:
one strict parser for every label number, a malformed object holding nothing it cannot prove,
entries per stack (never per session name), the queue's order, liveness by lease alone."""

from __future__ import annotations

import json
import math

import pytest

from cluster_sessions.core import ledger
from cluster_sessions.core.ledger import Entry, Holder

KEYS = {"kind": "k", "session": "s", "stack": "st", "holder": "h", "lease": "l",
        "arrival": "a", "holds": "hd"}
CPU, MEM, GPUS = "cpu", "mem", "gpus"


# --- the one parser --------------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    "-100", "-0", "+1", "inf", "-inf", "nan", "NaN", "1e3", "1E3", " 1", "1 ", "0x10", "1_000",
    "", ".5", "5.", "01", "１", "1.0000000001", "9" * 30, True, None, [], "1,5", math.nan,
    math.inf, -1, -0.5])
def test_a_label_number_that_is_not_plain_decimal_digits_is_malformed(text):
    with pytest.raises(ValueError, match=" is not a plain decimal number from 0 to 1e"):
        ledger.decimal(text, 10**12)


@pytest.mark.parametrize("text, want", [("0", 0), ("4", 4), ("0.5", 0.5), ("4096", 4096),
                                        ("0.001", 0.001), (3, 3), (2.5, 2.5)])
def test_plain_decimal_numbers_within_the_bound_read_as_written(text, want):
    assert ledger.decimal(text, 4096) == want


def test_integers_where_the_unit_is_one_and_bounds_are_inclusive():
    assert ledger.integer("7", 7) == 7 and type(ledger.integer("7", 7)) is int
    assert type(ledger.decimal("7", 7)) is float and type(ledger.decimal(7, 7)) is int
    for bad in ("8", "1.5", 1.0, 1.5, "-1", math.inf, math.nan, True, "7.0"):
        with pytest.raises(ValueError, match=r"^'.*' is not an integer from 0 to 7$"):
            ledger.integer(bad, 7)
    assert ledger.integer("0", 0) == 0 and ledger.decimal("4.5", 4.5) == 4.5


def test_a_bad_value_is_shown_cut_to_forty_characters():
    with pytest.raises(ValueError) as bad:
        ledger.integer("x" * 100, 3)
    assert str(bad.value) == f"{'x' * 40!r} is not an integer from 0 to 3"
    with pytest.raises(ValueError) as bad:
        ledger.decimal("9" * 41, 3)
    assert str(bad.value) == f"{'9' * 40!r} is not a plain decimal number from 0 to 3"


def test_gpu_labels_are_distinct_bounded_ids():
    assert ledger.gpus_label("") == ()
    assert ledger.gpus_label("0,3") == (0, 3)
    for bad in ("0,0", "-1", "1,,2", " 1", "4096", "a", 3):
        with pytest.raises(ValueError):
            ledger.gpus_label(bad)
    assert ledger.gpus_label("4095") == (4095,)


def test_cpu_and_memory_labels_as_the_plan_writes_them():
    assert ledger.cpu_label("0.1") == 100 and ledger.cpu_label("2") == 2000
    assert ledger.mem_label("268435456") == 2**28
    with pytest.raises(ValueError):
        ledger.mem_label("1.5")
    assert ledger.cpu_label(str(ledger.MAX_CORES)) == ledger.MAX_MILLICPU
    with pytest.raises(ValueError):
        ledger.cpu_label(f"{ledger.MAX_CORES}.001")  # more than a million cores: not believed
    with pytest.raises(ValueError, match="is not a list of GPU ids"):
        ledger.gpus_label(3)
    with pytest.raises(ValueError) as twice:
        ledger.gpus_label("1,1")
    assert str(twice.value) == "'1,1' names a GPU twice"
    assert ledger.mem_label(str(ledger.MAX_MEM)) == ledger.MAX_MEM
    with pytest.raises(ValueError):
        ledger.mem_label(str(ledger.MAX_MEM + 1))


# --- a container's holdings: the rule for malformed labels -------------------------------------


def holds(labels, host=None):
    return ledger.container_holds(labels, host or {}, CPU, MEM, GPUS)


def test_well_formed_labels_are_what_a_container_holds():
    h = holds({CPU: "1.5", MEM: "1024", GPUS: "1,2"}, {"NanoCpus": 9 * 10**9})
    assert (h.millicpu, h.mem, h.gpus, h.malformed) == (1500, 1024, (1, 2), ())


@pytest.mark.parametrize("cpu", ["-100", "inf", "nan", "1e999", "-1e999"])
def test_a_malformed_cpu_label_adds_no_capacity_and_counts_what_the_engine_enforces(cpu):
    h = holds({CPU: cpu, MEM: "5"}, {"NanoCpus": 2 * 10**9})
    assert h.millicpu == 2000 and h.mem == 5
    assert len(h.malformed) == 1 and h.malformed[0].startswith("cpu: ")
    unlimited = holds({CPU: cpu})
    assert unlimited.millicpu == 0 and unlimited.malformed


def test_a_malformed_engine_limit_is_nothing_and_never_negative():
    h = holds({CPU: "x", MEM: "-5", GPUS: "0,0"},
              {"NanoCpus": -10**12, "Memory": -1,
               "DeviceRequests": [{"DeviceIDs": ["1", "-2", "x", "1"]}, "junk"]})
    assert (h.millicpu, h.mem, h.gpus) == (0, 0, (1,))
    assert [m.split(":")[0] for m in h.malformed] == [CPU, MEM, GPUS]


def test_engine_limits_are_whole_numbers_within_bounds():
    top = ledger.MAX_MILLICPU * 10**6
    assert holds({}, {"NanoCpus": 1_500_000}).millicpu == 1
    assert type(holds({}, {"NanoCpus": 1_500_000}).millicpu) is int
    assert holds({}, {"NanoCpus": top}).millicpu == ledger.MAX_MILLICPU
    assert holds({}, {"NanoCpus": top + 1}).millicpu == 0
    assert holds({}, {"NanoCpus": 1.5e9, "Memory": 1.5}).millicpu == 0
    assert holds({}, {"Memory": 1.5}).mem == 0 and holds({}, {"Memory": 7}).mem == 7
    assert holds({}, {"DeviceRequests": [{"DeviceIDs": ["1.5", 2.0, "3"]}]}).gpus == (3,)
    assert holds({}, {}) == ledger.Holds(0, 0, ())


def test_labels_absent_fall_back_to_the_engines_limits_without_a_complaint():
    h = holds({}, {"NanoCpus": 500_000_000, "Memory": 2**20,
                   "DeviceRequests": [{"DeviceIDs": ["0", "2"]}]})
    assert (h.millicpu, h.mem, h.gpus, h.malformed) == (500, 2**20, (0, 2), ())


# --- markers -----------------------------------------------------------------------------------


def marker(kind="reservation", session="s1", stack="a" * 16, created=1000.0, lease="90",
           arrival=None, holds_doc=None, name=None, holder=None, cid=None):
    labels = {"k": kind, "s": session, "st": stack, "l": lease,
              "h": (holder or Holder(session, "up", "h", 1, "u")).label()}
    if arrival is not None:
        labels["a"] = arrival
    if holds_doc is not None:
        labels["hd"] = holds_doc if isinstance(holds_doc, str) else json.dumps(holds_doc)
    return ledger.entry_of(labels, KEYS, cid or f"id-{name or session}-{created}",
                           name or f"m-{session}-{created}", created, 300)


def test_a_holder_label_is_compact_json_and_its_text_is_cut():
    h = Holder("s1", "up", "h", 1, "u")
    assert h.label() == '{"session":"s1","verb":"up","host":"h","pid":1,"user":"u"}'
    long = Holder("s" * 500, "v" * 500, "h" * 500, 2**31, "u" * 500)
    back = Holder.parse(long.label())
    assert back == Holder("s" * 200, "v" * 200, "h" * 200, 2**31, "u" * 200)
    assert Holder.parse(Holder("s", "up", "h", 2**31 + 1, "u").label()) is None
    assert Holder.parse(Holder("s", "up", "h", 1.5, "u").label()) is None  # type: ignore
    assert Holder("a, b", "up", "h", 1, "u").sessions == ("a", "b")


def test_a_marker_without_labels_is_an_empty_entry_that_holds_nothing():
    e = ledger.entry_of({}, KEYS, "cid", "mname", 50.0, 300)
    assert (e.kind, e.session, e.stack_id, e.holder, e.container_id, e.name) == \
        ("", "", "", None, "cid", "mname")
    assert (e.lease, e.arrival, e.holds, e.malformed) == (0.0, 50.0, {}, ())
    assert e.expired(50.0)
    empty = ledger.entry_of({"hd": ""}, KEYS, "c", "n", 0.0, 300)
    assert empty.holds == {} and empty.malformed == ()


def test_a_markers_text_is_cut_and_its_complaints_exact():
    labels = {"k": "reservation", "s": "n" * 300, "st": "i" * 300, "l": "1e3", "h": "{}"}
    e = ledger.entry_of(labels, KEYS, "c", "n", 0.0, 300)
    assert e.session == "n" * 200 and e.stack_id == "i" * 200
    assert e.malformed == ("l: '1e3' is not a plain decimal number from 0 to 1e+11",
                           "h: not a holder sessionctl writes")
    assert ledger.entry_of({"l": "30.5"}, KEYS, "c", "n", 0.0, 300).lease == 30.5
    top = str(ledger.MAX_TIME)
    assert ledger.entry_of({"l": top}, KEYS, "c", "n", 0.0, 300).lease == 300
    assert ledger.entry_of({"l": top + "1"}, KEYS, "c", "n", 0.0, 300).lease == 0
    assert ledger.entry_of({"a": "12.5"}, KEYS, "c", "n", 99.0, 300).arrival == 12.5


@pytest.mark.parametrize("doc, why", [
    ("[1]", "not an object"),
    ('{"a1": 7}', "agent 'a1': not cpu, mem, gpus, ports"),
    ('{"a1": {"x": 1}}', "agent 'a1': not cpu, mem, gpus, ports"),
    ('{"a1": {"gpus": 0}}', "agent 'a1': gpus and ports must be lists"),
    ('{"a1": {"ports": "22"}}', "agent 'a1': gpus and ports must be lists"),
    ('{"a1": {"ports": [0]}}', "agent 'a1': port 0"),
    ('{"' + "a" * 60 + '": 7}', f"agent {'a' * 40!r}: not cpu, mem, gpus, ports"),
    ('{"a1": {"cpu": 1.5}}', "'1.5' is not an integer from 0 to 1e+09"),
    ('{"a1": {"mem": 1.5}}', f"'1.5' is not an integer from 0 to {2**60:g}"),
    ('{"a1": {"gpus": [1.5]}}', "'1.5' is not an integer from 0 to 4095"),
    ('{"a1": {"ports": [22.5]}}', "'22.5' is not an integer from 0 to 65535")])
def test_a_malformed_holding_says_exactly_what_is_wrong(doc, why):
    e = marker(holds_doc=doc)
    assert e.holds == {} and e.malformed == (f"hd: {why}",)


def test_a_holding_may_leave_out_what_it_does_not_hold():
    assert marker(holds_doc={"a1": {}}).holds == {"a1": {"cpu": 0, "mem": 0, "gpus": [],
                                                          "ports": []}}
    assert marker(holds_doc={"a" * 300: {"cpu": 1}}).holds == {
        "a" * 200: {"cpu": 1, "mem": 0, "gpus": [], "ports": []}}


def test_a_marker_reads_back_what_sessionctl_writes():
    e = marker(holds_doc={"a1": {"cpu": 500, "mem": 2, "gpus": [1], "ports": [2222]}},
               arrival="900.5")
    assert e.holds == {"a1": {"cpu": 500, "mem": 2, "gpus": [1], "ports": [2222]}}
    assert (e.lease, e.arrival, e.until, e.malformed) == (90.0, 900.5, 1090.0, ())
    assert e.holder == Holder("s1", "up", "h", 1, "u") and e.identity == "a" * 16


@pytest.mark.parametrize("doc", [
    '{"a1": {"cpu": -100}}', '{"a1": {"cpu": 1e400}}', '{"a1": {"mem": 1.5}}',
    '{"a1": {"gpus": [-1]}}', '{"a1": {"gpus": "0"}}', '{"a1": {"ports": [0]}}',
    '{"a1": {"ports": [70000]}}', '{"a1": {"cpu": true}}', '{"a1": 7}', '[1]', "{bad",
    '{"a1": {"cpu": 1, "extra": 2}}', '{"a1": {"ports": {}}}'])
def test_a_marker_whose_holdings_are_malformed_holds_nothing_and_says_so(doc):
    e = marker(holds_doc=doc)
    assert e.holds == {} and e.malformed and e.malformed[0].startswith("hd: ")
    assert ledger.live([e], 1001).entries == ()
    assert ledger.live([e], 1001).malformed == (e,)


@pytest.mark.parametrize("lease, want", [("nan", 0.0), ("inf", 0.0), ("-1", 0.0),
                                         ("1e9", 0.0), ("400", 300.0), ("300", 300.0),
                                         ("30", 30.0)])
def test_a_lease_is_believed_up_to_the_readers_bound_and_a_malformed_one_is_none(lease, want):
    assert marker(lease=lease).lease == want


def test_an_arrival_is_never_after_the_marker_was_made():
    assert marker(arrival="5000").arrival == 1000.0
    assert marker(arrival="x").arrival == 1000.0 and marker(arrival="x").malformed
    assert marker(arrival="10").arrival == 10.0


def test_liveness_is_the_lease_alone_on_the_engines_clock():
    e = marker(created=1000.0, lease="60")
    assert not e.expired(1059.999) and e.expired(1060.0)
    dead_looking = marker(holder=Holder("s1", "up", "this-host", 999999, "u"))
    assert not dead_looking.expired(1000.0)  # no pid or host name is believed


def test_a_bad_holder_label_is_nobody_and_makes_the_marker_malformed():
    labels = {"k": "lock", "h": '{"session": "x", "verb": "up", "host": "h", "pid": -4, '
                                '"user": "u"}', "l": "60"}
    e = ledger.entry_of(labels, KEYS, "id", "n", 0.0, 60)
    assert e.holder is None and e.malformed == ("h: not a holder sessionctl writes",)
    assert Holder.parse("{not json") is None and Holder.parse('"s"') is None


def test_entries_are_per_stack_so_one_name_of_two_stacks_keeps_both():
    a = marker(session="gamma", stack="a" * 16, created=1000)
    b = marker(session="gamma", stack="b" * 16, created=1001)
    renewal = marker(session="gamma", stack="a" * 16, created=1002)
    judged = ledger.live([a, b, renewal], 1003)
    assert judged.entries == (b, renewal)  # a's renewal replaces a, never b
    old = marker(session="legacy", stack="", created=1000)
    assert old.identity == "session:legacy"


def test_a_malformed_entry_is_set_aside_and_the_rest_still_read():
    bad = marker(session="bad", holds_doc="[1]", created=990)
    good = marker(session="good", created=991)
    judged = ledger.live([bad, good], 1000)
    assert judged.malformed == (bad,) and judged.entries == (good,)


def test_expired_entries_are_set_aside_for_removal():
    gone = marker(created=0, lease="10")
    kept = marker(session="s2", created=995)
    judged = ledger.live([gone, kept], 1000)
    assert judged.expired == (gone,) and judged.entries == (kept,)


def test_the_queue_is_first_come_first_served_whatever_the_marker_names():
    late = marker("queue", "x", "1" * 16, created=50, arrival="20", name="a")
    early = marker("queue", "y", "2" * 16, created=60, arrival="10", name="z")
    tie = marker("queue", "w", "3" * 16, created=55, arrival="20", name="b")
    assert ledger.order([late, early, tie]) == [early, late, tie]
    assert ledger.live([late, early, tie], 70).entries == (early, late, tie)


def test_claims_name_other_stacks_reserving_or_queued_before_us_for_our_names():
    mine = {"gamma": "a" * 16}
    own = marker(session="gamma", stack="a" * 16)
    theirs = marker(session="gamma", stack="b" * 16)
    other_name = marker(session="delta", stack="c" * 16)
    assert ledger.claims([own, theirs, other_name], mine) == [theirs]
    me = marker("queue", "gamma", "a" * 16, created=100, arrival="100", name="me")
    before = marker("queue", "gamma", "d" * 16, created=90, arrival="90", name="q1")
    after = marker("queue", "gamma", "e" * 16, created=110, arrival="110", name="q2")
    assert ledger.claims([before, after], mine, me) == [before]
    assert ledger.claims([before, after], mine) == [before, after]
    # a reservation claims its name whenever it was made
    late_reservation = marker("reservation", "gamma", "f" * 16, created=200)
    assert ledger.claims([late_reservation], mine, me) == [late_reservation]


def test_claims_of_entries_without_a_stack_id_go_by_session_name():
    legacy = marker(session="legacy", stack="")
    assert ledger.claims([legacy], {"legacy": ""}) == []
    assert ledger.claims([legacy], {"legacy": "a" * 16}) == [legacy]


def test_every_claim_is_found_whatever_comes_between():
    mine = {"gamma": "a" * 16}
    me = marker("queue", "gamma", "a" * 16, created=100, arrival="100", name="me")
    later = marker("queue", "gamma", "e" * 16, created=110, arrival="110", name="q2")
    other = marker("queue", "delta", "c" * 16, created=5, arrival="5", name="q0")
    reserved = marker("reservation", "gamma", "f" * 16, created=200)
    assert ledger.claims([later, other, reserved], mine, me) == [reserved]


def test_a_count_definitions_entry_claims_every_session_its_holder_places():
    entry = marker("queue", "x-1", "b" * 16, holder=Holder("x-1, x-2", "up", "h", 1, "u"))
    assert entry.sessions == {"x-1", "x-2"}
    assert ledger.claims([entry], {"x-2": "a" * 16}) == [entry]


def test_ahead_are_other_stacks_entries_before_ours():
    me = marker("queue", "epsi", "a" * 16, created=100, arrival="100", name="me")
    twin = marker("queue", "epsi", "b" * 16, created=120, arrival="120", name="t")
    first = marker("queue", "zeta", "c" * 16, created=50, arrival="50", name="f")
    queue = ledger.order([me, twin, first])
    assert ledger.ahead(queue, {"a" * 16}, me) == [first]
    assert ledger.ahead(queue, {"a" * 16}, None) == [first, twin]
    assert ledger.ahead(queue, {"b" * 16}, twin) == [first, me]


def test_an_entry_says_who_it_is():
    e: Entry = marker(session="gamma", stack="b" * 16)
    assert "stack id " + "b" * 16 in e.who() and "u@h" in e.who()
    assert marker(stack="").who().startswith("a stack without an id, sessionctl up of")
    nobody = ledger.entry_of({"st": "b" * 16}, KEYS, "c", "n", 0.0, 300)
    assert nobody.who() == f"stack id {'b' * 16}, an unnamed holder"


@pytest.mark.parametrize(("state", "started", "now", "expected"), [
    ("exited", "2026-01-02T03:04:05Z", 1767323100 + 1, True),  # ended at the expiry
    ("running", "2026-01-02T03:04:05Z", 1767323100 + 1, False),  # still ending (the grace)
    # started again by the restart policy after the expiry, between two exits: holds nothing
    ("running", "2026-01-02T03:05:00.5Z", 1767323100 + 3, True),
    ("running", None, 1767323100 + 3, False),
    ("running", "0001-01-01T00:00:00Z", 1767323100 + 3, False),
    ("exited", "2026-01-02T03:04:05Z", 1767323100 - 1, False),  # before the expiry
])
def test_an_expired_sessions_container_gives_its_capacity_back_once_its_command_ended(
        state, started, now, expected):
    assert ledger.gave_back(state, 1767323100, now, started) is expected  # 03:05:00Z
    assert ledger.gave_back(state, None, now, started) is False


def test_a_gpu_label_that_is_not_text_is_shown_in_its_complaint():
    with pytest.raises(ValueError) as bad:
        ledger.gpus_label(3)
    assert str(bad.value) == "'3' is not a list of GPU ids"


# --- project and expiry labels -----------------------------------------------------------------


def test_a_project_label_absent_or_empty_is_the_default_policys_and_a_name_is_itself():
    assert ledger.project_label(None) == ledger.DEFAULT_PROJECT == "default"
    assert ledger.project_label("") == "default"
    assert ledger.project_label("ml-team") == "ml-team"
    assert ledger.project_label("a" * 63) == "a" * 63


@pytest.mark.parametrize("text", ["ML", "-x", "a" * 64, "a b", 3, ["ml"]])
def test_a_project_label_that_is_not_a_project_name_says_so(text):
    with pytest.raises(ValueError) as bad:
        ledger.project_label(text)
    assert str(bad.value) == f"{str(text)[:40]!r} is not a project name"


def test_an_expiry_label_is_epoch_seconds_or_none():
    assert ledger.expiry_label(None) is None
    assert ledger.expiry_label("1767323100") == 1767323100
    assert ledger.expiry_label(1767323100) == 1767323100
    assert ledger.expiry_label(str(ledger.MAX_TIME)) == ledger.MAX_TIME
    for bad in (str(ledger.MAX_TIME + 1), "x", "-5", "1.5", "", "1e9"):
        assert ledger.expiry_label(bad) is None


def test_a_container_gives_back_from_the_very_second_of_its_expiry():
    expiry = 1767323100  # 2026-01-02T03:05:00Z
    assert ledger.gave_back("exited", expiry, expiry) is True
    assert ledger.gave_back("exited", expiry, expiry - 0.001) is False
    # running since exactly the expiry: the restart, not the session's command
    assert ledger.gave_back("running", expiry, expiry + 1, "2026-01-02T03:05:00Z") is True
    assert ledger.gave_back("running", expiry, expiry + 1, "2026-01-02T03:04:59.9Z") is False


# --- a marker's project, count, priority and ask -----------------------------------------------


FULL_KEYS = {**KEYS, "project": "p", "containers": "c", "priority": "pr", "asks": "as"}


def full(labels, created=0.0, name="n"):
    return ledger.entry_of(labels, FULL_KEYS, "cid", name, created, 300)


def test_a_marker_without_those_keys_is_of_the_default_project_and_asks_nothing():
    e = ledger.entry_of({"p": "ml", "c": "3", "pr": "5", "as": "1,2,3"}, KEYS, "c", "n", 0, 300)
    assert (e.project, e.containers, e.priority, e.asks) == ("default", 0, 0, None)
    assert e.malformed == ()


def test_a_marker_whose_labels_are_absent_is_of_the_default_project_and_asks_nothing():
    e = full({})
    assert (e.project, e.containers, e.priority, e.asks, e.malformed) == (
        "default", 0, 0, None, ())
    assert full({"p": ""}).project == "default" and full({"p": ""}).malformed == ()


def test_a_markers_project_count_priority_and_ask_read_as_written():
    e = full({"p": "ml-team", "c": "3", "pr": "7", "as": "1500,2048,2"})
    assert (e.project, e.containers, e.priority, e.asks, e.malformed) == (
        "ml-team", 3, 7, (1500, 2048, 2), ())
    top = full({"c": str(ledger.MAX_CONTAINERS), "pr": str(ledger.MAX_PRIORITY)})
    assert (top.containers, top.priority, top.malformed) == (10**6, 100, ())


def test_a_malformed_project_is_no_projects_and_says_so():
    e = full({"p": "Not A Project"})
    assert e.project == ""
    assert e.malformed == ("p: 'Not A Project' is not a project name",)
    assert ledger.live([e], 0).entries == ()  # a malformed marker waits in no queue


def test_a_malformed_count_or_priority_is_none_and_says_so():
    e = full({"c": str(ledger.MAX_CONTAINERS + 1), "pr": "101"})
    assert (e.containers, e.priority) == (0, 0)
    assert e.malformed == ("c: '1000001' is not an integer from 0 to 1e+06",
                           "pr: '101' is not an integer from 0 to 100")
    e = full({"c": "1.5", "pr": "-1"})
    assert (e.containers, e.priority, len(e.malformed)) == (0, 0, 2)


@pytest.mark.parametrize("text", ["", "1,2", "1,2,3,4", "1,x,3", "-1,2,3", "1.5,2,3",
                                  f"1,2,{64 * 10**6 + 1}", f"{10**9 + 1},2,3"])
def test_an_ask_that_is_not_three_bounded_integers_is_a_size_not_known(text):
    assert full({"as": text}).asks is None


def test_an_ask_counts_up_to_sixty_four_gpus_per_container():
    assert full({"as": f"0,0,{64 * 10**6}"}).asks == (0, 0, 64 * 10**6)
    assert full({"as": f"{10**9},{2**60},0"}).asks == (10**9, 2**60, 0)


# --- the newest entry of a stack, and what waits before what ------------------------------------


def test_a_stacks_newest_marker_is_the_last_made_whatever_its_name():
    old = marker(session="g", created=1000, name="z-old")
    new = marker(session="g", created=1001, name="a-new")
    assert ledger.live([old, new], 1002).entries == (new,)
    assert ledger.live([new, old], 1002).entries == (new,)


def test_of_two_markers_a_stack_made_at_once_the_greater_name_is_kept_in_any_order():
    a = marker(session="g", created=1000, name="m-a", cid="1")
    b = marker(session="g", created=1000, name="m-b", cid="2")
    assert ledger.live([a, b], 1001).entries == (b,)
    assert ledger.live([b, a], 1001).entries == (b,)


def queued(session, stack, arrival, priority="0"):
    labels = {"k": "queue", "s": session, "st": stack, "l": "90", "a": str(arrival),
              "pr": priority, "h": Holder(session, "up", "h", 1, "u").label()}
    return ledger.entry_of(labels, FULL_KEYS, f"id-{session}", f"q-{session}", arrival, 300)


def test_a_higher_priority_waits_before_earlier_arrivals():
    me = queued("me", "a" * 16, 100)
    early = queued("early", "b" * 16, 50)
    urgent = queued("urgent", "c" * 16, 150, priority="5")
    queue = ledger.order([me, early, urgent])
    prio = lambda e: e.priority  # noqa: E731
    assert ledger.ahead(queue, {"a" * 16}, me, prio) == [early, urgent]
    assert ledger.ahead(queue, {"c" * 16}, urgent, prio) == []
    assert ledger.ahead(queue, {"a" * 16}, me) == [early]  # no priority read: arrival alone


def test_waiting_before_is_strict_an_entry_is_never_before_itself():
    me = queued("gamma", "a" * 16, 100)
    first = queued("first", "b" * 16, 50)
    queue = ledger.order([me, first])
    assert ledger.ahead(queue, set(), me) == [first]
    assert ledger.claims([me], {"gamma": "z" * 16}, me) == []
    assert ledger.claims([first, me], {"gamma": "z" * 16, "first": "z" * 16}, me) == [first]
