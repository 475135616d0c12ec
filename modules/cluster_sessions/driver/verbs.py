"""Verbs that live outside ``cli.py``: each module adds its sub-parsers here.

Keeping the list in one place means ``sessionctl --help`` shows every verb, while each verb's
code stays next to the concept it drives.
"""

from __future__ import annotations

REGISTER: list = []
