"""The arithmetic of what containers use (issue 43, ``core/stats.py``), on captured output:
stats documents of the local engine (cgroup v1, ``stream=false&one-shot=true``) and
``nvidia-smi``'s documented CSV."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster_sessions.core import stats

DATA = Path(__file__).parent / "data" / "stats"


def captured(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def test_a_container_burning_one_core_under_cpus_1_reads_near_100_percent():
    pair = captured("burning-one-core-cpus-1-cgroup-v1.json")
    first, second = stats.reading(pair["first"]), stats.reading(pair["second"])
    # 0.862 s of CPU in 1.005 s of wall time, of 1 allocated core (the machine was shared)
    assert stats.cpu_percent(first, second, 1.0) == 85.8
    # the same load is half of two allocated cores, and a quarter of four
    assert stats.cpu_percent(first, second, 2.0) == 42.9
    assert stats.cpu_percent(first, second, 4.0) == 21.4


def test_cpu_percent_is_capped_at_the_allocation_and_none_across_a_restart():
    pair = captured("burning-one-core-cpus-1-cgroup-v1.json")
    first, second = stats.reading(pair["first"]), stats.reading(pair["second"])
    assert stats.cpu_percent(first, second, 0.5) == 100.0  # a quota's burst above it
    assert stats.cpu_percent(second, first, 1.0) is None  # the counter went back
    assert stats.cpu_percent(first, first, 1.0) is None  # no time between them


def test_without_a_limit_the_share_is_of_the_hosts_cpus():
    pair = captured("burning-one-core-cpus-1-cgroup-v1.json")
    first, second = stats.reading(pair["first"]), stats.reading(pair["second"])
    assert second.online_cpus == 2
    assert stats.cpu_percent(first, second, 0) == 42.9


def test_the_wall_time_falls_back_to_the_hosts_cpu_time_without_reading_times():
    pair = captured("burning-one-core-cpus-1-cgroup-v1.json")
    a, b = ({**d, "read": "0001-01-01T00:00:00Z"} for d in (pair["first"], pair["second"]))
    # system_cpu_usage moved 2.0 s over 2 CPUs: 1.0 s of wall time
    assert stats.elapsed_s(stats.reading(a), stats.reading(b)) == 1.0
    assert stats.cpu_percent(stats.reading(a), stats.reading(b), 1.0) == 86.2


def test_memory_used_leaves_the_inactive_page_cache_out_and_counts_are_read():
    r = stats.reading(captured("idle-cpus-1-mem-256m-cgroup-v1.json"))
    assert r.mem_used == 1187840 - 90112  # usage - total_inactive_file, as docker/cli
    assert r.mem_limit == 256 * 2**20
    assert (r.pids, r.net_rx, r.net_tx) == (2, 572, 0)
    assert r.read_at == pytest.approx(1796155133.543623, abs=1e-6)


def test_memory_of_cgroup_v2_uses_inactive_file():
    doc = {"memory_stats": {"usage": 10_000_000, "limit": 2**30,
                            "stats": {"inactive_file": 4_000_000, "anon": 5_000_000}}}
    assert stats.reading(doc).mem_used == 6_000_000
    doc["memory_stats"]["stats"]["inactive_file"] = 20_000_000  # never below zero
    assert stats.reading(doc).mem_used == 10_000_000


def test_network_counters_sum_every_interface_and_give_rates():
    doc = {"read": "2026-12-01T10:00:00Z",
           "networks": {"eth0": {"rx_bytes": 100, "tx_bytes": 10},
                        "eth1": {"rx_bytes": 50, "tx_bytes": 5}}}
    later = {"read": "2026-12-01T10:00:02Z",
             "networks": {"eth0": {"rx_bytes": 2100, "tx_bytes": 410},
                          "eth1": {"rx_bytes": 50, "tx_bytes": 5}}}
    use = stats.measured("main1", "agent1", 1.0, (), stats.reading(doc), stats.reading(later),
                         None)
    assert (use.net_rx, use.net_tx) == (2150, 415)
    assert (use.net_rx_rate, use.net_tx_rate) == (1000.0, 200.0)
    assert use.gpus == []  # no GPUs allocated: none, not unknown


# `nvidia-smi --query-gpu=index,uuid,utilization.gpu,memory.used,memory.total
#  --format=csv,noheader,nounits` on a 4-GPU machine, as NVIDIA documents it (nvidia-smi(1),
# --help-query-gpu): ", " between fields, memory in MiB, "[N/A]" for what a board lacks
NVIDIA_SMI_4 = """\
0, GPU-1d6c4c5e-5d2a-4c43-9e48-2f1d5d0c3a10, 93, 58211, 81559
1, GPU-7a0e3b2f-9b5e-4a8e-8d0f-6c1b2a3d4e5f, 71, 40960, 81559
2, GPU-3c2b1a09-8f7e-4d6c-b5a4-392817161514, 0, 0, 81559
3, GPU-0f1e2d3c-4b5a-4968-8776-554433221100, [N/A], [N/A], 81559
"""


def test_nvidia_smi_csv_is_read_by_index_with_memory_in_bytes():
    gpus = stats.nvidia_smi_gpus(NVIDIA_SMI_4)
    assert sorted(gpus) == [0, 1, 2, 3]
    assert gpus[1] == stats.GpuReading(1, "GPU-7a0e3b2f-9b5e-4a8e-8d0f-6c1b2a3d4e5f", 71,
                                       40960 * 2**20, 81559 * 2**20)
    assert gpus[3].util_percent is None and gpus[3].mem_used is None


def test_gpus_map_to_the_containers_allocated_ids_and_unknown_is_never_zero():
    gpus = stats.nvidia_smi_gpus(NVIDIA_SMI_4)
    assert stats.gpus_of((1, 2), gpus) == [
        {"id": 1, "util_percent": 71, "mem_used": 40960 * 2**20, "mem_total": 81559 * 2**20},
        {"id": 2, "util_percent": 0, "mem_used": 0, "mem_total": 81559 * 2**20}]
    assert stats.gpus_of((1,), None) is None  # the agent cannot tell: unknown
    assert stats.gpus_of((7,), gpus) == [{"id": 7, "util_percent": None, "mem_used": None,
                                          "mem_total": None}]


@pytest.mark.parametrize("output", [
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
    "index, uuid, utilization.gpu [%], memory.used [MiB], memory.total [MiB]\n",  # a header
    "0, GPU-x, 93 %, 100 MiB, 200 MiB\n",  # units: not the query asked for
])
def test_what_is_not_the_documented_csv_is_refused(output):
    with pytest.raises(stats.GpuOutputError):
        stats.nvidia_smi_gpus(output)


def test_the_last_accepted_login_in_sshds_log_is_taken():
    lines = [
        "2026-12-01T10:00:00.000000001Z Server listening on 0.0.0.0 port 2200.",
        "2026-12-01T10:00:05.5Z Accepted publickey for work from 10.0.3.4 port 40112 ssh2: "
        "ED25519-CERT SHA256:abc",
        "2026-12-01T10:00:09Z Received disconnect from 10.0.3.4 port 40112:11: disconnected",
        "2026-12-01T10:01:00Z Connection closed by 10.0.3.5 port 1 [preauth]",
        "2026-12-01T10:00:07Z Accepted keyboard-interactive/pam for work from 10.0.3.9 port "
        "1 ssh2",
    ]
    assert stats.last_ssh_login(lines) == stats.parse_time("2026-12-01T10:00:07Z")
    assert stats.last_ssh_login(lines[:1]) is None
    assert stats.last_ssh_login(lines + ["yesterday Accepted publickey for work from 10.0.3.9 "
                                         "port 1 ssh2"]) == stats.parse_time(
        "2026-12-01T10:00:07Z")  # a line whose time is not one changes nothing
    assert stats.last_ssh_login(["2026-12-01T10:00:00Z user text: Accepted publickey for x "
                                 "from y port 1"]) is None  # only sshd's own line


PROC_NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:0898 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 0300000A:0898 0400000A:9CB0 01 00000000:00000000 02:000A7E7F 00000000     0        0 2 1
   2: 0300000A:D3E2 0500000A:0898 01 00000000:00000000 02:000A7E7F 00000000     0        0 3 1
   3: 0300000A:22B8 0400000A:9CB2 01 00000000:00000000 02:000A7E7F 00000000  9001        0 4 1
   4: 0300000A:0898 0400000A:9CB4 06 00000000:00000000 03:00000ABC 00000000     0        0 0 3
  sl  local_address                         remote_address                        st
   0: 00000000000000000000000000000000:0898 00000000000000000000000000000000:0000 0A
   1: 0000000000000000FFFF00000300000A:0898 0000000000000000FFFF00000400000A:9CB6 01
"""


