"""Reading definition files: YAML text to typed specs, or a list of problems.

The YAML loader is stricter than PyYAML's default on purpose: a key given twice is an error
(PyYAML silently keeps the last one), aliases are refused (a few lines of aliases can expand to
billions of nodes) and so is nesting deeper than 64 levels (libyaml's composer recurses in C
and crashes on very deep input). Files over 1 MiB are refused for the same reason (counted on
what is read: ``/proc`` files report a size of 0).

Numbers are checked on their source text before PyYAML turns them into values, because YAML
1.1 reads many spellings as something other than what they seem to say: ``01750`` is octal
(1000), ``1:30`` is base 60 (90), ``0x1f``, ``0b11``, ``1_000``, ``+5``, ``.inf``. Every
integer in a definition is written in plain decimal; anything else is a problem that says so.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError

from .errors import InvalidInput
from .names import POOLS_DIR, STACKS_DIR
from .problems import WHOLE_FILE, DefinitionError, Problem, did_you_mean, dotted
from .spec import KINDS, Pool, Session, pool_problems, session_problems

MAX_FILE_BYTES = 1024 * 1024
MAX_DEPTH = 64
MAX_INT = 2**63 - 1  # what Docker, the kernel and JSON readers all hold
INT_TAG = "tag:yaml.org,2002:int"
FLOAT_TAG = "tag:yaml.org,2002:float"
_DECIMAL = re.compile(r"-?(0|[1-9][0-9]*)", re.ASCII)
_FLOAT = re.compile(r"-?([0-9]+\.[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?", re.ASCII)
_Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: ~10x faster


class _StrictLoader(_Base):  # type: ignore[misc, valid-type]
    def construct_mapping(self, node, deep=False):  # type: ignore[override]
        seen: dict[object, yaml.Mark] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:
                raise yaml.MarkedYAMLError(
                    None, None, "a key must be a plain value", key_node.start_mark
                ) from None
            if first is not None:
                raise yaml.MarkedYAMLError(
                    None, None,
                    f"key {key!r} appears twice (first on line {first.line + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def _check_events(text: str) -> None:
    """Refuse aliases and deep nesting before composing: both can exhaust memory or stack."""
    depth = 0
    for event in yaml.parse(text, Loader=_Base):
        if isinstance(event, yaml.AliasEvent):
            raise yaml.MarkedYAMLError(None, None, "aliases (*name) are not allowed",
                                       event.start_mark)
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise yaml.MarkedYAMLError(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                           event.start_mark)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


BOOL_TAG = "tag:yaml.org,2002:bool"
# YAML 1.2's booleans; PyYAML also reads yes/no/on/off/y/n (YAML 1.1), which other readers
# (and people) take as text
YAML12_BOOLS = ("true", "True", "TRUE", "false", "False", "FALSE")


def _int_spelling(text: str) -> str:
    body = text.lstrip("+-")
    if ":" in body:
        return "a base-60 (sexagesimal) number in YAML 1.1"
    if body[:2] in ("0x", "0X"):
        return "hexadecimal"
    if body[:2] in ("0b", "0B"):
        return "binary"
    if len(body) > 1 and body[0] == "0":
        return "octal in YAML 1.1 (a leading zero)"
    if "_" in body:
        return "written with '_' separators"
    if text.startswith("+"):
        return "written with a '+' sign"
    return "not a plain decimal integer"


def _number_problem(node: yaml.ScalarNode) -> str | None:
    """What is wrong with how an integer or float scalar is written, or None."""
    text = node.value
    if node.tag == INT_TAG:
        if _DECIMAL.fullmatch(text):
            if len(text.lstrip("-")) > 19 or abs(int(text)) > MAX_INT:
                return (f"an integer of {len(text.lstrip('-'))} digits is too large "
                        f"(at most {MAX_INT})")
            return None
        meaning = ""
        if len(text) <= 100:
            try:
                value = yaml.SafeLoader("").construct_yaml_int(node)
                meaning = f" ({value})" if abs(value) <= MAX_INT else ""
            except Exception:  # noqa: BLE001 - only a hint; the problem stands without it
                pass
        return (f"{text!r} is {_int_spelling(text)}{meaning}; write integers in plain decimal "
                "without leading zeros, signs or separators (e.g. 1750), or quote the value if "
                "you mean text")
    if node.tag == BOOL_TAG and text not in YAML12_BOOLS:
        value = "true" if text.lower() in ("yes", "y", "on") else "false"
        return (f"{text!r} is a boolean ({value}) only in YAML 1.1; write true or false, or "
                "quote the value if you mean text")
    if node.tag == FLOAT_TAG:
        if _FLOAT.fullmatch(text):
            return None
        if text.lstrip("+-").lower() in (".inf", ".nan"):
            return (f"{text!r} is not a finite number; write a decimal number such as 2 or 0.5 "
                    "(quote it if you mean text)")
        return (f"{text!r} is not a plain decimal number; write numbers such as 2 or 0.5, "
                "without signs, separators or ':' (quote it if you mean text)")
    return None


def _number_problems(node: yaml.Node, path: tuple, file: str) -> list[Problem]:
    """Every integer or float in the document whose spelling means something unexpected."""
    if isinstance(node, yaml.ScalarNode):
        problem = _number_problem(node)
        if problem is None:
            return []
        return [Problem(file, dotted(path) or WHOLE_FILE,
                        f"{problem} (line {node.start_mark.line + 1})")]
    found: list[Problem] = []
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found += _number_problems(item, (*path, i), file)
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else "?"
            found += _number_problems(key, (*path, name), file)
            found += _number_problems(value, (*path, name), file)
    return found


def parse_yaml(text: str, file: str) -> object:
    """One YAML document, or a DefinitionError naming the line."""
    try:
        _check_events(text)
        loader = _StrictLoader(text)
        try:
            nodes = []
            while loader.check_node():
                nodes.append(loader.get_node())
            problems = [p for node in nodes for p in _number_problems(node, (), file)]
            if problems:
                raise DefinitionError(problems)
            docs = [loader.construct_document(node) for node in nodes]
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else WHOLE_FILE
        problem = exc.problem or exc.context or "invalid YAML"
        raise DefinitionError([Problem(file, where, f"invalid YAML: {problem}")]) from None
    except yaml.YAMLError as exc:
        raise DefinitionError([Problem(file, WHOLE_FILE, f"invalid YAML: {exc}")]) from None
    docs = [d for d in docs if d is not None]
    if len(docs) != 1:
        raise DefinitionError([Problem(file, WHOLE_FILE, f"expected exactly one YAML document, "
                                       f"found {len(docs)}")])
    return docs[0]


def read_text(path: Path) -> str:
    """The file's text, reading at most 1 MiB and a byte: ``/proc`` files report a size of 0,
    so the limit is checked on what is read. Opened without blocking, so a FIFO is refused
    rather than waited on."""
    file = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                raise IsADirectoryError
            if not stat.S_ISREG(mode):
                raise DefinitionError([Problem(file, WHOLE_FILE, "not a regular file")])
            with os.fdopen(fd, "rb", closefd=False) as stream:
                data = stream.read(MAX_FILE_BYTES + 1)
        finally:
            os.close(fd)
        if len(data) > MAX_FILE_BYTES:
            raise DefinitionError([Problem(file, WHOLE_FILE, "file is larger than 1 MiB")])
        return data.decode()  # UTF-8
    except FileNotFoundError:
        raise DefinitionError([Problem(file, WHOLE_FILE, "no such file")]) from None
    except IsADirectoryError:
        raise DefinitionError([Problem(file, WHOLE_FILE, "is a directory, not a file")]) from None
    except UnicodeDecodeError as exc:
        raise DefinitionError([Problem(file, WHOLE_FILE, f"not UTF-8 text ({exc.reason} at "
                                       f"byte {exc.start})")]) from None
    except OSError as exc:
        raise DefinitionError([Problem(file, WHOLE_FILE, f"cannot read: {exc.strerror}")]) from None


def _message(error: dict, model: type[BaseModel]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        key = str(error["loc"][-1])
        allowed = _allowed_keys(model, error["loc"][:-1])
        hint = difflib.get_close_matches(key, allowed)  # best first
        suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
        return f"unknown key{suggestion} (allowed: {', '.join(allowed)})"
    if kind == "missing":
        return "required"
    if kind == "literal_error":
        given = error["input"]
        # pydantic's ctx lists the allowed values as "'a', 'b' or 'c'" (none of ours has a quote)
        allowed = re.findall(r"'([^']*)'", str(error.get("ctx", {}).get("expected", "")))
        hint = difflib.get_close_matches(given, allowed) if isinstance(given, str) else []
        suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
        return (f"{error['msg'].replace('Input should be', 'must be')}, got {given!r}"
                f"{suggestion}")
    if kind == "int_type" and isinstance(error["input"], str):
        return (f"must be an integer written in plain decimal (e.g. 1750), got "
                f"{error['input']!r}")
    if kind == "string_type" and not isinstance(error["input"], dict | list):
        return f"must be a string, got {error['input']!r} (quote it in YAML)"
    msg = error["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    return (msg.replace("Input should be", "must be").replace("Value should", "must")
            .replace(" after validation", ""))


def _allowed_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names of the (nested) model at ``loc``, for 'did you mean' hints."""
    current: object = model
    for part in loc:
        if isinstance(part, int):
            continue
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return []
        current = _model_of(fields[part].annotation)
    fields = getattr(current, "model_fields", None)
    return list(fields) if fields else []


