"""The rules across fields of a definition (``session_problems``, ``pool_problems``) and spec's
small functions, called directly: every refusal is asserted whole, as ``validate`` prints it
after the file (tests/test_loader.py reaches the same rules through files)."""

from __future__ import annotations

import pytest

from cluster_sessions.core.spec import (
    Agent,
    Pool,
    PortRange,
    Session,
    agent_address,
    clean_target,
    json_schema,
    mount_source_problems,
    mount_target_allowed,
    pool_problems,
    session_problems,
    slots_per_container,
)

NO_CONTROLS = "must not contain control characters (newline, escape, NUL, ...)"
NAME_RULE = ("must be 4-64 characters of letters, digits, '_', '.' or '-', starting and ending "
             "with a letter, digit or '_'")
FOLDER_RULE = ("is not a folder name: one name of at most 64 letters, digits, '_', '.' or '-', "
               "not starting with '.' or '-' (a folder is a directory directly below the pool's "
               "storage root, never a path)")
NOT_DATA = ("is not where a user's data goes: mount below the home (/home/{u}/NAME, not "
            "/home/{u}/.ssh) or at /data and below, /mnt and below, /scratch and below, "
            "/workspace and below; the rest of the container is the image's and the set-up's, "
            "which runs as root")
SPLIT = ("must not contain whitespace, quotes or '%': the path is handed to ssh as an -o "
         "option, which would split or expand it")
OPTION = "must not begin with '-' (ssh would read it as an option)"
NOT_HOST = "must be a host name or IP address (letters, digits, '.', '-', ':')"
MAX_ARG = 32 * 4096


def session(**fields) -> Session:
    return Session.model_validate({"kind": "ClusterSession", "name": "train-demo",
                                   "pool": "lab", "image": "img", **fields})


def problems(**fields) -> list[tuple[str, str]]:
    return session_problems(session(**fields))


def agent(name: str = "a1", **fields) -> dict:
    return {"name": name, "capacity": {"cpu": 1, "mem": "1g"}, **fields}


def pool(*agents: dict, **fields) -> Pool:
    return Pool.model_validate({"kind": "AgentPool", "name": "lab",
                                "agents": list(agents) or [agent()], **fields})


