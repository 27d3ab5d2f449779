"""Readers for the deployment files, so tests can run what the container would run, outside Docker.

- :func:`parse_dockerfile` / :class:`Dockerfile`: stages, the chain of stages a build arg selects,
  and the final image's ENV, COPY, HEALTHCHECK, ENTRYPOINT and CMD;
- :func:`interpolate`: Compose's ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``$$``;
- :func:`dockerignore_excludes`: Docker's ``.dockerignore`` matching (root-anchored patterns,
  ``**`` for any depth, ``!`` exceptions, last match wins, a path is excluded with its parent).

Only the Dockerfile syntax this repository uses is supported; anything else raises ``ValueError``
naming the line, so a test cannot silently read the file wrong.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_ROOT / "Dockerfile"
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"


@dataclass
class Instruction:
    keyword: str  # upper case: FROM, RUN, ENV, ...
    args: str  # the rest of the (joined) line
    line: int  # 1-based line where the instruction starts

    def json_args(self) -> list[str]:
        """Exec-form arguments (``["a", "b"]``); ``ValueError`` for shell form."""
        try:
            value = json.loads(self.args)
        except json.JSONDecodeError:
            value = None
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise ValueError(f"Dockerfile:{self.line}: {self.keyword} is not in exec (JSON) form")
        return value


@dataclass
class Stage:
    base: str  # image or stage name as written (may hold ${ARG})
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


@dataclass
class Dockerfile:
    global_args: dict[str, str]
    stages: list[Stage]

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(f"no stage named {name!r}")

    def expand(self, text: str, build_args: Mapping[str, str] | None = None) -> str:
        """``${ARG}`` / ``$ARG`` replaced by build args, else the global ARG defaults."""
        values = {**self.global_args, **(build_args or {})}

        def sub(m: re.Match[str]) -> str:
            name = m.group(1) or m.group(2)
            if name not in values:
                raise ValueError(f"undefined build arg {name!r} in {text!r}")
            return values[name]

        return re.sub(r"\$\{(\w+)\}|\$(\w+)", sub, text)

    def chain(self, build_args: Mapping[str, str] | None = None) -> list[Stage]:
        """Stages from the final one back to the one built on an image, for ``build_args``."""
        out = [self.stages[-1]]
        names = {s.name for s in self.stages if s.name}
        while True:
            base = self.expand(out[-1].base, build_args)
            if base not in names:
                return out
            out.append(self.stage(base))
            if len(out) > len(self.stages):
                raise ValueError("FROM cycle between stages")

    def base_image(self, build_args: Mapping[str, str] | None = None) -> str:
        """The image the final stage is built on, for ``build_args``."""
        return self.expand(self.chain(build_args)[-1].base, build_args)

    def env(self, build_args: Mapping[str, str] | None = None) -> dict[str, str]:
        """ENV of the final image (the base image's own ENV aside), later stages winning."""
        env: dict[str, str] = {}
        for stage in reversed(self.chain(build_args)):
            for inst in stage.all("ENV"):
                env.update(parse_env(inst))
        return env

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def final_command(self) -> list[str]:
        """ENTRYPOINT + CMD of the final stage (exec form), as the container runs them."""
        entry = self.final.all("ENTRYPOINT")
        cmd = self.final.all("CMD")
        return (entry[-1].json_args() if entry else []) + (cmd[-1].json_args() if cmd else [])

    def context_copies(self) -> dict[str, str]:
        """``{destination in the image: source in the build context}`` of the final stage."""
        out: dict[str, str] = {}
        for inst in self.final.all("COPY"):
            parts = shlex.split(inst.args)
            if any(p.startswith("--from") for p in parts):
                continue
            *sources, dest = [p for p in parts if not p.startswith("--")]
            for src in sources:
                out[dest.rstrip("/") if len(sources) == 1 else f"{dest}/{Path(src).name}"] = src
        return out

    def healthcheck(self) -> tuple[dict[str, str], list[str]]:
        """``(options, exec-form command)`` of the final stage's HEALTHCHECK."""
        (inst,) = self.final.all("HEALTHCHECK")
        options: dict[str, str] = {}
        rest = inst.args
        while rest.startswith("--"):
            opt, _, rest = rest.partition(" ")
            key, _, value = opt[2:].partition("=")
            options[key] = value
            rest = rest.lstrip()
        keyword, _, cmd = rest.partition(" ")
        if keyword != "CMD":
            raise ValueError(f"Dockerfile:{inst.line}: HEALTHCHECK must use CMD, got {keyword}")
        return options, Instruction("HEALTHCHECK", cmd.strip(), inst.line).json_args()


def parse_env(inst: Instruction) -> dict[str, str]:
    """``ENV A=1 B="two words"`` → ``{"A": "1", "B": "two words"}`` (key=value form only)."""
    out = {}
    for token in shlex.split(inst.args):
        key, eq, value = token.partition("=")
        if not eq:
            raise ValueError(f"Dockerfile:{inst.line}: ENV must use key=value, got {token!r}")
        out[key] = value
    return out


def parse_dockerfile(path: Path = DOCKERFILE) -> Dockerfile:
    """Instructions of ``path`` grouped by stage; comments dropped, continuations joined."""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # comment lines inside a continued instruction are dropped by Docker too
        if not pending:
            start = number
        pending.append(stripped.removesuffix("\\").strip())
        if stripped.endswith("\\"):
            continue
        text, pending = " ".join(p for p in pending if p), []
        keyword, _, args = text.partition(" ")
        inst = Instruction(keyword.upper(), args.strip(), start)
        if inst.keyword == "FROM":
            parts = inst.args.split()
            if len(parts) == 3 and parts[1].upper() == "AS":
                stages.append(Stage(parts[0], parts[2]))
            elif len(parts) == 1:
                stages.append(Stage(parts[0], None))
            else:
                raise ValueError(f"{path.name}:{start}: unsupported FROM {inst.args!r}")
        elif not stages:
            if inst.keyword != "ARG":
                raise ValueError(f"{path.name}:{start}: {inst.keyword} before the first FROM")
            name, _, default = inst.args.partition("=")
            global_args[name] = default
        else:
            stages[-1].instructions.append(inst)
    if pending:
        raise ValueError(f"{path.name}: ends inside a continued line")
    if not stages:
        raise ValueError(f"{path.name}: no FROM")
    return Dockerfile(global_args, stages)


_INTERPOLATION = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_]\w*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<named>[A-Za-z_]\w*)|(?P<bad>\{[^}]*\}?))"
)


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """Compose variable interpolation of one string against ``env``.

    ``${V}``/``$V`` → value or "", ``${V:-d}`` → d when unset or empty, ``${V-d}`` → d when
    unset, ``${V:?msg}``/``${V?msg}`` → ``ValueError`` when unset (or empty), ``${V:+x}``/``${V+x}``
    → x when set (and non-empty), ``$$`` → ``$``.
    """

    def sub(m: re.Match[str]) -> str:
        if m.group("escaped"):
            return "$"
        if m.group("bad") is not None:
            raise ValueError(f"invalid interpolation {m.group(0)!r} in {value!r}")
        name = m.group("braced") or m.group("named")
        op, arg = m.group("op"), m.group("arg") or ""
        current = env.get(name)
        unset_or_empty = current is None or (current == "" and op is not None and ":" in op)
        if op in (":-", "-"):
            return arg if unset_or_empty else str(current)
        if op in (":?", "?"):
            if unset_or_empty:
                raise ValueError(f"required variable {name} is missing: {arg}")
            return str(current)
        if op in (":+", "+"):
            return "" if unset_or_empty else arg
        return "" if current is None else str(current)

    return _INTERPOLATION.sub(sub, value)