def _model_of(annotation: object) -> object:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def as_json_numbers(data: object) -> object:
    """Numbers as JSON Schema reads them (``sessionctl schema``): a float with no fractional
    part is that integer, so ``size: 2.0`` means what an editor checking the schema says it
    means (2), and ``size: 2.5`` stays a problem. Float fields take the integer as it is."""
    if isinstance(data, float) and data.is_integer():
        return int(data)
    if isinstance(data, dict):
        return {k: as_json_numbers(v) for k, v in data.items()}
    if isinstance(data, list):
        return [as_json_numbers(v) for v in data]
    return data


def to_model(data: object, file: str, expect: str | None = None) -> Session | Pool:
    """Validate a parsed document into its kind's model, or raise DefinitionError."""
    if not isinstance(data, dict):
        raise DefinitionError([Problem(file, WHOLE_FILE, "expected a mapping with a 'kind' key")])
    kind = data.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        what = "required" if kind is None else f"unknown kind {kind!r}"
        raise DefinitionError([Problem(file, "kind", f"{what}; expected one of "
                                       f"{', '.join(KINDS)}")])
    if expect and kind != expect:
        raise DefinitionError([Problem(file, "kind", f"expected {expect}, got {kind}")])
    model = KINDS[kind]
    from_file = named_by_file(data)
    if from_file:
        data = {**data, "name": Path(file).stem}
    try:
        obj = model.model_validate(as_json_numbers(data))
    except ValidationError as exc:
        problems = [
            Problem(file, dotted(tuple(p for p in e["loc"] if p != "[key]")), _message(e, model))
            for e in exc.errors(include_url=False)
        ]
        raise DefinitionError(_noting_file_name(problems, from_file)) from None
    check = session_problems if isinstance(obj, Session) else pool_problems
    problems = [Problem(file, path, msg) for path, msg in check(obj)]  # type: ignore[arg-type]
    if problems:
        raise DefinitionError(_noting_file_name(problems, from_file))
    return obj