@pytest.mark.parametrize(
    ("fields", "found"),
    [
        ({"name": "abc"}, [("name", NAME_RULE)]),
        ({"name": "a" * 65}, [("name", NAME_RULE)]),
        ({"name": "a" * 64}, []),
        ({"name": "abcd"}, []),
        ({"name": "_abcd"}, [("name", "must start with a letter or digit: it begins the Docker "
                              "container and network names, which allow nothing else there")]),
        ({"name": "abc_"}, []),
        ({"count": 2, "cluster": {"size": 1025}},
         [("count", "2 sessions of 1025 containers are 2050 containers, more than the 2048 "
           "one definition may plan: lower the count or the size")]),
        ({"count": 2, "cluster": {"size": 1024}}, []),
        ({"count": 1, "cluster": {"size": 2048}}, []),
        ({"name": "a" * 63, "count": 10},
         [("count", f"10 sessions are named {'a' * 63}-1 .. {'a' * 63}-10, longer than the 64 "
           "characters a session name may have: shorten the name or lower the count")]),
        ({"name": "a" * 62, "count": 9}, []),
        ({"name": "a" * 62, "count": 1}, []),
        ({"image": "a b"}, [("image", "must not contain whitespace")]),
        ({"image": "a\x1b"}, [("image", NO_CONTROLS)]),
        ({"pool": "a\x07"}, [("pool", NO_CONTROLS)]),
        ({"pool": "p" * 251},
         [("pool", "is too long for a pool name (a file name: at most 250 bytes)")]),
        ({"pool": "p" * 250}, []),
        ({"pool": "/" + "p" * 300}, []),
        ({"mounts": [{"source": "/a\n", "target": "/data/x\x02"}]},
         [("mounts.0.source", NO_CONTROLS), ("mounts.0.target", NO_CONTROLS)]),
        ({"mounts": [{"folder": "b\x00", "storage": "c\x01", "target": "/data/x"}]},
         [("mounts.0.folder", NO_CONTROLS), ("mounts.0.storage", NO_CONTROLS),
          ("mounts.0.folder", "'b\\x00' " + FOLDER_RULE),
          ("mounts.0.storage", "'c\\x01' is not a storage name")]),
        ({"command": ["a\x1b", "b\n\tc", "d\re"]},
         [("command.0", "must not contain control characters other than newline and tab"),
          ("command.2", "must not contain control characters other than newline and tab")]),
        ({"command": ["x" * MAX_ARG]},
         [("command.0", "is too long: the kernel passes at most 131071 bytes per argument "
           "(MAX_ARG_STRLEN)")]),
        ({"command": ["x" * (MAX_ARG - 1)]}, []),
        ({"resources": {"mem": "1g", "shmem": "1g"}},
         [("resources.shmem", "must be smaller than resources.mem (1g >= 1g)")]),
        ({"resources": {"mem": "1g", "shmem": "1023m"}}, []),
        ({"env": {"1A": "x", "BACKENDAI_X": "y", "SSH_TTY": "z", "A": "a\0b"}},
         [("env.1A", "is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)"),
          ("env.BACKENDAI_X", "BACKENDAI_* variables are set by the session and cannot be "
           "overridden (use distributed.master_port for the port)"),
          ("env.SSH_TTY", "SSH_* variables are set by sshd for each ssh session (and read by "
           "ssh, ssh-agent and the session's ssh wrapper): a definition cannot set them"),
          ("env.A", "must not contain a NUL byte")]),
        ({"env": {"A": "x" * (MAX_ARG - 2)}},
         [("env.A", "is too long: NAME=value is 131072 bytes, and the kernel passes at most "
           "131071 (MAX_ARG_STRLEN, 128 KiB with the terminating NUL): put large data in a "
           "mounted file")]),
        ({"env": {"A": "x" * (MAX_ARG - 3)}}, []),
        ({"cluster": {"size": 2}, "distributed": {"master_port": 2200}},
         [("distributed.master_port", "2200 is sshd's port; choose a port above 2200 (e.g. "
           "29500)")]),
        ({"cluster": {"size": 4}, "distributed": {"master_port": 2197}},
         [("distributed.master_port", "2197 gives TF_CONFIG ports 2197-2200 for 4 containers, "
           "which include sshd's port 2200; choose a port above 2200 (e.g. 29500)")]),
        ({"cluster": {"size": 4}, "distributed": {"master_port": 2196}}, []),
        ({"cluster": {"size": 4}, "distributed": {"master_port": 32767}}, []),
        ({"cluster": {"size": 3}, "env": {"MASTER_PORT": "65534"}},
         [("env.MASTER_PORT", "65534 gives TF_CONFIG ports up to 65536 for 3 containers, "
           "beyond 65535")]),
        ({"cluster": {"size": 2}, "env": {"MASTER_PORT": "65534"}}, []),
        ({"cluster": {"size": 2}, "env": {"MASTER_PORT": "2200"},
          "distributed": {"master_port": 2199}},
         [("env.MASTER_PORT", "2200 is sshd's port; choose a port above 2200 (e.g. 29500)"),
          ("distributed.master_port", "2199 gives TF_CONFIG ports 2199-2200 for 2 containers, "
           "which include sshd's port 2200; choose a port above 2200 (e.g. 29500)")]),
        ({"cluster": {"size": 1}, "distributed": {"master_port": 2200}}, []),
        ({"count": 2, "ports": [{"container": 80, "host": 8080}, {"container": 81}]},
         [("ports.0.host", "host port 8080 is fixed, but count makes 2 sessions that may share "
           "an agent and cannot all publish it: leave host unset (the engine picks a free "
           "port)")]),
        ({"count": 1, "ports": [{"container": 80, "host": 8080}]}, []),
        ({"type": "batch"},
         [("command", "a batch session needs a command: main1 runs it as the job (e.g. "
           "command: [python3, train.py])")]),
        ({"type": "batch", "command": ["sleep", "infinity"]}, []),
        ({"resources": {"cpu": 707.001}},
         [("resources.cpu", "707.001 CPUs: the docker provider reads this back as 707.0, so "
           "every up would replace the containers; use a value it reads back as written, "
           "such as 707")]),
        ({"resources": {"gpu": 2}, "distributed": {"slots": 3}},
         [("distributed.slots", "3 slots per container, but each container has 2 GPUs "
           "(resources.gpu): at most 2, one process per GPU")]),
        ({"resources": {"gpu": 2}, "distributed": {"slots": 2}}, []),
        ({"resources": {"gpu": 0}, "distributed": {"slots": 3}}, []),
        ({"user": {"name": "root"}},
         [("user.name", "must be a lower-case user name other than root")]),
        ({"user": {"name": "Alice"}},
         [("user.name", "must be a lower-case user name other than root")]),
        ({"user": {"name": "daemon"}},
         [("user.name", "'daemon' is an account or group a base image already has: the set-up "
           "would take it over (its id, its home, its group); choose another name (default: "
           "work)")]),
        ({"ports": [{"container": 80}, {"container": 80},
                    {"container": 80, "protocol": "udp", "host": 1, "host_ip": "::1"},
                    {"container": 81, "host": 1, "host_ip": "::1", "protocol": "udp"},
                    {"container": 82, "host": 1, "host_ip": "::1"},
                    {"container": 83, "host": 1, "host_ip": "127.0.0.1", "protocol": "udp"},
                    {"container": 84, "host_ip": "fe80::1%eth0"},
                    {"container": 85, "host_ip": "x"}]},
         [("ports.1.container", "80/tcp is published twice"),
          ("ports.3.host", "host port 1/udp on ::1 is used twice"),
          ("ports.6.host_ip", "'fe80::1%eth0' is not an IP address"),
          ("ports.7.host_ip", "'x' is not an IP address")]),
    ],
)
def test_session_rules_word_for_word(fields, found):
    assert problems(**fields) == found


