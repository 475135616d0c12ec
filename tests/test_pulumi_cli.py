"""How the driver runs the CLI (driver/pulumi_cli.py): its output, line by line as it comes,
and a CLI that outlives a killed driver cancels as on Ctrl-C and finishes, instead of applying
on unsupervised or dying on a broken pipe (a ``pulumi`` of our own here: a script that says
what it was told)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cluster_sessions.driver.pulumi_cli import InterruptibleCommand


def fake_cli(root: Path, body: str) -> Path:
    """``root/bin/pulumi``: answers ``version``, else runs ``body`` (bash)."""
    cli = root / "bin" / "pulumi"
    cli.parent.mkdir(parents=True)
    cli.write_text("#!/bin/bash\n[ \"$2\" = version ] || [ \"$1\" = version ] && "
                   "{ echo v3.274.1; exit 0; }\n" + textwrap.dedent(body))
    cli.chmod(0o755)
    return cli


def test_each_line_reaches_the_callback_as_it_comes_and_the_result_has_them_all(tmp_path):
    fake_cli(tmp_path, """\
        echo one; echo "to stderr" >&2; printf 'two\\nthree'; sleep 0.3; echo ' and more'
        printf 'no newline at the end' >&2
        exit 3
    """)
    seen: list[tuple[float, str]] = []
    start = time.monotonic()
    command = InterruptibleCommand(root=str(tmp_path), skip_version_check=True)
    with pytest.raises(Exception) as raised:
        command.run(["up"], str(tmp_path), {},
                    on_output=lambda line: seen.append((time.monotonic() - start, line)))
    assert [line for _, line in seen] == ["one", "two", "three and more"]
    assert seen[0][0] < 0.25  # as it came, not when the CLI had ended
    assert "no newline at the end" in str(raised.value) and "to stderr" in str(raised.value)


def test_a_killed_driver_leaves_a_cli_that_cancels_and_writes_on_to_its_end(tmp_path):
    """SIGKILL to the driver's whole process group (a CI job killed): the CLI, in a group of
    its own, is sent SIGINT and still writes its output (no reader left) to its last line."""
    marks = tmp_path / "marks"
    fake_cli(tmp_path, f"""\
        trap 'echo interrupted >> {marks}' INT
        echo started >> {marks}
        for i in $(seq 40); do echo "applying $i"; sleep 0.05; done
        echo "finished" >> {marks}
    """)
    driver = subprocess.Popen(
        [sys.executable, "-c", "import sys; from cluster_sessions.driver.pulumi_cli import "
         "InterruptibleCommand as C; C(root=sys.argv[1], skip_version_check=True).run("
         "['up'], sys.argv[1], {}, on_output=print)", str(tmp_path)],
        stdout=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    while not marks.exists():
        assert time.monotonic() < deadline and driver.poll() is None
        time.sleep(0.02)
    os.killpg(driver.pid, signal.SIGKILL)
    assert driver.wait(10) == -signal.SIGKILL
    while "finished" not in marks.read_text():
        assert time.monotonic() < deadline, marks.read_text()
        time.sleep(0.05)
    assert marks.read_text().split() == ["started", "interrupted", "finished"]