def named_by_file(data: object) -> bool:
    """A ClusterSession that omits ``name`` is named after its file's stem
    (``stacks/sessions/train-demo.yaml`` is ``train-demo``): one name fewer to keep in step."""
    return isinstance(data, dict) and data.get("kind") == "ClusterSession" and "name" not in data


def _noting_file_name(problems: list[Problem], from_file: bool) -> list[Problem]:
    """A problem with a name the file gave says so: the fix is a ``name:`` or a new file name."""
    if not from_file:
        return problems
    note = " (the name comes from the file name: add a `name:` or rename the file)"
    return [Problem(p.file, p.path, p.message + note) if p.path == "name" else p
            for p in problems]


def load_file(path: Path, expect: str | None = None) -> Session | Pool:
    file = str(path)
    return to_model(parse_yaml(read_text(path), file), file, expect)


@dataclass(frozen=True)
class Loaded:
    session: Session
    session_file: Path
    pool: Pool
    pool_file: Path
    name_from_file: bool = False  # the definition has no `name:`; its file's stem is the name


def _cwd() -> Path | None:
    """The working directory, or None when it was deleted (or cannot be read)."""
    try:
        return Path.cwd()
    except OSError:
        return None


POOLS_ENV = "CLUSTER_SESSIONS_POOLS"
"""Directories (``os.pathsep``-separated) where the operator keeps pools; the driver and the
program read it (:func:`operator_pool_dirs`), the loader only takes the directories."""
BUILTIN_POOLS = Path(__file__).resolve().parents[3] / STACKS_DIR / POOLS_DIR
"""The project's own pools (``local``, the embedded default), found from anywhere."""


