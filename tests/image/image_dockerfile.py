"""The repository's Dockerfile read as data: its stages and their instructions, and what the
final stage makes of an image (environment, user, entry point, labels, ports). The tests lay
out and run the image from this, so a path or setting changed in the Dockerfile changes what
they check."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"

PINNED = re.compile(r"^[^@\s]+:[^@\s]+@sha256:[0-9a-f]{64}$")


@dataclass
class Instruction:
    """One instruction: its keyword, its `--flag=value` options, and the rest of the line."""

    keyword: str
    flags: dict[str, str]
    args: str

    def words(self) -> list[str]:
        return shlex.split(self.args)

    def exec_form(self) -> list[str]:
        """ENTRYPOINT/CMD: only the JSON (exec) form is used, as a distroless image has no
        shell to run the other."""
        value = json.loads(self.args)
        assert isinstance(value, list), f"{self.keyword} must be in exec (JSON) form: {self.args}"
        return value


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def one(self, keyword: str) -> Instruction:
        found = self.all(keyword)
        assert len(found) == 1, f"expected one {keyword} in stage {self.name or self.base}, found {len(found)}"
        return found[0]


@dataclass
class Dockerfile:
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def stage(self, name: str) -> Stage:
        (found,) = [s for s in self.stages if s.name == name]
        return found

    def args(self, stage: Stage) -> dict[str, str]:
        """The stage's ARG defaults (what an image built without --build-arg gets)."""
        defaults = {}
        for instruction in stage.all("ARG"):
            name, _, value = instruction.args.partition("=")
            defaults[name] = value
        return defaults

    def env(self) -> dict[str, str]:
        """The final stage's ENV, in order."""
        env: dict[str, str] = {}
        for instruction in self.final.all("ENV"):
            env.update(pairs(instruction.words()))
        return env

    def labels(self) -> dict[str, str]:
        """The final stage's LABELs with its ARG defaults substituted."""
        args = self.args(self.final)
        labels: dict[str, str] = {}
        for instruction in self.final.all("LABEL"):
            for key, value in pairs(instruction.words()).items():
                labels[key] = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], value)
        return labels

    def user(self) -> tuple[int, int]:
        """USER as numbers; a name would leave the uid to the base image's /etc/passwd."""
        uid, _, gid = self.final.one("USER").args.partition(":")
        assert uid.isdigit() and gid.isdigit(), f"USER must be numeric uid:gid, not {uid}:{gid}"
        return int(uid), int(gid)

    def command(self) -> list[str]:
        """What the container runs: ENTRYPOINT then CMD."""
        return self.final.one("ENTRYPOINT").exec_form() + self.final.one("CMD").exec_form()

    def exposed(self) -> set[int]:
        return {int(port.split("/")[0]) for i in self.final.all("EXPOSE") for port in i.words()}


def pairs(words: list[str]) -> dict[str, str]:
    """`KEY=value` words (ENV, LABEL) as a dict."""
    result = {}
    for word in words:
        key, sep, value = word.partition("=")
        assert sep, f"expected KEY=value, found {word!r}"
        result[key] = value
    return result


def logical_lines(text: str) -> list[str]:
    """The Dockerfile's instructions, one a line: comments dropped, continuations joined."""
    lines, current = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    assert not current, "the Dockerfile ends inside a continued line"
    return lines


def parse(text: str) -> Dockerfile:
    stages: list[Stage] = []
    for line in logical_lines(text):
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        flags = {}
        while rest.startswith("--"):
            flag, _, rest = rest.partition(" ")
            name, _, value = flag[2:].partition("=")
            flags[name] = value
            rest = rest.lstrip()
        if keyword == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=words[0], name=name))
            continue
        assert stages or keyword == "ARG", f"{keyword} before the first FROM"
        if stages:
            stages[-1].instructions.append(Instruction(keyword, flags, rest))
    return Dockerfile(stages)


def load() -> Dockerfile:
    return parse(DOCKERFILE.read_text())


def dockerignore_admits(path: str) -> bool:
    """Whether the build context holds `path` (relative to the repository), under
    .dockerignore's rules as BuildKit reads them: the last pattern that matches the path or a
    directory above it decides, a `!` pattern letting it back in. Only the forms this
    repository's .dockerignore uses are understood: `*` and plain paths."""
    admitted = True
    parts = Path(path).parts
    for raw in DOCKERIGNORE.read_text().splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        keep = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        assert pattern == "*" or "*" not in pattern, f"pattern not understood by this check: {raw}"
        covers = pattern == "*" or Path(pattern).parts == parts[: len(Path(pattern).parts)]
        if covers:
            admitted = keep
    return admitted