def test_open_connections_count_established_ones_to_each_port_only():
    # listening (0A), main1's own connection out to a sub's 2200 (its local port is not
    # 2200) and a TIME_WAIT (06) do not count; tcp6's established one does
    assert stats.open_connections(PROC_NET_TCP, [2200, 8888, 9999]) == {2200: 2, 8888: 1,
                                                                       9999: 0}
    assert stats.last_login(1000.0, 2, 2000.0) == 2000.0
    assert stats.last_login(1000.0, 0, 2000.0) == 1000.0


def use(cpu, gpus=None, login=None, state="running"):
    return stats.ContainerUse("h", "a", 1.0, 2**30, cpu_percent=cpu, gpus=gpus,
                              last_login=login, state=state)


def test_used_is_the_mean_over_measured_containers_and_gpus():
    rows = [use(90.0, [{"util_percent": 80}, {"util_percent": 60}]), use(10.0, []),
            use(None, state="gone")]
    assert stats.session_used(rows) == {"cpu_percent": 50.0, "gpu_percent": 70.0}
    assert stats.session_used([use(3.0, None)]) == {"cpu_percent": 3.0, "gpu_percent": None}


def test_idle_since_is_the_last_login_or_start_only_while_idle_now():
    assert stats.idle_since([use(1.0, login=500.0), use(2.0)], started=100.0) == 500.0
    assert stats.idle_since([use(1.0), use(2.0)], started=100.0) == 100.0
    assert stats.idle_since([use(1.0), use(50.0)], started=100.0) is None  # busy
    assert stats.idle_since([use(1.0, [{"util_percent": 90}])], started=100.0) is None
    assert stats.idle_since([use(None, state="gone")], started=100.0) is None


