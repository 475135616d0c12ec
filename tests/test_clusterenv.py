"""Which of a definition's variables may be in the container's env (clusterenv.read_at_startup)."""

import pytest

from cluster_sessions.core.clusterenv import read_at_startup, split_user_env


@pytest.mark.parametrize("name, value", [
    ("LD_PRELOAD", "/x.so"), ("LD_AUDIT", "/x.so"), ("BASH_ENV", "x"), ("BASH_COMPAT", "31"),
    ("BASH_LOADABLES_PATH", "/x"), ("BASH_XTRACEFD", "2"), ("BASHOPTS", "extdebug"),
    ("SHELLOPTS", "xtrace"), ("EXECIGNORE", "*"), ("MUSL_LOCPATH", "/x"),
    ("POSIXLY_CORRECT", "1"), ("GCONV_PATH", "/x"), ("IFS", "x"), ("PS4", "$(x)"),
    # a locale name with a '/' is a path the C library loads locale data from
    ("LANG", "/opt/mine/locale"), ("LC_ALL", "../x"), ("LANGUAGE", "a/b"), ("LC_CTYPE", "/x"),
])
def test_variables_a_program_reads_at_start_up_are_kept_out(name, value):
    assert read_at_startup(name, value)
    ordinary, at_exec = split_user_env({name: value, "KEEP": value})
    assert ordinary == {"KEEP": value}
    assert at_exec == {name: value}


@pytest.mark.parametrize("name, value", [
    ("LANG", "C.UTF-8"), ("LC_ALL", "en_US.UTF-8"), ("LANGUAGE", "de:en"), ("PATH", "/opt/x:/bin"),
    ("BASH", "not bash's own prefix"), ("HOME_LD_PATH", "/x"), ("PYTHONPATH", "/x"),
])
def test_ordinary_variables_stay_in_the_containers_env(name, value):
    assert not read_at_startup(name, value)
    assert split_user_env({name: value}) == ({name: value}, {})