def compose_environment(service: Mapping, env: Mapping[str, str]) -> dict[str, str]:
    """A service's ``environment`` (map or list form), interpolated against ``env``.

    A variable without a value takes its value from ``env`` and is left out when ``env`` has
    none, as Compose does.
    """
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        items = [(k, v if eq else None) for k, eq, v in (e.partition("=") for e in raw)]
    else:
        items = list(raw.items())
    out = {}
    for key, value in items:
        if value is None:
            if key in env:
                out[key] = env[key]
            continue
        text = str(value).lower() if isinstance(value, bool) else str(value)
        out[key] = interpolate(text, env)
    return out


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """Regex for one .dockerignore pattern (Go ``filepath.Match`` plus ``**``)."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            end = pattern.index("]", i)
            body = pattern[i + 1 : end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out))


def read_dockerignore(path: Path = DOCKERIGNORE) -> list[tuple[bool, re.Pattern[str]]]:
    """``[(is_exception, regex)]`` in file order."""
    rules = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:].strip() if negate else line
        pattern = re.sub(r"/+", "/", pattern).strip("/")
        if pattern.startswith("./"):
            pattern = pattern[2:]
        rules.append((negate, _pattern_regex(pattern)))
    return rules


def dockerignore_excludes(rules: list[tuple[bool, re.Pattern[str]]], path: str) -> bool:
    """Whether the context-relative ``path`` stays out of the build context."""
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for negate, regex in rules:
        if any(regex.fullmatch(c) for c in candidates):
            excluded = not negate
    return excluded
