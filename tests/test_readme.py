"""The README is the first thing a user runs: every repository path it names exists, and every
``sessionctl`` command line in its code blocks is one the real parser takes; the offline ones
(``validate``, ``plan``) are run and succeed."""

from __future__ import annotations

import re
import shlex

import pytest

from cluster_sessions.driver.cli import build_parser, main

from .conftest import PROJECT

README = (PROJECT / "README.md").read_text()
TOP = "(?:\\.ci|\\.venv|stacks|modules|templates|tests|docs|scripts|examples|benchmarks)"
PATH = re.compile(TOP + r"/[A-Za-z0-9_./<>*-]*[A-Za-z0-9_*>/]")
MADE_LATER = {
    ".venv/bin/python": "scripts/setup.sh makes the virtual environment",
    ".venv/bin/ruff": "scripts/setup.sh --dev installs it",
    "stacks/pools/lab.yaml": "sessionctl lab up writes it",
    "stacks/pools/gpus.yaml": "the reader's own pool of remote hosts, shown as an example",
}


def mentioned_paths() -> list[str]:
    return sorted(set(PATH.findall(README)))


def code_blocks() -> list[str]:
    return re.findall(r"```sh\n(.*?)```", README, re.S)


def sessionctl_lines() -> list[str]:
    """Each ``sessionctl ...`` in a shell code block, without its comment."""
    found = []
    for block in code_blocks():
        for line in block.splitlines():
            for part in line.split("&&"):
                lexer = shlex.shlex(part, posix=True, punctuation_chars=True)
                lexer.commenters = "#"
                lexer.whitespace_split = True
                words = []
                for word in lexer:  # the command ends at the shell's > | ; &
                    if word and set(word) <= set("<>|;&()"):
                        break
                    words.append(word)
                if words and words[0] == "sessionctl":
                    found.append(shlex.join(words))
    return found


@pytest.mark.parametrize("path", mentioned_paths())
def test_every_path_the_readme_names_exists(path):
    if path in MADE_LATER:
        return
    pattern = path.replace("<session>", "*")
    assert list(PROJECT.glob(pattern.rstrip("/"))), f"README names {path}, which is not there"


def test_the_readme_names_the_examples_it_runs():
    paths = mentioned_paths()
    for name in ("job", "sweep", "train-demo", "multi-demo"):
        assert f"stacks/sessions/{name}.yaml" in paths


@pytest.mark.parametrize("line", sessionctl_lines())
def test_every_sessionctl_line_in_the_readme_parses(line, capsys):
    argv = shlex.split(line)[1:]
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, --version: exit 0; a usage error: exit 2
        assert exc.code == 0, f"{line}: {capsys.readouterr().err}"


OFFLINE = [line for line in sessionctl_lines() if line.split()[1] in ("validate", "plan")]


@pytest.mark.parametrize("line", OFFLINE)
def test_the_readme_s_offline_commands_succeed(line, monkeypatch, capsys):
    monkeypatch.chdir(PROJECT)
    argv = []
    for word in shlex.split(line)[1:]:
        argv += sorted(map(str, PROJECT.glob(word))) if "*" in word else [word]
    assert main(argv) == 0, capsys.readouterr().err


def test_the_readme_shows_the_lab_story_with_verbs_that_exist():
    lines = sessionctl_lines()
    for verb in ("lab up --agents 3", "pool check lab", "pool up lab", "up "
                 "stacks/sessions/multi-demo.yaml --pool lab", "lab down"):
        assert any(line.startswith(f"sessionctl {verb}") for line in lines), verb


def test_the_readme_s_lint_command_is_the_one_ci_runs():
    ci = (PROJECT / ".ci" / "run").read_text()
    [lint] = [line.strip() for line in ci.splitlines() if "ruff" in line]
    assert f"`{lint}`" in README, lint


def test_the_plugin_version_the_readme_names_is_the_one_pinned():
    """The README's `pulumi plugin install resource docker X` must install the provider the
    pinned pulumi-docker SDK asks for, or the first `up` fetches another one anyway."""
    pinned = re.search(r"^pulumi-docker==(\S+)$",
                       (PROJECT / "requirements.txt").read_text(), re.M).group(1)
    named = re.findall(r"pulumi plugin install resource docker (\S+?)`", README)
    assert named == [pinned]