def test_window_average_takes_only_the_samples_inside_the_window():
    samples = [(0.0, 100.0), (8.0, 20.0), (9.0, None), (10.0, 40.0)]
    assert stats.window_average(samples, now=10.0, window=5.0) == 30.0
    assert stats.window_average(samples, now=10.0, window=60.0) == 53.3
    assert stats.window_average([], now=10.0, window=5.0) is None


def test_the_document_has_contract_9s_fields_with_integer_bytes():
    pair = captured("burning-one-core-cpus-1-cgroup-v1.json")
    c = stats.measured("main1", "agent1", 1.0, (0,), stats.reading(pair["first"]),
                       stats.reading(pair["second"]), stats.nvidia_smi_gpus(NVIDIA_SMI_4))
    doc = stats.usage_document("demo", 1796155133.5, [c])
    assert set(doc) == {"session", "sampled_at", "containers"}
    row = doc["containers"][0]
    assert {"host", "agent", "cpus", "cpu_percent", "mem_limit", "mem_used", "pids", "net_rx",
            "net_tx", "gpus", "last_login"} <= set(row)
    for key in ("mem_limit", "mem_used", "net_rx", "net_tx"):
        assert type(row[key]) is int, key
    assert row["gpus"][0]["id"] == 0 and row["gpus"][0]["util_percent"] == 93


def test_bars():
    assert stats.bar(0.5) == "[#####.....]"
    assert stats.bar(1.7, 4) == "[####]" and stats.bar(0.0, 4) == "[....]"
    assert stats.bar(None, 4) == "[?   ]"


def test_bar_lines_say_allocated_of_declared_and_used_of_allocated():
    used = stats.Used(cores=1.5, mem=2**30, gpu_percent=None, measured=2, gpus_unknown=True)
    lines = stats.bar_lines("agent1", 2.0, 8.0, 2 * 2**30, 16 * 2**30, 2, 4, used)
    assert lines[0] == "agent1  cpu  alloc [###.......] 2/8  used [########..] 1.5/2 cores"
    assert lines[1] == ("        mem  alloc [#.........] 2.0 GiB/16.0 GiB  used [#####.....] "
                        "1.0 GiB/2.0 GiB")
    assert lines[2] == "        gpu  alloc [#####.....] 2/4  used unknown (no nvidia-smi)"
    assert stats.bar_lines("a", 0, 1, 0, 2**30, 0, 0, None)[2] == "   gpu  none declared"
    assert stats.bar_lines("a", 0, 1, 0, 2**30, 0, 0, None)[0].endswith("used -")


def test_the_gpu_use_fact_reads_the_csv_and_says_unknown_without_the_tool():
    from cluster_sessions.agents.facts import NO_NVIDIA_SMI, GpuUse

    fact = GpuUse()
    assert stats.NVIDIA_SMI_QUERY in fact.command
    assert fact.parse(0, NVIDIA_SMI_4, "")[1].util_percent == 71
    assert fact.parse(0, f"{NO_NVIDIA_SMI}\n", "") is None  # no nvidia-smi on the agent
    assert fact.parse(9, "", "NVIDIA-SMI has failed because it couldn't communicate") is None
    assert fact.parse(0, "Failed to initialize NVML: Driver/library version mismatch\n",
                      "") is None


# --- the cgroup read of an agent reached over SSH (agents/sampling.py's one command) ---------

CGROUP_V1 = (DATA / "cgroup-read-v1-nobody.txt").read_text()  # captured: Docker 20.10.24,
# cgroup v1 (cgroupfs), run as `nobody`: a container burning under --cpus 0.5 -m 64m, an idle
# one without limits, and a pid that is no process (its line X)
BURNING = "e0b9bb0f29aa56bca68346cf9ff54c36b45a3238af2bb2249401802df18726b6"
IDLE = "f3748fcae7cb47ad77321b9103af8d637938b56271798934b1d3f687424bbb1f"


def test_the_cgroup_read_gives_two_readings_of_each_container_it_could_read():
    found = stats.cgroup_readings(CGROUP_V1)
    assert set(found) == {BURNING, IDLE}  # the line X's container is left to the API
    first, second = found[BURNING]
    assert (first.cpu_ns, second.cpu_ns) == (796676115, 1303601371)
    assert second.read_at - first.read_at == pytest.approx(1.009834495, abs=1e-6)
    assert stats.cpu_percent(first, second, 0.5) == 100.0  # 0.507 s of CPU in 1.01 s, of 0.5
    assert (second.mem_used, second.mem_limit, second.pids) == (606208, 64 * 2**20, 1)
    assert (first.net_rx, second.net_rx, second.net_tx) == (646, 736, 0)  # eth0; lo left out
    assert second.online_cpus == 2


def test_an_unlimited_containers_limit_is_the_hosts_memory():
    _, idle = stats.cgroup_readings(CGROUP_V1)[IDLE]
    assert idle.mem_limit == 24683568 * 1024  # v1's 9223372036854771712 is "no limit"


