"""Which of a definition's variables a shell of ours may assign (clusterenv.read_at_startup):
the others go on the exec of the user's program only. None is ever in the container's env."""

import pytest

from cluster_sessions.core.clusterenv import read_at_startup, replicas, split_user_env


@pytest.mark.parametrize("name, value", [
    ("LD_PRELOAD", "/x.so"), ("LD_AUDIT", "/x.so"), ("BASH_ENV", "x"), ("BASH_COMPAT", "31"),
    ("BASH_LOADABLES_PATH", "/x"), ("BASH_XTRACEFD", "2"), ("BASHOPTS", "extdebug"),
    ("SHELLOPTS", "xtrace"), ("EXECIGNORE", "*"), ("MUSL_LOCPATH", "/x"),
    ("POSIXLY_CORRECT", "1"), ("GCONV_PATH", "/x"), ("IFS", "x"), ("PS4", "$(x)"),
    # read-only in bash: "export UID=..." would stop save-env.sh where /bin/sh is bash
    ("UID", "1000"), ("EUID", "0"), ("PPID", "1"),
    # a locale name with a '/' is a path the C library loads locale data from
    ("LANG", "/opt/mine/locale"), ("LC_ALL", "../x"), ("LANGUAGE", "a/b"), ("LC_CTYPE", "/x"),
])
def test_variables_a_program_reads_at_start_up_go_on_the_exec_only(name, value):
    assert read_at_startup(name, value)
    ordinary, at_exec = split_user_env({name: value, "KEEP": value})
    assert ordinary == {"KEEP": value}
    assert at_exec == {name: value}


@pytest.mark.parametrize("name, value", [
    ("LANG", "C.UTF-8"), ("LC_ALL", "en_US.UTF-8"), ("LANGUAGE", "de:en"), ("PATH", "/opt/x:/bin"),
    ("BASH", "not bash's own prefix"), ("HOME_LD_PATH", "/x"), ("PYTHONPATH", "/x"),
])
def test_ordinary_variables_are_assigned_by_the_users_shell(name, value):
    assert not read_at_startup(name, value)
    assert split_user_env({name: value}) == ({name: value}, {})


def test_replicas_counts_the_subs_from_a_size_of_two():
    """BACKENDAI_CLUSTER_REPLICAS: main1 alone for size 1, ``sub:N`` from the first sub on."""
    assert [replicas(n) for n in (1, 2, 3, 12)] == [
        "main:1", "main:1,sub:1", "main:1,sub:2", "main:1,sub:11"]