def test_env_bounds_in_all_word_for_word():
    def env(entries: int, size: int) -> dict[str, str]:
        """``entries`` variables of ``size`` bytes each as the bound counts them."""
        return {f"V{i:04}": "x" * (size - 6 - 1 - 8) for i in range(entries)}

    assert problems(env=env(1024, 256)) == []
    assert problems(env=env(1025, 16)) == [
        ("env", "has 1025 variables, more than 1024: put large configuration in a mounted file")]
    assert problems(env=env(1024, 256) | {"A": "x" * 1}) == [
        ("env", "has 1025 variables, more than 1024: put large configuration in a mounted "
         "file"),
        ("env", "is 262156 bytes in all (NAME=value, NUL and pointer each), more than 262144 "
         "(256 KiB): the kernel passes at most 2 MiB of arguments and environment to a program "
         "(ARG_MAX), which the session's own variables share; put large data in a mounted "
         "file")]
    assert problems(env=env(64, 4096), cluster={"size": 64}) == []
    assert problems(env=env(64, 4096), cluster={"size": 65}) == [
        ("env", "is 262144 bytes in all, repeated in each of the 65 containers this definition "
         "plans: 17039360 bytes, more than 16777216 (16 MiB) that plan and render may repeat "
         "(at most 258111 bytes per container at this size); put large data in a mounted "
         "file")]
    assert problems(env=env(16, 512) | {"A": ""}, count=2, cluster={"size": 1024}) == [
        ("env", "is 8203 bytes in all, repeated in each of the 2048 containers this definition "
         "plans: 16799744 bytes, more than 16777216 (16 MiB) that plan and render may repeat "
         "(at most 8192 bytes per container at this size); put large data in a mounted file")]


def test_the_command_in_all_word_for_word():
    args = ["x" * (4096 - 9)] * 64  # 4096 bytes each as the bound counts them
    assert problems(command=args) == []
    assert problems(command=[*args, "x"]) == [
        ("command", "is 262154 bytes in all (each argument, its NUL and pointer), more than "
         "262144: the kernel passes at most 2 MiB of arguments and environment to a program "
         "(ARG_MAX); put a long script in a mounted file")]


def test_service_rules_word_for_word():
    assert problems(cluster={"size": 3}, ports=[{"container": 8080},
                                                {"container": 9000, "protocol": "udp"}],
                    services=[{"name": "Web", "port": 80}, {"name": "a", "port": 2200},
                              {"name": "a", "port": 8080}, {"name": "b", "port": 29501},
                              {"name": "c", "port": 81}, {"name": "d", "port": 81},
                              {"name": "e", "port": 29503}, {"name": "f", "port": 29499},
                              {"name": "g", "port": 9000}, {"name": "h-", "port": 9001},
                              {"name": "a" * 32, "port": 9002},
                              {"name": "a" * 33, "port": 9003}]) == [
        ("services.0.name", "'Web' must be 1-32 lower-case letters, digits or '-', starting with "
         "a letter and not ending with '-'"),
        ("services.1.port", "2200 is sshd's port in every container (`sessionctl ssh` reaches "
         "it); serve the app on another port"),
        ("services.2.name", "duplicate service name 'a' (also services.1)"),
        ("services.2.port", "container port 8080 is already published by ports.0"),
        ("services.3.port", "29501 is one of the ports the distributed variables use "
         "(29500-29502, from distributed.master_port): serve the app on another port"),
        ("services.5.port", "container port 81 is already published by services.4"),
        ("services.9.name", "'h-' must be 1-32 lower-case letters, digits or '-', starting with "
         "a letter and not ending with '-'"),
        ("services.11.name", f"'{'a' * 33}' must be 1-32 lower-case letters, digits or '-', "
         "starting with a letter and not ending with '-'")]
    assert problems(cluster={"size": 3}, env={"MASTER_PORT": "4000"},
                    distributed={"master_port": 5000},
                    services=[{"name": "a", "port": 4002}, {"name": "b", "port": 5000},
                              {"name": "c", "port": 4003}, {"name": "d", "port": 29500}]) == [
        ("services.0.port", "4002 is one of the ports the distributed variables use (4000-4002, "
         "from env.MASTER_PORT): serve the app on another port"),
        ("services.1.port", "5000 is one of the ports the distributed variables use (5000-5002, "
         "from distributed.master_port): serve the app on another port")]
    assert problems(cluster={"size": 3}, env={"MASTER_PORT": "5000"},
                    distributed={"master_port": 5001},
                    services=[{"name": "a", "port": 5002}]) == [  # named once, by the first
        ("services.0.port", "5002 is one of the ports the distributed variables use (5000-5002, "
         "from env.MASTER_PORT): serve the app on another port")]
    # a user's MASTER_PORT that is no port: no base at all (cluster-env.sh keeps the value)
    assert problems(cluster={"size": 2}, env={"MASTER_PORT": "70000"},
                    services=[{"name": "a", "port": 29500}]) == []
    assert problems(cluster={"size": 2}, env={"MASTER_PORT": "65536"},
                    services=[{"name": "a", "port": 29500}]) == []
    assert problems(cluster={"size": 2}, env={"MASTER_PORT": "65535"},
                    services=[{"name": "a", "port": 65535}]) == [
        ("env.MASTER_PORT", "65535 gives TF_CONFIG ports up to 65536 for 2 containers, beyond "
         "65535"),
        ("services.0.port", "65535 is one of the ports the distributed variables use "
         "(65535-65536, from env.MASTER_PORT): serve the app on another port")]
    assert problems(cluster={"size": 2}, env={"MASTER_PORT": "0x10"},
                    services=[{"name": "a", "port": 29500}]) == []
    assert problems(cluster={"size": 1}, services=[{"name": "a", "port": 29500}]) == []
    assert problems(cluster={"size": 2}, services=[{"name": "a", "port": 29500}]) == [
        ("services.0.port", "29500 is one of the ports the distributed variables use "
         "(29500-29501, from distributed.master_port): serve the app on another port")]