V2 = f"""cs-cgroup-read 1
H 4 16384000
R {IDLE} 1000000000000000000
cpu_us 2000000
mem 10485760
limit max
inactive 4194304
pids 3
N   eth0:4268009586  148277    0    0    0     0          0         0 11269774  116991    0    0    0     0       0          0
E {IDLE}
R {IDLE} 1000000002000000000
cpu_us 3000000
mem 10485760
limit max
inactive 4194304
pids 3
N   eth0:4268019586  148280    0    0    0     0          0         0 11279774  116995    0    0    0     0       0          0
E {IDLE}
"""  # noqa: E501 — constructed in cgroup v2's files' units (cgroup-v2.rst:
# cpu.stat usage_usec in microseconds, memory.max "max" when unlimited), not captured: this
# machine has cgroup v1; the net line as the kernel prints a counter wider than its column


def test_cgroup_v2_counts_cpu_in_microseconds_and_max_is_no_limit():
    first, second = stats.cgroup_readings(V2)[IDLE]
    assert (first.cpu_ns, second.cpu_ns) == (2 * 10**9, 3 * 10**9)
    assert stats.cpu_percent(first, second, 1.0) == 50.0  # 1 s of CPU in 2 s
    assert second.mem_limit == 16384000 * 1024 and second.mem_used == 6 * 2**20
    assert (first.net_rx, second.net_tx) == (4268009586, 11279774)
    assert stats.rate(first.net_rx, second.net_rx, 2.0) == 5000.0


def test_a_reading_cut_short_or_missing_a_file_is_left_out():
    cut = V2[:V2.rindex("E ")]  # the command ended before its second reading's end
    assert stats.cgroup_readings(cut)[IDLE] == stats.cgroup_readings(V2)[IDLE][:1]
    no_pids = V2.replace("pids 3\n", "")
    assert stats.cgroup_readings(no_pids) == {}


@pytest.mark.parametrize("bad", [
    "",  # no header: not this command's output
    "cs-cgroup-read 2\n",
    "cs-cgroup-read 1\nR notanid 1\n",
    f"cs-cgroup-read 1\nR {IDLE} 1\nmem -5\n",
    f"cs-cgroup-read 1\nR {IDLE} 1\nmem 12abc\n",
    f"cs-cgroup-read 1\nR {IDLE} 1\nN eth0: 1 2 3\n",
    f"cs-cgroup-read 1\nR {IDLE} 1\nE {BURNING}\n",
    "cs-cgroup-read 1\ncpu_ns 5\n",
    "cs-cgroup-read 1\nsh: 1: date: not found\n",
    f"cs-cgroup-read 1\nR {IDLE} 17%N\n",  # a date without %N
])
def test_anything_but_the_format_is_refused(bad):
    with pytest.raises(stats.CgroupOutputError):
        stats.cgroup_readings(bad)


def test_closing_the_kept_clients_while_a_samples_thread_adds_its_own_does_not_fail(
        monkeypatch):
    """Ctrl-C ends ``top --watch`` during a sample: an agent's thread still connecting adds its
    client to ``kept`` while the watch closes them (it raised "dictionary changed size during
    iteration": tests/test_top_lab.py's Ctrl-C)."""
    from cluster_sessions.agents import engine, sampling

    kept = {"agent1": "c1", "agent2": "c2"}
    closed = []

    def close(client):
        closed.append(client)
        kept[f"late-{client}"] = "late"  # what the still-running thread does meanwhile
    monkeypatch.setattr(engine, "close_client", close)
    sampling.close_kept(kept)
    assert closed == ["c1", "c2"]


# --- the edges of each rule (what a mutant of core/stats.py would change) --------------------

def test_engine_times_are_read_to_the_nanosecond_with_their_offset():
    base = 1796119200.0  # 2026-12-01T10:00:00Z
    assert stats.parse_time("2026-12-01T10:00:00Z") == base
    assert stats.parse_time("2026-12-01T10:00:00.5Z") == base + 0.5
    assert stats.parse_time("2026-12-01T10:00:00.000000001Z") == base + 1e-9
    assert stats.parse_time("2026-12-01T12:00:00+02:00") == base
    assert stats.parse_time("2026-12-01T08:30:00-01:30") == base
    for not_a_time in ("0001-01-01T00:00:00Z", "", None, "2026-12-01 10:00:00Z",
                       "2026-12-01T10:00:00", "yesterday", "2026-12-01T10:00:00.Z"):
        assert stats.parse_time(not_a_time) is None, not_a_time


def test_an_empty_stats_document_reads_as_zeroes_on_one_cpu():
    assert stats.reading({}) == stats.Reading(None, 0, 0, 1, 0, 0, 0, 0, 0)
    doc = {"cpu_stats": {"cpu_usage": {"total_usage": "12", "percpu_usage": [1, 2, 3]},
                         "system_cpu_usage": -4, "online_cpus": 0},
           "pids_stats": {"current": "x"}}
    r = stats.reading(doc)
    assert (r.cpu_ns, r.system_ns, r.online_cpus, r.pids) == (12, 0, 3, 0)
    doc["cpu_stats"]["online_cpus"] = 2  # the engine's count wins over the per-cpu list
    assert stats.reading(doc).online_cpus == 2


