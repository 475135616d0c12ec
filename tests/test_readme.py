"""The README is the first thing a user runs: every repository path it names exists, and every
``sessionctl`` command line in its code blocks is one the real parser takes, with arguments
that hold against the shipped files (the definition and pool it names load together, its
``--index`` is one the definition's ``count`` makes, its ``HOST`` and service exist); the
offline ones (``validate``, ``plan``, ``diff``, ``--version``) are run and succeed."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

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


# What a command line names that the checkout does not ship, and what stands in for it here.
STAND_INS = {
    "lab": "stacks/pools/lab3.yaml",  # `sessionctl lab up --agents 3` writes the pool `lab`
    "old.yaml": "stacks/sessions/train-demo.yaml",  # the reader's two versions of a definition
    "new.yaml": "stacks/sessions/train-demo.yaml",
    "base/old.yaml": "stacks/sessions/train-demo.yaml",  # the base revision's checkout (CI)
}


def shipped(word: str) -> str:
    return STAND_INS.get(word, word)


def named_files(args) -> list[str]:
    """The files a parsed command line names (definitions, pools), as the checkout has them."""
    return [shipped(v) for v in (getattr(args, "file", None), getattr(args, "old", None),
                                 getattr(args, "new", None)) if v]


def inline_lines() -> list[str]:
    """``sessionctl ...`` in the prose that names a shipped file: a command line as much as a
    code block's (the others are verb names and synopses: ``sessionctl run FILE``)."""
    spans = re.findall(r"`(sessionctl [^`]*stacks/[^`]*)`", README)
    return sorted({" ".join(span.split()) for span in spans})


def test_the_prose_has_command_lines_too():
    assert "sessionctl plan stacks/sessions/multi-demo.yaml --pool lab --probe" in inline_lines()


@pytest.mark.parametrize("line", sessionctl_lines() + inline_lines())
def test_every_sessionctl_line_in_the_readme_holds_against_the_shipped_files(
        line, monkeypatch, capsys):
    """Parsed by the real parser, then each argument checked as the verb would check it before
    reaching anything: the definition loads with its pool (``--pool``, or its own), the
    ``--index`` is one of the sessions it makes, ``HOST``/``--host`` is one of its hosts,
    ``open``'s service one it declares, a ``pool`` verb's pool loads."""
    from cluster_sessions.driver.pool_verbs import load_pool
    from cluster_sessions.driver.session_args import load_definition, select

    monkeypatch.chdir(PROJECT)
    argv = shlex.split(line)[1:]
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, --version: exit 0
        assert exc.code == 0, f"{line}: {capsys.readouterr().err}"
        return
    for name in named_files(args):
        assert (PROJECT / name).is_file(), f"{line}: no {name}"
    if getattr(args, "file", None):
        pool = getattr(args, "pool", None)
        loaded = load_definition(Path(shipped(args.file)), Path(shipped(pool)) if pool else None)
        sel = select(loaded, getattr(args, "index", None))  # --index out of range: raises
        plans = [plan for _, plan in sel.chosen]
        hosts = getattr(args, "host", None)
        for host in [hosts] if isinstance(hosts, str) else hosts or []:
            assert all(host in plan.hosts for plan in plans), f"{line}: no host {host}"
        if getattr(args, "service", None):
            assert all(args.service in [v.name for v in plan.services] for plan in plans), line
    elif args.verb == "pool":
        load_pool(shipped(args.pool))


def test_a_line_with_an_index_the_count_does_not_make_is_caught():
    """The check above is not vacuous: sweep has count 2, so --index 3 fails as a user's would."""
    from cluster_sessions.core.problems import DefinitionError
    from cluster_sessions.driver.session_args import selected

    args = build_parser().parse_args(["status", str(PROJECT / "stacks/sessions/sweep.yaml"),
                                      "--index", "3"])
    with pytest.raises(DefinitionError, match="--index 3 is out of range"):
        selected(args)


OFFLINE_VERBS = ("validate", "plan", "diff", "--version")
OFFLINE = [line for line in sessionctl_lines() if line.split()[1] in OFFLINE_VERBS]


def test_the_readme_runs_each_offline_verb():
    assert {line.split()[1] for line in OFFLINE} == set(OFFLINE_VERBS)


@pytest.mark.parametrize("line", OFFLINE)
def test_the_readme_s_offline_commands_succeed(line, monkeypatch, capsys):
    monkeypatch.chdir(PROJECT)
    argv = []
    for word in shlex.split(line)[1:]:
        argv += sorted(map(str, PROJECT.glob(word))) if "*" in word else [shipped(word)]
    try:
        code = main(argv)
    except SystemExit as exc:  # --version
        code = exc.code
    assert code == 0, capsys.readouterr().err


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