def test_mount_rules_word_for_word():
    assert problems(user={"name": "alice"}, mounts=[
        {"source": "/a", "target": "rel"}, {"source": "/a", "target": "/data/../x"},
        {"source": "/a", "target": "/etc"}, {"source": "/a", "target": "/data/a:b"},
        {"source": "/a", "target": "/data/x"}, {"source": "/b", "target": "/data/x/"},
        {"source": "/a,b", "target": "/home/alice/x"},
        {"source": "/a", "target": "/home/alice/x,y"},
        {"source": "/a", "target": "/home/alice"},
        {"source": "/a", "target": "/home/alice/.ssh/x"}]) == [
        ("mounts.0.target", "must be an absolute path in the container"),
        ("mounts.1.target", "must not contain '..': name the directory itself"),
        ("mounts.2.target", "/etc " + NOT_DATA.format(u="alice")),
        ("mounts.3.target", "must not contain ':'"),
        ("mounts.5.target", "/data/x/ is mounted twice"),
        ("mounts.6", "paths must not contain ','"),
        ("mounts.7", "paths must not contain ','"),
        ("mounts.8.target", "/home/alice " + NOT_DATA.format(u="alice")),
        ("mounts.9.target", "/home/alice/.ssh/x " + NOT_DATA.format(u="alice"))]
    assert problems(mounts=[
        {"folder": "f", "source": "/a", "target": "/data/1"},
        {"folder": "..", "storage": "-x", "target": "/data/2"},
        {"storage": "s", "source": "/a", "target": "/data/3"}, {"target": "/data/4"},
        {"source": "rel/x", "target": "/data/5"}, {"source": "/a/../b", "target": "/data/6"},
        {"source": "vol", "target": "/data/7"}, {"folder": "f", "storage": "s",
                                                  "target": "/data/8"}]) == [
        ("mounts.0", "has both source and folder: a mount is a host path or volume (source) "
         "or a data folder (folder), not both"),
        ("mounts.1.folder", "'..' " + FOLDER_RULE),
        ("mounts.1.storage", "'-x' is not a storage name"),
        ("mounts.2.storage", "applies only to a folder mount ({folder: NAME, storage: ROOT, "
         "target: ...})"),
        ("mounts.3", "needs a source (a host path or volume name) or a folder (a data folder "
         "of the pool's storage)"),
        ("mounts.4.source", "must be an absolute host path or a volume name"),
        ("mounts.5.source", "must not contain '..': name the directory itself")]


