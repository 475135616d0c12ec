"""The CI example stays runnable: its workflow parses, the sessionctl commands it runs exist
with the options it passes, and changed-sessions.sh picks the right files in a real git repo."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from cluster_sessions.driver.cli import build_parser

CI = Path(__file__).resolve().parent.parent / "examples" / "ci"
WORKFLOW = CI / "github-workflow.yml"
SCRIPT = CI / "changed-sessions.sh"


def run_scripts() -> str:
    doc = yaml.safe_load(WORKFLOW.read_text())
    return "\n".join(step.get("run", "") for job in doc["jobs"].values()
                     for step in job["steps"])


def test_workflow_has_the_three_jobs_and_the_secret_from_secrets():
    doc = yaml.safe_load(WORKFLOW.read_text())
    assert set(doc["jobs"]) == {"validate", "preview", "apply"}
    for job in ("preview", "apply"):
        env = doc["jobs"][job]["env"]
        assert env["PULUMI_CONFIG_PASSPHRASE"] == "${{ secrets.PULUMI_CONFIG_PASSPHRASE }}"
    assert "head.repo.full_name == github.repository" in doc["jobs"]["preview"]["if"]


def test_every_sessionctl_command_in_the_workflow_parses():
    parser = build_parser()
    commands = re.findall(r"sessionctl ([a-z]+ [^>|;\n]*)", run_scripts())
    assert {c.split()[0] for c in commands} >= {"validate", "diff", "preview", "up", "destroy"}
    for command in commands:
        argv = [w.strip('"') for w in command.split()]
        argv = [re.sub(r"\$\w+|\$\{?\w+\}?", "x", w) or "x" for w in argv]
        parser.parse_args(argv)  # exits (SystemExit) on an unknown verb or option


@pytest.fixture
def repo(tmp_path):
    if not shutil.which("git"):
        pytest.skip("git is not installed")

    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t",
                               "-c", "user.email=t@example.invalid", *args],
                              check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    for name, text in {"stacks/sessions/a.yaml": "a", "stacks/sessions/b.yaml": "b",
                       "stacks/pools/p.yaml": "p", "docs/x.md": "x"}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    git("add", ".")
    git("commit", "-qm", "base")
    return tmp_path, git


def changed(path: Path, base: str = "HEAD~1") -> list[str]:
    out = subprocess.run(["bash", str(SCRIPT), base, "HEAD"], cwd=path, check=True,
                         capture_output=True, text=True).stdout
    return out.split()


def test_changed_sessions_lists_edited_added_and_deleted_definitions(repo):
    path, git = repo
    (path / "stacks/sessions/a.yaml").write_text("a2")
    (path / "stacks/sessions/c.yml").write_text("c")
    git("rm", "-q", "stacks/sessions/b.yaml")
    git("add", ".")
    git("commit", "-qm", "change")
    assert changed(path) == ["stacks/sessions/a.yaml", "stacks/sessions/b.yaml",
                             "stacks/sessions/c.yml"]


def test_changed_sessions_is_empty_for_unrelated_changes(repo):
    path, git = repo
    (path / "docs/x.md").write_text("y")
    git("commit", "-qam", "docs")
    assert changed(path) == []


def test_a_pool_change_affects_every_session(repo):
    path, git = repo
    (path / "stacks/pools/p.yaml").write_text("p2")
    git("commit", "-qam", "pool")
    assert changed(path) == ["stacks/sessions/a.yaml", "stacks/sessions/b.yaml"]