def run_your_job() -> str:
    return README.split("### Run your job", 1)[1].split("\n## ", 1)[0]


def test_the_launchers_the_readme_runs_come_from_images_it_says_how_to_get():
    """`torchrun`, `mpirun`, `deepspeed` are not in the demo image: the section says which
    image has each and how to get it, with commands that build what it says."""
    from cluster_sessions.lab import image, pydirs

    section = run_your_job()
    for launcher in ("torchrun", "mpirun", "deepspeed"):
        assert re.search(rf"^{launcher} ", section, re.M), launcher
    assert not any(p in image.PACKAGES for p in ("openmpi-bin", "python3-torch"))  # demo image
    build = ".venv/bin/python -m cluster_sessions.lab.image --flavour mpi"
    assert f"`{build}`" in section
    assert "openmpi-bin" in image.packages("mpi") and "python3-mpi4py" in image.packages("mpi")
    named = re.search(r"`(cluster-sessions/debian-mpi):<digest>`", section).group(1)
    assert image.default_tag("mpi").split(":")[0] == named
    for name in ("torch", "tensorflow"):
        assert name in pydirs.DIRS
    assert "`.venv/bin/python -m cluster_sessions.lab.pydirs torch` (or `tensorflow`)" in section
    assert "python3 -m torch.distributed.run" in section and "DeepSpeed" in section


def test_every_program_the_readme_runs_on_this_machine_is_one_set_up_installs():
    """scp and ssh come with openssh-client; rsync is a package of its own."""
    setup = (PROJECT / "scripts" / "setup.sh").read_text()
    first = re.search(r"^packages=\((.*?)\)", setup, re.M).group(1).split()
    words = {line.split()[0] for block in code_blocks() for line in block.splitlines()
             if line.strip() and not line.startswith("#")}
    assert "rsync" in words and "rsync" in first  # installed whatever the options


def test_the_embedded_pool_holds_every_example_the_readme_runs_on_it_at_once():
    """Issue 41, item 4: following the README in order never ends in PENDING on the embedded
    default: every shipped session on `local` (each of a `count`) fits its declared capacity
    together, whatever the walk leaves running."""
    from cluster_sessions.core.loader import load_file, load_session
    from cluster_sessions.core.plan import build_plans

    pool = load_file(PROJECT / "stacks" / "pools" / "local.yaml", expect="AgentPool")
    (agent,) = pool.agents
    cpu = mem = 0.0
    for path in sorted((PROJECT / "stacks" / "sessions").glob("*.yaml")):
        loaded = load_session(path)
        if loaded.pool.name != "local":
            continue
        for plan in build_plans(loaded.session, loaded.pool):
            assert not plan.pending, (path.name, plan.reason)
            cpu += plan.resources.cpu * len(plan.containers)
            mem += plan.resources.mem * len(plan.containers)
    assert cpu <= agent.capacity.cpu, f"the walk needs cpu {cpu}, local: {agent.capacity.cpu}"
    assert mem <= agent.capacity.mem, f"the walk needs mem {mem}, local: {agent.capacity.mem}"


def test_the_first_screenfuls_say_what_it_is_how_to_start_and_where_the_rest_lives():
    """Issue 46, part 5: the first 100 lines are what it is, the two commands for a fresh
    machine, one definition, the first session, getting in, and where everything else lives;
    the field rules, pools, scheduling and security detail are in docs/, linked from there."""
    first = "\n".join(README.splitlines()[:100])
    assert "bash scripts/setup.sh && sessionctl up stacks/sessions/train-demo.yaml --yes" in first
    assert "bash scripts/setup.sh --dev && .venv/bin/python -m pytest" in first
    assert "```yaml\nkind: ClusterSession" in first
    assert "sessionctl up stacks/sessions/train-demo.yaml --yes" in first
    assert "sessionctl ssh stacks/sessions/train-demo.yaml" in first and "`ssh sub1`" in first
    for doc in ("docs/definitions.md", "docs/pools.md", "docs/scheduling.md",
                "docs/threat-model.md", "docs/design-notes.md"):
        assert f"`{doc}`" in first, doc
        assert (PROJECT / doc).is_file(), doc
    assert "Unknown keys are errors" not in first  # the field rules: docs/definitions.md
    assert "Unknown keys are errors" in (PROJECT / "docs" / "definitions.md").read_text()
    for section in ("## Layout", "## Dependencies"):  # kept, after the first screenfuls
        assert f"\n{section}" in README, section