def test_mount_lengths_word_for_word():
    assert problems(mounts=[{"source": "/" + "a" * 4094, "target": "/data/" + "b" * 4089}]) == []
    assert problems(mounts=[{"source": "/" + "a" * 4095, "target": "/data/" + "b" * 4090}]) == [
        ("mounts.0.source", "is longer than the 4095 bytes a path may have (PATH_MAX)"),
        ("mounts.0.target", "is longer than the 4095 bytes a path may have (PATH_MAX)")]
    four = [{"source": "/" + "a" * 2047, "target": f"/data/{i}" + "b" * 2041} for i in range(4)]
    assert problems(mounts=four) == []  # 4 x 4096 bytes
    folder = {"folder": "f" * 64, "storage": "s", "target": "/data/" + "t" * 4026}
    assert problems(mounts=[*four[:3], folder]) == []  # a folder's name counts as its source
    assert problems(mounts=[*four[:3], {**folder, "target": folder["target"] + "t"}]) == [
        ("mounts", "sources and targets are 16385 bytes in all, more than 16384 (16 KiB): every "
         "container's plan repeats them")]
    assert problems(mounts=[{**m, "target": m["target"] + "b"} for m in four]) == [
        ("mounts", "sources and targets are 16388 bytes in all, more than 16384 (16 KiB): every "
         "container's plan repeats them")]


@pytest.mark.parametrize(
    ("host", "problem"),
    [
        ("unix:///s\x1b", NO_CONTROLS),
        ("http://x", "must be unix:///PATH, ssh://[USER@]HOST[:PORT] or tcp://HOST:PORT "
         "(with tls)"),
        ("ssh://", "must be unix:///PATH, ssh://[USER@]HOST[:PORT] or tcp://HOST:PORT "
         "(with tls)"),
        ("unix://rel", "must be unix:///ABSOLUTE/PATH"),
        ("unix:///ok", None),
        ("unix://host/s", "must be unix:///ABSOLUTE/PATH"),
        ("tcp://u@h:1", "tcp:// takes no user"),
        ("ssh://u:p@h", "must not hold a password (USER:PASSWORD@): docker and ssh refuse it, "
         "and a pool file is no place for one; use a key"),
        ("ssh://-u@h", "user '-u' " + OPTION),
        ("ssh://u%20x@h", "user must not contain whitespace or control characters"),
        ("ssh://u%07@h", "user must not contain whitespace or control characters"),
        ("ssh://h:0", "has port 0, which no engine listens on"),
        ("ssh://h:99999", "has a port that is not a number from 1 to 65535"),
        ("ssh://::1", "has a port that is not a number from 1 to 65535"),
        ("tcp://h", "tcp:// needs a port (Docker's TLS port is 2376)"),
        ("ssh://@h", None),
        ("ssh://u@:22", "names no host"),
        ("ssh://-h", "'-h' " + OPTION),
        ("ssh://u@-h:22", "'-h' " + OPTION),
        ("ssh://-a:b:22", "has a port that is not a number from 1 to 65535"),
        ("ssh://%2Dh", "'-h' " + OPTION),
        ("ssh://h%2F", "'h/' " + NOT_HOST),
        ("ssh://h/path", "must be ssh://[USER@]HOST[:PORT] with no path"),
        ("ssh://[::1]:22", None),
        # Python's URL parser refuses these (it used to be an internal error of validate)
        ("ssh://[-x]:22", "must hold an IP address between '[' and ']' (e.g. ssh://[::1]:22)"),
        ("ssh://[::1:22", "must hold an IP address between '[' and ']' (e.g. ssh://[::1]:22)"),
        ("ssh://u@h:22", None),
        ("ssh://h", None),
        ("ssh://h/", None),
    ],
)
def test_docker_host_refusals_word_for_word(host, problem):
    tls = {"tls": {"cert_path": "/c"}} if host.startswith("tcp://") else {}
    found = pool_problems(pool(agent(docker_host=host, **tls)))
    assert found == ([("agents.0.docker_host", problem)] if problem else [])


def test_pool_rules_word_for_word():
    assert pool_problems(pool(agent("-a"), agent("a1"), agent("a1"), agent("x" * 64),
                              agent("x" * 63))) == [
        ("agents.0.name", "must be letters, digits, '_', '.' or '-' (at most 63), starting "
         "with a letter or digit"),
        ("agents.2.name", "duplicate agent name 'a1' (also agents.1)"),
        ("agents.3.name", "must be letters, digits, '_', '.' or '-' (at most 63), starting "
         "with a letter or digit")]
    assert pool_problems(pool(agent(capacity={"cpu": 1, "mem": "1g",
                                              "gpus": [0, 1, 0, 1, 2]}))) == [
        ("agents.0.capacity.gpus", "GPU id 0 is listed twice"),
        ("agents.0.capacity.gpus", "GPU id 1 is listed twice")]
    assert pool_problems(pool(agent(tls={"cert_path": "/c\n"}))) == [
        ("agents.0.tls", "applies only to a tcp:// docker_host"),
        ("agents.0.tls.cert_path", NO_CONTROLS)]
    assert pool_problems(pool(
        agent(service_ports={"first": 2000, "last": 1999}),
        agent("b", service_ports={"first": 2000, "last": 2000}),
        service_ports={"first": 30001, "last": 30000})) == [
        ("service_ports.first", "30001 is above last (30000): the range is first..last, "
         "inclusive"),
        ("agents.0.service_ports.first", "2000 is above last (1999): the range is first..last, "
         "inclusive")]
    assert pool_problems(pool(name="la\x1bb")) == [("name", NO_CONTROLS)]
    assert pool_problems(pool(mount_sources=["rel", "/a/../b", "/a\n", "/a,b", "/a:b",
                                             "/ok"])) == [
        ("mount_sources.0", "must be an absolute host directory without '..'"),
        ("mount_sources.1", "must be an absolute host directory without '..'"),
        ("mount_sources.2", "must not contain control characters, ',' or ':'"),
        ("mount_sources.3", "must not contain control characters, ',' or ':'"),
        ("mount_sources.4", "must not contain control characters, ',' or ':'")]
    assert pool_problems(pool(agent(), agent("b"), swarm={"manager": "c"})) == [
        ("swarm.manager", "'c' is not one of the pool's agents (a1, b)")]
    assert pool_problems(pool(agent(), agent("b"), swarm={"manager": "b"})) == []


