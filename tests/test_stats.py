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