def test_v1s_hierarchy_total_is_preferred_and_inactive_equal_to_usage_is_not_subtracted():
    doc = {"memory_stats": {"usage": 1000, "stats": {"total_inactive_file": 300,
                                                     "inactive_file": 100}}}
    assert stats.reading(doc).mem_used == 700
    doc["memory_stats"]["stats"] = {"inactive_file": 1000}
    assert stats.reading(doc).mem_used == 1000


def r(at=None, cpu=0, system=0, cpus=1, rx=0, tx=0, limit=0):
    return stats.Reading(at, cpu, system, cpus, 0, limit, 0, rx, tx)


def test_the_wall_time_of_two_readings_and_its_fallbacks():
    assert stats.elapsed_s(r(10.0), r(12.5)) == 2.5
    # the same reading time falls back to the host's CPU time, over its CPUs
    assert stats.elapsed_s(r(10.0, system=0), r(10.0, system=8 * 10**9, cpus=4)) == 2.0
    assert stats.elapsed_s(r(None), r(12.0, system=3 * 10**9, cpus=0)) == 3.0  # 0 CPUs: 1
    assert stats.elapsed_s(r(12.0, system=5), r(10.0, system=5)) is None  # nothing moved


def test_cpu_percent_of_an_idle_container_is_zero_and_rounded_to_a_tenth():
    assert stats.cpu_percent(r(10.0, cpu=5), r(11.0, cpu=5), 1.0) == 0.0
    assert stats.cpu_percent(r(0.0), r(3.0, cpu=10**9), 1.0) == 33.3
    assert stats.cpu_percent(r(0.0), r(3.0, cpu=2 * 10**9), 1.0) == 66.7
    assert stats.cpu_percent(r(0.0), r(1.0, cpu=10**9, cpus=0), 0) == 100.0  # host: 1 CPU
    assert stats.cpu_percent(r(0.0), r(1.0, cpu=10**9, cpus=4), 0) == 25.0
    # a second is 10**9 ns to the last one: 1,235,000,000,100 ns in 10,000 s is 12.350000001 %
    assert stats.cpu_percent(r(0.0), r(10_000.0, cpu=1_235_000_000_100), 1.0) == 12.4


def test_rates_need_a_positive_wall_time_and_a_counter_that_did_not_go_back():
    assert stats.rate(5, 5, 1.0) == 0.0
    assert stats.rate(0, 10, 3.0) == 3.3
    assert stats.rate(0, 10, 0.0) is None and stats.rate(0, 10, -1.0) is None
    assert stats.rate(0, 10, None) is None and stats.rate(10, 0, 1.0) is None


def test_counts_and_net_dev_lines():
    assert stats._count("9" * 20, "x") == int("9" * 20)
    with pytest.raises(stats.CgroupOutputError, match="^x: not a count: '9{21}'$"):
        stats._count("9" * 21, "x")
    fields = " ".join(str(n) for n in range(100, 116))
    assert stats._net_dev_line(f"  eth0: {fields}") == ("eth0", 100, 108)
    for bad in (f"eth0 {fields}", f" : {fields}", "eth0: " + " ".join(["1"] * 15),
                "eth0: " + " ".join(["1"] * 17)):
        with pytest.raises(stats.CgroupOutputError, match="^not a /proc/net/dev line: "):
            stats._net_dev_line(bad)


NET0 = "N eth0: " + " ".join(["0"] * 16)


def cg(*body: str, host: str | None = "H 2 1000") -> str:
    head = ["cs-cgroup-read 1"] + ([host] if host else [])
    return "\n".join(head + list(body)) + "\n"


def one(**files):
    """One reading of IDLE with the given files (None: the line left out)."""
    lines = [f"R {IDLE} 2500000000"]
    values = {"cpu_ns": "7", "mem": "600", "limit": "800", "inactive": "100", "pids": "2"}
    values.update(files)
    lines += [f"{k} {v}" for k, v in values.items() if v is not None]
    return lines + [f"E {IDLE}"]


def test_a_cgroup_reading_is_read_to_the_unit():
    (got,) = stats.cgroup_readings(cg(*one()))[IDLE]
    assert got == stats.Reading(2.5, 7, 0, 2, 500, 800, 2, 0, 0)
    (got,) = stats.cgroup_readings(cg(*one(cpu_ns=None, cpu_us="7", inactive=None)))[IDLE]
    assert (got.cpu_ns, got.mem_used) == (7000, 600)
    (got,) = stats.cgroup_readings(cg(*one(inactive="600")))[IDLE]
    assert got.mem_used == 600  # inactive not below usage: usage
    (got,) = stats.cgroup_readings(cg(*one(), host="H 0 100"))[IDLE]
    assert got.online_cpus == 1 and got.mem_limit == 800  # below MemTotal x 1024: kept
    (got,) = stats.cgroup_readings(cg(*one(limit="max"), host=None))[IDLE]
    assert got.mem_limit == 0  # unlimited and no host line: not known
    assert got.online_cpus == 1
    (got,) = stats.cgroup_readings(cg(*one(limit="5000000")))[IDLE]
    assert got.mem_limit == 1000 * 1024
    (got,) = stats.cgroup_readings(cg(*one(limit="1024000")))[IDLE]
    assert got.mem_limit == 1024000  # equal to the host's memory