def test_storage_rules_word_for_word():
    bad = "must be an absolute host directory other than '/', without '..'"
    assert pool_problems(pool(storage={
        "-x": "/nfs/y", "s1": "rel", "s2": "/", "s3": "/a/..", "s4": "/a\n", "s5": "/a,b",
        "s5b": "/a:b", "s6": "/" + "x" * 4030, "s7": "/nfs", "s8": "/nfs/sub", "s9": "/other",
        "s10": "//nfs/", "s11": "/nfsx", "s12": "///"})) == [
        ("storage", "'-x' is not a storage name: letters, digits, '_', '.' or '-', starting "
         "with a letter or digit"),
        ("storage.s1", bad), ("storage.s2", bad), ("storage.s3", bad),
        ("storage.s4", "must not contain control characters, ',' or ':'"),
        ("storage.s5", "must not contain control characters, ',' or ':'"),
        ("storage.s5b", "must not contain control characters, ',' or ':'"),
        ("storage.s6", "is too long: its folders' paths pass 4095 bytes"),
        ("storage.s8", "/nfs/sub overlaps storage 's7' (/nfs): roots must be separate "
         "directories"),
        ("storage.s10", "/nfs overlaps storage 's7' (/nfs): roots must be separate "
         "directories"),
        ("storage.s10", "/nfs overlaps storage 's8' (/nfs/sub): roots must be separate "
         "directories"),
        ("storage.s12", bad)]
    assert pool_problems(pool(storage={"s6": "/" + "x" * 4029})) == []


def test_how_an_agent_is_reached_word_for_word():
    assert pool_problems(pool(
        agent(docker_host="ssh://h", ssh={"host": "h"}),
        agent("b", docker_host="tcp://h:2376"),
        agent("c", ssh={"host": "-h", "user": "-u", "key_file": "/k\n", "known_hosts": "/a b"}),
        agent("d", ssh={"host": "h!", "user": "a b", "key_file": "/k%", "known_hosts": "/k'"}),
        agent("e", address="-x"), agent("f", address="h h"),
        agent("g", ssh={"host": "h", "user": "u\x01", "known_hosts": "/k\x1b"}),
        agent("h", ssh={"host": "h", "user": "u", "key_file": "/k", "known_hosts": "/n"},
              address="10.0.0.1"))) == [
        ("agents.0.docker_host", "with an ssh block, docker_host names the engine's socket on "
         "the agent: unix:///PATH (default unix:///var/run/docker.sock); the ssh block says "
         "how the agent is reached"),
        ("agents.1.docker_host", "tcp:// without TLS gives anyone who reaches the port root on "
         "the agent: add tls: {cert_path: DIR} (ca.pem, cert.pem, key.pem), or reach the agent "
         "over ssh"),
        ("agents.2.ssh.host", "'-h' " + OPTION), ("agents.2.ssh.user", "'-u' " + OPTION),
        ("agents.2.ssh.key_file", NO_CONTROLS), ("agents.2.ssh.known_hosts", SPLIT),
        ("agents.3.ssh.host", "'h!' " + NOT_HOST),
        ("agents.3.ssh.user", "must not contain whitespace or control characters"),
        ("agents.3.ssh.key_file", SPLIT), ("agents.3.ssh.known_hosts", SPLIT),
        ("agents.4.address", "'-x' " + OPTION), ("agents.5.address", "'h h' " + NOT_HOST),
        ("agents.6.ssh.user", "must not contain whitespace or control characters"),
        ("agents.6.ssh.known_hosts", NO_CONTROLS)]