def operator_pool_dirs(env_value: str | None) -> tuple[Path, ...]:
    """Where pools are found, in this order (the first file found wins): each directory of
    ``$CLUSTER_SESSIONS_POOLS`` (``env_value``), then the project's own ``stacks/pools``.

    The pool is the operator's trust boundary (it chooses the engines, SSH identities, TLS
    material and mount sources), so these are the operator's directories only: never a
    folder beside the definition, whose author may have written a pool of their own there."""
    dirs = [Path(d).expanduser() for d in (env_value or "").split(os.pathsep) if d]
    dirs.append(BUILTIN_POOLS)
    return tuple(dict.fromkeys(dirs))


class PoolNotFound(InvalidInput, LookupError):
    """A pool reference that leads to no file; the message says where it looked, or why not."""


class PoolOutsideOperatorDirs(PoolNotFound):
    """A definition's ``pool:`` path that resolves outside the operator's pool directories."""


def _is_path(ref: str) -> bool:
    return "/" in ref or ref.endswith((".yaml", ".yml"))


def pool_candidates(session_file: Path | None, pool_ref: str,
                    allowed: Sequence[Path]) -> list[Path]:
    """Where a pool reference may point: a path (relative to the definition's folder, then the
    working directory), or a name looked up in ``allowed`` (:func:`operator_pool_dirs`).

    Raises PoolNotFound for a ``~user`` that does not exist."""
    cwd = _cwd()
    try:
        base = session_file.resolve().parent if session_file is not None else None
    except OSError:  # a relative name, and the working directory is gone
        base = None
    if _is_path(pool_ref):
        try:
            ref = Path(pool_ref).expanduser()
        except RuntimeError:  # ~nosuchuser
            user = pool_ref[1:].split("/")[0]
            raise PoolNotFound(f"{pool_ref!r}: there is no user {user!r} for '~{user}'") from None
        if ref.is_absolute():
            return [ref]
        return [d / ref for d in (base, cwd) if d is not None]
    names = [f"{pool_ref}.yaml", f"{pool_ref}.yml"]
    return [d / n for d in allowed for n in names]


def inside(path: Path, allowed: Sequence[Path]) -> bool:
    """``path``, every link on its way resolved (nothing is opened), is in one of ``allowed``
    (resolved the same way): ``pools/../../etc/x`` and a link out of a pool directory are
    not."""
    try:
        real = path.resolve()
        return any(real.is_relative_to(d.resolve()) for d in allowed)
    except (OSError, RuntimeError):  # a link loop, a name too long, cwd gone: not inside
        return False


def find_pool(ref: str, session_file: Path | None = None, *, given: bool = False,
              allowed: Sequence[Path] = (BUILTIN_POOLS,)) -> Path:
    """The pool file a reference means: the one rule for a definition's ``pool:``, ``--pool``
    and the pool verbs' POOL. ``allowed``: the operator's pool directories
    (:func:`operator_pool_dirs`). A definition's reference must resolve inside one of them;
    ``given`` (typed by the operator: ``--pool``, the stack's ``cluster-sessions:pool``, a pool
    verb's POOL) may name any file, and a file that exists as written is that file, even
    without ``/`` or ``.yaml``. Raises PoolNotFound (PoolOutsideOperatorDirs)."""
    unusable: list[str] = []
    if given and _is_file(Path(ref), unusable):
        return Path(ref)
    candidates = pool_candidates(session_file, ref, allowed)
    if not given:
        outside = [c for c in candidates if not inside(c, allowed)]
        candidates = [c for c in candidates if c not in outside]
        if outside and not candidates:
            where = ", ".join(str(d) for d in allowed)
            raise PoolOutsideOperatorDirs(
                f"{ref!r} is outside the directories the operator keeps pools in ({where}); "
                "its file was not read: name a pool there (`pool: local`), or ask the operator "
                f"to add its directory to ${POOLS_ENV} or to run with --pool")
    found = next((c for c in candidates if _is_file(c, unusable)), None)
    if found is None and not _is_path(ref):
        # a pool is found by its name: a file `pool.yaml` holding `name: ncpool` is `ncpool`
        by_name = [path for folder in dict.fromkeys(c.parent for c in candidates)
                   for name, path in pools_in(folder)
                   if name == ref and (given or inside(path, allowed))]
        found = by_name[0] if by_name else None
    if found is None:
        looked = ", ".join(dict.fromkeys(str(c) for c in candidates)) or "nowhere"
        notes = "".join(f"; cannot look at {u}" for u in dict.fromkeys(unusable))
        if _cwd() is None:
            notes += "; the working directory no longer exists"
        raise PoolNotFound(f"no pool {ref!r} found (looked for {looked}){notes}"
                           f"{_pool_hint(ref, candidates)}")
    return found