@pytest.mark.parametrize("missing", ["mem", "limit", "pids"])
def test_a_reading_missing_any_one_file_is_left_out(missing):
    assert stats.cgroup_readings(cg(*one(**{missing: None}))) == {}


def test_a_reading_without_a_cpu_figure_is_left_out_and_blank_lines_are_nothing():
    assert stats.cgroup_readings(cg(*one(cpu_ns=None))) == {}
    assert set(stats.cgroup_readings(cg("", *one(), "  "))) == {IDLE}


def test_network_lines_sum_every_interface_but_lo():
    def net(iface, rx, tx):
        f = ["0"] * 16
        f[0], f[8] = str(rx), str(tx)
        return f"N {iface}: " + " ".join(f)
    body = one()
    body[1:1] = [net("lo", 1000, 1000), net("eth0", 10, 1), net("eth1", 20, 2)]
    (got,) = stats.cgroup_readings(cg(*body))[IDLE]
    assert (got.net_rx, got.net_tx) == (30, 3)


def test_a_refused_container_ends_its_reading():
    assert stats.cgroup_readings(cg(f"X {IDLE}", f"X {IDLE} cannot read it")) == {}
    with pytest.raises(stats.CgroupOutputError, match="^a figure outside a reading: 'mem 5'$"):
        stats.cgroup_readings(cg(f"R {IDLE} 1", f"X {IDLE} gone", "mem 5"))
    with pytest.raises(stats.CgroupOutputError, match="^not a refusal line: 'X notanid'$"):
        stats.cgroup_readings(cg("X notanid"))
    with pytest.raises(stats.CgroupOutputError, match="^not a refusal line: "):
        stats.cgroup_readings(cg(f"X {IDLE}x"))


LONG = "9" * 90  # a refusal shows a line's first 80 characters, no more


@pytest.mark.parametrize("line, message", [
    ("H 2", "not a host line: "),
    (f"H 2 3 {LONG}", "not a host line: "),
    ("H 2  3", "not a host line: "),  # one space between fields, as the command prints them
    (f"R {IDLE.upper()} 1", "not a reading's start: "),
    (f"R {IDLE[:63]} 1", "not a reading's start: "),
    (f"R {IDLE} 1 {LONG}", "not a reading's start: "),
    (f"R {IDLE}  1", "not a reading's start: "),
    ("N eth0: " + " ".join(["1234567"] * 16), "a network line outside a reading: "),
    (f"pids {LONG}", "a figure outside a reading: "),
    (f"E {IDLE}{LONG}", "an end without its reading: "),
    (f"X {LONG}", "not a refusal line: "),
    ("W" * 100, "the cgroup read printed "),
])
def test_each_refusal_says_what_it_read(line, message):
    with pytest.raises(stats.CgroupOutputError) as err:
        stats.cgroup_readings(cg(line))
    assert str(err.value) == message + repr(line[:80])


@pytest.mark.parametrize("body, message", [
    (["H 2 x"], "MemTotal: not a count: 'x'"),
    (["H x 3"], "online cpus: not a count: 'x'"),
    ([f"R {IDLE} x"], "time: not a count: 'x'"),
    ([f"R {IDLE} 1", "mem x"], "mem: not a count: 'x'"),
    ([f"R {IDLE} 1", "N eth0: x" + " 0" * 15], "rx bytes: not a count: 'x'"),
    ([f"R {IDLE} 1", "N eth0:" + " 0" * 8 + " x" + " 0" * 7], "tx bytes: not a count: 'x'"),
    ([f"R {IDLE} 1", f"N eth0: {'1' * 50}" + " 0" * 15],
     f"rx bytes: not a count: '{'1' * 40}'"),
])
def test_a_count_that_is_not_one_names_the_figure(body, message):
    with pytest.raises(stats.CgroupOutputError) as err:
        stats.cgroup_readings(cg(*body))
    assert str(err.value) == message


def test_an_interface_name_holds_no_colon():
    """The kernel refuses one (``dev_valid_name``): a second colon is not this file."""
    with pytest.raises(stats.CgroupOutputError, match="^not a /proc/net/dev line: "):
        stats._net_dev_line("a:b: " + " ".join(["1"] * 16))
    line = "eth0: " + " ".join(["1"] * 16) + " " + LONG
    with pytest.raises(stats.CgroupOutputError) as err:
        stats._net_dev_line(line)
    assert str(err.value) == f"not a /proc/net/dev line: {line[:80]!r}"


def test_a_reading_missing_a_file_leaves_the_next_ones_read():
    body = [f"R {BURNING} 1", "cpu_ns 1", "mem 1", "limit 1", f"E {BURNING}", *one()]
    assert set(stats.cgroup_readings(cg(*body))) == {IDLE}


def test_the_header_refusal_shows_the_first_80_characters():
    with pytest.raises(stats.CgroupOutputError) as err:
        stats.cgroup_readings("Z" * 100)
    assert str(err.value) == f"not the cgroup read's output: '{'Z' * 80}'"