def test_host_paths_outside_the_pools_mount_sources_word_for_word():
    mounts = [{"source": "/srv/data/x", "target": "/data/1"}, {"source": "/srv", "target":
                                                               "/data/2"},
              {"source": "/srv/database", "target": "/data/3"},
              {"source": "vol", "target": "/data/4"}, {"source": "/a/../b", "target": "/data/5"},
              {"folder": "f", "target": "/data/6"}, {"folder": "f", "target": "/data/7"},
              {"folder": "f", "storage": "other", "target": "/data/8"},
              {"folder": "f", "storage": "nope", "target": "/data/9"}]
    assert mount_source_problems(session(mounts=mounts), pool(
        mount_sources=["/srv/data/", "/opt"],
        storage={"main": "/nfs", "other": "/nfs2"})) == [
        ("mounts.1.source", "/srv: pool 'lab' lets sessions mount host paths only at or below "
         "/srv/data/, /opt (its mount_sources): use a path there or a named volume, or ask the "
         "pool's operator to add the directory to mount_sources"),
        ("mounts.2.source", "/srv/database: pool 'lab' lets sessions mount host paths only at "
         "or below /srv/data/, /opt (its mount_sources): use a path there or a named volume, or "
         "ask the pool's operator to add the directory to mount_sources"),
        ("mounts.5.folder", "the pool has several storage roots (main, other): say which with "
         "storage: NAME"),
        ("mounts.6.folder", "the pool has several storage roots (main, other): say which with "
         "storage: NAME"),
        ("mounts.8.storage", "the pool has no storage 'nope' (it has: main, other)")]
    mounts = [{"folder": "f", "target": "/data/1"}, {"folder": "g", "target": "/data/2"},
              {"folder": "f", "storage": "main", "target": "/data/3"},
              {"folder": "f", "storage": "other", "target": "/data/4"}]
    assert mount_source_problems(session(mounts=mounts), pool(storage={"main": "/nfs"})) == [
        ("mounts.2.folder", "folder 'f' of storage 'main' is mounted twice (also mounts.0)"),
        ("mounts.3.storage", "the pool has no storage 'other' (it has: main)")]


def test_a_pool_without_mount_sources_word_for_word():
    assert mount_source_problems(session(mounts=[{"source": "/x", "target": "/data/x"}]),
                                 pool()) == [
        ("mounts.0.source", "/x: pool 'lab' lets sessions mount no host path (it has no "
         "mount_sources): use a named volume, or ask the pool's operator to add the directory "
         "to mount_sources")]


def test_small_functions_of_spec():
    assert slots_per_container(session()) == 1
    assert slots_per_container(session(resources={"gpu": 4})) == 4
    assert slots_per_container(session(resources={"gpu": 4}, distributed={})) == 4
    assert slots_per_container(session(resources={"gpu": 4},
                                       distributed={"slots": 2})) == 2
    assert [clean_target(p) for p in ("//data/", "/data/./x/../y", "rel/../x", "/", "///")] == [
        "/data", "/data/y", "rel/../x", "/", "/"]
    assert [mount_target_allowed(t, "/home/u") for t in (
        "/data", "/data/x", "/database", "/mnt", "/scratch/a", "/workspace", "/home/u",
        "/home/u/x", "/home/u/.ssh", "/home/u/.sshx", "/home/u/.ssh/k", "/home/uv/x", "/")] == [
        True, True, False, True, True, True, False, True, False, True, False, False, False]
    ports = PortRange(first=30000, last=30002)
    assert [p in ports for p in (29999, 30000, 30002, 30003, "30000", None)] == [
        False, True, True, False, False, False]
    assert session(resources={"cpu": 0.25}).resources.millicpu == 250
    assert session(resources={"cpu": 0.0015}).resources.millicpu == 2
    assert pool(agent(capacity={"cpu": 2.5, "mem": "1g"})).agents[0].capacity.millicpu == 2500
    two = pool(agent(), agent("b", service_ports={"first": 2000, "last": 2001}))
    assert two.service_ports_of("a1") == PortRange(first=30000, last=31000)
    assert two.service_ports_of("b") == PortRange(first=2000, last=2001)
    assert two.agent("b").name == "b"


@pytest.mark.parametrize(
    ("fields", "address"),
    [
        ({"address": "10.0.0.1", "ssh": {"host": "h"}}, "10.0.0.1"),
        ({"ssh": {"host": "h"}}, "h"),
        ({"docker_host": "ssh://u@h2:22"}, "h2"),
        ({"docker_host": "tcp://h3:2376"}, "h3"),
        ({"docker_host": "unix:///var/run/docker.sock"}, None),
        ({"docker_host": "ssh://"}, None),
        ({"docker_host": "unix://host/s"}, None),
    ],
)
def test_where_an_agent_is_reached(fields, address):
    assert agent_address(Agent.model_validate(agent(**fields))) == address


