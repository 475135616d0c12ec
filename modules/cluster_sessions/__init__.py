"""Cluster sessions: Backend.AI-style cluster compute sessions on Docker hosts, with Pulumi."""

from .compat_pickle import install

install()