def test_nvidia_smi_fields_round_and_say_none_for_what_a_board_lacks():
    assert stats._field(" 5 ") == 5 and stats._field("93.6") == 94
    for lacking in ("[N/A]", "[Not Supported]", "N/A", "", "  "):
        assert stats._field(lacking) is None
    for bad in ("abc", "-1", "1e3", "5.", "x" * 50):
        with pytest.raises(stats.GpuOutputError) as err:
            stats._field(bad)
        assert str(err.value) == f"not a number: {bad[:40]!r}"
    gpus = stats.nvidia_smi_gpus("\n  \n0, GPU-a, 93.6, 1, N/A\n")
    assert gpus == {0: stats.GpuReading(0, "GPU-a", 94, 2**20, None)}


@pytest.mark.parametrize("line", ["-1, GPU-a, 1, 1, 1", "a, GPU-a, 1, 1, 1", "0, GPU-a, 1, 1",
                                  "0, GPU-a, 1, 1, 1, 1"])
def test_a_gpu_line_is_five_fields_led_by_its_index(line):
    with pytest.raises(stats.GpuOutputError, match=f"^nvidia-smi printed '{line}'$"):
        stats.nvidia_smi_gpus(f"  {line}  \n")


def test_a_refused_gpu_line_shows_its_first_100_characters():
    line = "NVIDIA-SMI has failed " + "z" * 100
    with pytest.raises(stats.GpuOutputError) as err:
        stats.nvidia_smi_gpus(f" {line}\n")
    assert str(err.value) == f"nvidia-smi printed {line[:100]!r}"


def test_proc_net_tcp_lines_that_are_not_connections_are_skipped():
    text = "0: 0A:0898\n1: 0300000A 0400000A:9CB0 01\n2: 0300000A:ZZ 04:9CB0 01\n" \
           "3: 0300000A:0898 0400000A:9CB0 01\n"
    assert stats.open_connections(text, ["2200"]) == {2200: 1}


def test_a_containers_dict_is_contract_9s_object():
    c = stats.ContainerUse("main1", "agent1", 0.5, 2**30, cpu_percent=12.5, mem_used=10,
                           pids=3, net_rx=4, net_tx=5, net_rx_rate=1.5, net_tx_rate=2.5,
                           gpu_ids=(1, 0), gpus=[{"id": 1}], last_login=99.5,
                           connections={8888: 1, 2200: 2}, source="cgroup")
    assert c.to_dict() == {
        "host": "main1", "agent": "agent1", "cpus": 0.5, "cpu_percent": 12.5,
        "mem_limit": 2**30, "mem_used": 10, "pids": 3, "net_rx": 4, "net_tx": 5,
        "gpus": [{"id": 1}], "last_login": 99.5, "gpu_ids": [1, 0], "net_rx_rate": 1.5,
        "net_tx_rate": 2.5, "connections": {"2200": 2, "8888": 1}, "state": "running",
        "error": None, "source": "cgroup"}
    assert list(c.to_dict()["connections"]) == ["2200", "8888"]
    assert stats.ContainerUse("h", "a", 1, None, error="why").to_dict()["error"] == "why"


def test_measured_gives_every_figure_of_the_second_reading():
    first = stats.Reading(10.0, 0, 0, 2, 5, 0, 1, 100, 10)
    second = stats.Reading(12.0, 10**9, 0, 2, 50, 0, 4, 300, 50)
    assert stats.measured("main1", "agent1", 1.0, (), first, second, None) == \
        stats.ContainerUse("main1", "agent1", 1.0, None, cpu_percent=50.0, mem_used=50,
                           pids=4, net_rx=300, net_tx=50, net_rx_rate=100.0, net_tx_rate=20.0,
                           gpu_ids=(), gpus=[])
    got = stats.measured("h", "a", 1.0, (3,), first, second, {})
    assert got.gpus == [{"id": 3, "util_percent": None, "mem_used": None, "mem_total": None}]
    assert stats.measured("h", "a", 1.0, (3,), first, second, None).gpus is None
    assert got.gpu_ids == (3,)


def test_idle_is_strictly_below_the_threshold_for_cpu_and_every_gpu():
    assert stats.idle_since([use(5.0)], started=100.0) is None  # 5 % is not below 5 %
    assert stats.idle_since([use(4.9)], started=100.0) == 100.0
    assert stats.idle_since([use(1.0, [{"util_percent": None}])], started=100.0) == 100.0
    assert stats.idle_since([use(1.0, [{"util_percent": 5}])], started=100.0) is None
    assert stats.idle_since([use(1.0, [{"util_percent": 4}])], started=100.0) == 100.0
    assert stats.idle_since([use(20.0)], started=100.0, below=30.0) == 100.0
    # a GPU that does not say is taken as idle, however low the threshold
    assert stats.idle_since([use(0.5, [{"util_percent": None}])], started=100.0,
                            below=1.0) == 100.0
    assert stats.idle_since([use(1.0)], started=None) is None
    assert stats.idle_since([use(1.0, login=50.0)], started=None) == 50.0
    assert stats.idle_since([use(1.0, login=500.0, state="gone")], started=100.0) is None