def test_every_integer_of_the_schema_is_held_to_int64_and_arrays_count_items():
    schema = json_schema(Session)
    assert "name" not in schema["required"]
    assert schema["required"] == ["kind", "pool", "image"]
    props = schema["$defs"]
    assert props["ClusterShape"]["properties"]["size"] == {
        "default": 1, "maximum": 2048, "minimum": 1, "title": "Size", "type": "integer"}
    assert schema["properties"]["command"] == {
        "default": ["sleep", "infinity"], "items": {"minLength": 1, "type": "string"},
        "title": "Command", "type": "array", "minItems": 1}
    assert schema["properties"]["mounts"] == {
        "default": [], "items": {"$ref": "#/$defs/Mount"}, "title": "Mounts", "type": "array",
        "maxItems": 64}
    assert props["User"]["properties"]["uid"] == {
        "anyOf": [{"maximum": 59999, "minimum": 1000},
                  {"maximum": 2147483646, "minimum": 65536}],
        "default": 9001, "title": "Uid", "type": "integer",
        "minimum": -(2**63 - 1), "maximum": 2**63 - 1}
    pool_schema = json_schema(Pool)
    assert pool_schema["required"] == ["kind", "name", "agents"]
    assert pool_schema["properties"]["agents"] == {
        "items": {"$ref": "#/$defs/Agent"}, "title": "Agents", "type": "array",
        "minItems": 1, "maxItems": 10000}
    gpus = pool_schema["$defs"]["Capacity"]["properties"]["gpus"]
    assert gpus["items"] == {"minimum": 0, "maximum": 2**63 - 1, "type": "integer"}


# --- what a session may take and do on an agent (issue 32, classes 6 and 7) ---------------------


def test_a_pool_bounds_every_session_s_logs_and_keeps_only_the_set_up_s_capabilities_by_default():
    p = pool(agent())
    assert (p.limits.log_max_size, p.limits.log_max_files) == (16 * 1024**2, 4)
    assert p.limits.pids_limit == 8192
    assert p.privileges.capabilities == ("AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER",
                                         "KILL", "SETGID", "SETUID", "SYS_CHROOT")
    assert p.privileges.no_new_privileges is True


def test_a_pool_widens_capabilities_and_log_bounds_with_its_own_fields():
    p = pool(agent(), limits={"log_max_size": "100m", "log_max_files": 10, "pids_limit": 64},
             privileges={"capabilities": ["SETUID", "SETGID", "AUDIT_WRITE"],
                         "no_new_privileges": False})
    assert (p.limits.log_max_size, p.limits.log_max_files) == (100 * 1024**2, 10)
    assert p.limits.pids_limit == 64
    assert p.privileges.capabilities == ("SETUID", "SETGID", "AUDIT_WRITE")
    assert pool_problems(p) == []


def test_privilege_rules_word_for_word():
    found = pool_problems(pool(agent(), privileges={"capabilities": [
        "cap_sys_admin", "SETUID", "SETUID", "FLY", "\x1b[2J"]}))
    assert [path for path, _ in found] == [f"privileges.capabilities.{i}" for i in (0, 2, 3, 4)]
    assert found[0][1] == "'cap_sys_admin' is not a Linux capability (write SYS_ADMIN)"
    assert found[1][1] == "SETUID is listed twice"
    assert found[2][1].startswith("'FLY' is not a Linux capability; one of AUDIT_CONTROL, ")
    assert found[3][1].startswith("'\\x1b[2J' is not a Linux capability")  # escaped


@pytest.mark.parametrize(("fields", "where"), [
    ({"limits": {"log_max_size": "100k"}}, "limits.log_max_size"),
    ({"limits": {"log_max_size": "2g"}}, "limits.log_max_size"),
    ({"limits": {"log_max_files": 0}}, "limits.log_max_files"),
    ({"limits": {"log_max_files": "3"}}, "limits.log_max_files"),
    ({"limits": {"pids": 5}}, "limits.pids"),
    ({"limits": {"pids_limit": 63}}, "limits.pids_limit"),  # the set-up, sshd, a login
    ({"limits": {"pids_limit": 4_194_305}}, "limits.pids_limit"),
    ({"limits": {"pids_limit": "8192"}}, "limits.pids_limit"),
    ({"limits": {"pids_limit": True}}, "limits.pids_limit"),
    ({"limits": {"pids_limit": 100.0}}, "limits.pids_limit"),
    ({"limits": {"pids_limit": -1}}, "limits.pids_limit"),  # Docker's "unlimited"
    ({"privileges": {"no_new_privileges": "no"}}, "privileges.no_new_privileges"),
    ({"privileges": {"capabilities": "ALL"}}, "privileges.capabilities"),
])
def test_bad_limits_and_privileges_are_refused(fields, where):
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as caught:
        pool(agent(), **fields)
    assert where in {".".join(map(str, e["loc"])) for e in caught.value.errors()}
