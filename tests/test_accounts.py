"""Which ids and names the session user may take (core/accounts.py), and what a refusal says."""

from __future__ import annotations

import pytest

from cluster_sessions.core.accounts import user_id_problem, user_name_problem


@pytest.mark.parametrize("uid", [1000, 59999, 65536, 2147483646])
def test_the_edges_of_the_user_ranges_are_user_ids(uid):
    assert user_id_problem(uid) is None


@pytest.mark.parametrize("uid", [0, 999, 60000, 65534, 65535, 2147483647])
def test_system_and_reserved_ids_are_refused_with_the_ranges_named(uid):
    assert user_id_problem(uid) == (
        "must be a user account's id, 1000-59999 or 65536-2147483646: 0-999 are system "
        "accounts, 60000-65535 are reserved (Debian policy), 65534 is nobody")


@pytest.mark.parametrize("name", ["root", "ubuntu", "sshd", "_apt", "systemd-foo", "postgres"])
def test_a_name_a_base_image_has_is_refused_and_the_default_named(name):
    assert user_name_problem(name) == (
        f"{name!r} is an account or group a base image already has: the set-up would take it "
        "over (its id, its home, its group); choose another name (default: work)")


@pytest.mark.parametrize("name", ["work", "alice", "ubuntu2"])
def test_other_names_may_be_taken(name):
    assert user_name_problem(name) is None