def test_a_window_includes_both_its_ends_and_nothing_after_now():
    samples = [(5.0, 10.0), (10.0, 20.0), (11.0, 90.0)]
    assert stats.window_average(samples, now=10.0, window=5.0) == 15.0
    assert stats.window_average(samples, now=10.0, window=4.9) == 20.0


def test_the_usage_document_is_exactly_its_three_fields():
    c = stats.ContainerUse("h", "a", 1.0, None)
    assert stats.usage_document("demo", 12.34567, [c]) == {
        "session": "demo", "sampled_at": 12.346, "containers": [c.to_dict()]}


def test_bars_round_half_up_and_texts():
    assert stats.bar(0.25) == "[###.......]" and stats.bar(0.04) == "[..........]"
    assert stats.bar(0.05) == "[#.........]" and stats.bar(-1.0, 3) == "[...]"
    assert stats.bar(None) == "[?         ]"
    assert (stats.percent_text(None), stats.percent_text(42.4),
            stats.percent_text(42.6)) == ("?", "42 %", "43 %")
    sizes = {None: "?", 0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB",
             2**20: "1.0 MiB", 2**30: "1.0 GiB", 2**40: "1.0 TiB", 2**50: "1024.0 TiB",
             2**20 - 1: "1024.0 KiB"}
    for size, text in sizes.items():
        assert stats.human_size(size) == text, size


@pytest.fixture
def frozen_now(monkeypatch):
    """``now`` at 2026-12-01 23:30:00 UTC, and the local zone nine hours ahead (where it is
    already the 2nd): a clock that forgot UTC would say the other day."""
    import time
    from datetime import datetime as real

    class Frozen(real):
        @classmethod
        def now(cls, tz=None):
            at = real(2026, 12, 1, 23, 30, tzinfo=stats.UTC)
            return at if tz is not None else at.astimezone().replace(tzinfo=None)

    monkeypatch.setattr(stats, "datetime", Frozen)
    monkeypatch.setenv("TZ", "KST-9")
    time.tzset()
    yield real(2026, 12, 1, tzinfo=stats.UTC).timestamp()
    monkeypatch.undo()
    time.tzset()


def test_clock_says_the_time_today_and_the_date_before(frozen_now):
    midnight = frozen_now
    assert stats.clock(None) == "-"
    assert stats.clock(midnight + 3600 + 65) == "01:01:05Z"
    assert stats.clock(midnight + 23 * 3600 + 59 * 60 + 59) == "23:59:59Z"
    assert stats.clock(midnight - 1) == "2026-11-30 23:59Z"
    assert stats.clock(midnight + 86400) == "2026-12-02 00:00Z"


def test_used_sums_busy_cores_and_memory_of_the_running_measured_containers():
    def c(cpu, cpus, mem, gpu_ids=(), gpus=None, state="running"):
        return stats.ContainerUse("h", "a", cpus, None, cpu_percent=cpu, mem_used=mem,
                                  gpu_ids=gpu_ids, gpus=gpus, state=state)
    rows = [c(50.0, 2.0, 100), c(25.0, 4.0, None), c(None, 8.0, 7), c(90.0, 8.0, 9, state="gone"),
            c(0.0, 1.0, 1, (0, 1), [{"util_percent": 30}, {"util_percent": 60}])]
    used = stats.used_of(rows)
    assert used == stats.Used(cores=2.0, mem=101, gpu_percent=45.0, measured=3,
                              gpus_unknown=False)
    assert used.to_dict() == {"cpu": 2.0, "mem": 101, "gpu_percent": 45.0,
                              "gpus_unknown": False, "measured_containers": 3}
    unknown = stats.used_of(rows + [c(1.0, 1.0, 0, (2,), None)])
    assert unknown.gpus_unknown and unknown.gpu_percent == 45.0
    assert not stats.used_of([c(1.0, 1.0, 0, (), None)]).gpus_unknown  # no GPUs: not unknown
    assert not stats.used_of([c(None, 1.0, 0, (2,), None)]).gpus_unknown  # not measured
    assert stats.Used(1.23456, 0, None, 0).to_dict()["cpu"] == 1.235
    assert stats.fraction(1, 0) is None and stats.fraction(1, 4) == 0.25


def test_bar_lines_with_measured_gpus():
    used = stats.Used(cores=1.25, mem=0, gpu_percent=45.0, measured=1, gpus_unknown=True)
    lines = stats.bar_lines("ab", 2.5, 3.0, 0, 2**30, 1, 4, used)
    assert lines[0] == "ab  cpu  alloc [########..] 2.5/3  used [#####.....] 1.2/2.5 cores"
    assert lines[1] == "    mem  alloc [..........] 0 B/1.0 GiB  used [?         ] 0 B/0 B"
    assert lines[2] == "    gpu  alloc [###.......] 1/4  used [#####.....] 45 % (some unknown)"
    lines = stats.bar_lines("ab", 0, 4.0, 0, 2**30, 0, 2,
                            stats.Used(0.0, 0, 50.0, 1, gpus_unknown=False))
    assert lines[2] == "    gpu  alloc [..........] 0/2  used -"
    assert stats.bar_lines("ab", 0, 4.0, 0, 2**30, 1, 2,
                           stats.Used(0.0, 0, 50.0, 1))[2].endswith("used [#####.....] 50 %")