POOL_FILE_LIMIT = 1024 * 1024  # a pool file larger than this is not read when listing


def pools_in(folder: Path) -> list[tuple[str, Path]]:
    """The pools a folder holds, as (their ``name:``, their file), in file order: only YAML
    files whose first document is ``kind: AgentPool`` (a definition kept beside them is not a
    pool); a file that cannot be read or parsed is passed over (``validate`` names it)."""
    found: list[tuple[str, Path]] = []
    try:
        files = sorted(f for f in folder.iterdir() if f.suffix in (".yaml", ".yml"))
    except OSError:
        return found
    for path in files:
        try:
            if not path.is_file() or path.stat().st_size > POOL_FILE_LIMIT:
                continue
            doc = next(yaml.safe_load_all(path.read_text(encoding="utf-8")), None)
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        if isinstance(doc, dict) and doc.get("kind") == "AgentPool":
            name = doc.get("name")
            found.append((name if isinstance(name, str) and name else path.stem, path))
    return found


def _pool_hint(ref: str, candidates: list[Path]) -> str:
    """For a pool *name*, the pools that do exist where it was looked up (by their names), and
    the closest (a typo is the usual cause, as with unknown keys)."""
    if _is_path(ref):
        return ""
    names: list[str] = []
    for folder in dict.fromkeys(c.parent for c in candidates):
        names += [name for name, _path in pools_in(folder)]
    names = list(dict.fromkeys(names))
    if not names:
        return ""
    return f"{did_you_mean(ref, names)} (pools that exist: {', '.join(names)})"


def _is_file(path: Path, unusable: list[str]) -> bool:
    """``path.is_file()``, noting why a candidate could not even be looked at."""
    try:
        return path.is_file()
    except OSError as exc:  # ENAMETOOLONG, EACCES on a directory on the way, ...
        unusable.append(f"{path}: {exc.strerror}")
        return False


def load_session(session_file: Path, pool_file: Path | None = None, *,
                 pool_dirs: Sequence[Path] = (BUILTIN_POOLS,)) -> Loaded:
    """A session and its pool, both valid and consistent, or DefinitionError with them all."""
    file = str(session_file)
    data = parse_yaml(read_text(session_file), file)
    session = to_model(data, file, expect="ClusterSession")
    assert isinstance(session, Session)
    return with_pool(session, session_file, pool_file, name_from_file=named_by_file(data),
                     pool_dirs=pool_dirs)


def with_pool(session: Session, session_file: Path, pool_file: Path | None = None, *,
              name_from_file: bool = False,
              pool_dirs: Sequence[Path] = (BUILTIN_POOLS,)) -> Loaded:
    """``pool_file``: a pool given by the operator (``--pool``, the stack's
    ``cluster-sessions:pool``: a file or a name) that replaces the definition's own ``pool:``;
    both are found by :func:`find_pool` in ``pool_dirs``, the definition's only there."""
    file = str(session_file)
    try:
        if pool_file is None:
            pool_file = find_pool(session.pool, session_file, allowed=pool_dirs)
        else:
            pool_file = find_pool(str(pool_file), session_file, given=True, allowed=pool_dirs)
    except PoolNotFound as exc:
        raise DefinitionError([Problem(file, "pool", str(exc))]) from None
    pool = load_pool_file(pool_file)
    return Loaded(session, session_file, pool, pool_file, name_from_file)


_CLAIMS_POOL = re.compile(r"^kind:[ \t]*[\"']?AgentPool[\"']?[ \t]*(#.*)?$", re.MULTILINE)


def load_pool_file(path: Path) -> Pool:
    """An AgentPool, or DefinitionError. A file that does not say ``kind: AgentPool`` is refused
    as a whole, without a problem that quotes it: YAML problems and field messages echo values
    (``'0022' is octal``), and a pool must not turn ``validate`` into a way to print a file
    the operator's user can read."""
    text = read_text(path)
    file = str(path)
    not_a_pool = DefinitionError([Problem(file, "kind", "not an AgentPool file (a pool file "
                                          "says `kind: AgentPool`); its content is not shown")])
    if not _CLAIMS_POOL.search(text):
        raise not_a_pool
    data = parse_yaml(text, file)  # it says it is a pool: its own problems are shown
    if not isinstance(data, dict) or data.get("kind") != "AgentPool":
        raise not_a_pool
    pool = to_model(data, file, expect="AgentPool")
    assert isinstance(pool, Pool)
    return pool
