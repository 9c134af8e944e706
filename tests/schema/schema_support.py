"""What the rule-file schema tests work with: the schema, a YAML reader that types scalars the
way floodgate's loader does, every rule file the repository holds, and the real loader
(`floodgate check-config`) to compare the schema's verdicts with."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from yaml.constructor import SafeConstructor
from yaml.resolver import BaseResolver

REPO = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO / "schemas" / "rules.schema.json"

# Rust sources whose string literals hold the rule files of envoyproxy/ratelimit's conformance
# examples (tests/conformance.rs keeps them inline, as `const EXAMPLE1: &str = "…";`).
CONFORMANCE_SOURCES = ["tests/conformance.rs"]

# Fuzz inputs the loader must refuse without crashing: rule-file names, but not rule files.
FUZZ_REGRESSIONS = "tests/fuzz/regressions"


def load_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def validator(schema: dict[str, Any] | None = None) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema if schema is not None else load_schema())


# ---------------------------------------------------------------------------------------------
# YAML as the loader types it
# ---------------------------------------------------------------------------------------------


class _CoreResolver(BaseResolver):
    """The YAML 1.2 core schema, as floodgate's loader (saphyr) and editors' YAML servers read
    plain scalars. PyYAML's own resolver is YAML 1.1's: it reads `010` as octal 8, `2024-01-01`
    as a date, `1_000` as 1000 and `<<` as a merge, none of which the loader does."""


_CoreResolver.add_implicit_resolver(
    "tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""]
)
_CoreResolver.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_CoreResolver.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
    list("-+0123456789"),
)
_CoreResolver.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?" r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+.0123456789"),
)


class CoreLoader(
    yaml.reader.Reader,
    yaml.scanner.Scanner,
    yaml.parser.Parser,
    yaml.composer.Composer,
    SafeConstructor,
    _CoreResolver,
):
    def __init__(self, stream: str) -> None:
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        yaml.composer.Composer.__init__(self)
        SafeConstructor.__init__(self)
        _CoreResolver.__init__(self)


def _core_int(loader: SafeConstructor, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node)
    if text.startswith("0o"):
        return int(text[2:], 8)
    if text.startswith("0x"):
        return int(text[2:], 16)
    return int(text, 10)  # `010` is ten


def _core_float(loader: SafeConstructor, node: yaml.ScalarNode) -> float:
    text = loader.construct_scalar(node).lower()
    if text.endswith(".inf"):
        return float("-inf") if text.startswith("-") else float("inf")
    if text == ".nan":
        return float("nan")
    return float(text)


CoreLoader.add_constructor("tag:yaml.org,2002:int", _core_int)
CoreLoader.add_constructor("tag:yaml.org,2002:float", _core_float)


# PyYAML recurses a few frames per level; the loader's own bound is 100 levels (docs/rules.md),
# so a file just past it must still be read, and judged, here.
_PARSE_RECURSION_LIMIT = 20_000


def parse(text: str) -> Any:
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(max(previous, _PARSE_RECURSION_LIMIT))
    try:
        return yaml.load(text, Loader=CoreLoader)
    finally:
        sys.setrecursionlimit(previous)


# ---------------------------------------------------------------------------------------------
# The repository's rule files
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RuleFile:
    """One rule file's text and where it comes from."""

    source: str  # which kind of place: examples, benches, helm, clients, tests, conformance
    name: str  # the file, or the file and the spot inside it
    text: str


def _yaml_files(pattern: str) -> list[Path]:
    found = [p for ext in ("yaml", "yml") for p in REPO.glob(f"{pattern}/*.{ext}")]
    return sorted(p for p in found if not p.name.startswith("."))


def _on_disk(source: str, pattern: str) -> list[RuleFile]:
    return [
        RuleFile(source, str(path.relative_to(REPO)), path.read_text(encoding="utf-8"))
        for path in _yaml_files(pattern)
        if FUZZ_REGRESSIONS not in str(path.relative_to(REPO))
    ]


def _helm_rules() -> list[RuleFile]:
    """The chart's example rules: `rules:` in values.yaml maps file names to file texts."""
    values_path = "helm/floodgate/values.yaml"
    values = yaml.safe_load((REPO / values_path).read_text(encoding="utf-8"))
    return [
        RuleFile("helm", f"{values_path}: rules.{name}", text) for name, text in (values.get("rules") or {}).items()
    ]


def repository_rule_files() -> list[RuleFile]:
    """Every rule file the repository ships or tests with, except the fuzz regressions."""
    files = (
        _on_disk("examples", "examples/**/rules")
        + _on_disk("benches", "benches/rules")
        + _helm_rules()
        + _on_disk("clients", "clients/*/test/rules")
        + _on_disk("clients", "clients/*/tests/rules")
        + _on_disk("tests", "tests/**/rules")
        + conformance_rule_files()
    )
    return files


def fuzz_regression_files() -> list[RuleFile]:
    return [
        RuleFile("fuzz", str(p.relative_to(REPO)), p.read_text(encoding="utf-8"))
        for p in _yaml_files(f"{FUZZ_REGRESSIONS}/**")
    ]


def conformance_rule_files() -> list[RuleFile]:
    """The string literals of CONFORMANCE_SOURCES whose text starts with `domain:`, each named
    by the source line its literal starts on."""
    files = []
    for source in CONFORMANCE_SOURCES:
        code = (REPO / source).read_text(encoding="utf-8")
        for line, text in rust_string_literals(code):
            if text.lstrip().startswith("domain:"):
                files.append(RuleFile("conformance", f"{source}:{line}", text))
    return files


# ---------------------------------------------------------------------------------------------
# Rust string literals
# ---------------------------------------------------------------------------------------------

_SIMPLE_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", "0": "\0", "'": "'", '"': '"'}
_CHAR_LITERAL = re.compile(r"'(?:\\u\{[0-9a-fA-F]{1,6}\}|\\x[0-9a-fA-F]{2}|\\.|[^\\'\n])'")
_RAW_OPEN = re.compile(r'b?r(#*)"')


def rust_string_literals(code: str) -> list[tuple[int, str]]:
    """Every string literal of a Rust source, plain (`"…"`, escapes decoded) and raw
    (`r#"…"#`), as (1-based line of its opening quote, text). Comments and character literals
    are skipped so that a quote inside them opens nothing."""
    literals = []
    i = 0
    while i < len(code):
        c = code[i]
        if code.startswith("//", i):
            end = code.find("\n", i)
            i = len(code) if end < 0 else end
        elif code.startswith("/*", i):
            end = code.find("*/", i + 2)
            i = len(code) if end < 0 else end + 2
        elif c == "'":
            char = _CHAR_LITERAL.match(code, i)
            i = char.end() if char else i + 1  # else a lifetime
        elif (raw := _RAW_OPEN.match(code, i)) and not _ident_char_before(code, i):
            close = '"' + raw.group(1)
            end = code.index(close, raw.end())
            literals.append((code.count("\n", 0, i) + 1, code[raw.end() : end]))
            i = end + len(close)
        elif c == '"':
            text, i_after = _plain_literal(code, i + 1)
            literals.append((code.count("\n", 0, i) + 1, text))
            i = i_after
        else:
            i += 1
    return literals


def _ident_char_before(code: str, i: int) -> bool:
    return i > 0 and (code[i - 1].isalnum() or code[i - 1] == "_")


def _plain_literal(code: str, i: int) -> tuple[str, int]:
    """Decodes a plain literal whose body starts at `i`; returns its text and the index past
    its closing quote."""
    out = []
    while code[i] != '"':
        if code[i] != "\\":
            out.append(code[i])
            i += 1
            continue
        escape = code[i + 1]
        if escape in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[escape])
            i += 2
        elif escape == "x":
            out.append(chr(int(code[i + 2 : i + 4], 16)))
            i += 4
        elif escape == "u":
            end = code.index("}", i)
            out.append(chr(int(code[i + 3 : end], 16)))
            i = end + 1
        elif escape in "\r\n":
            # A line continuation: the newline and the next line's leading whitespace vanish.
            i += 1
            while code[i] in " \t\r\n":
                i += 1
        else:
            raise ValueError(f"unknown Rust escape \\{escape}")
    return "".join(out), i + 1


# ---------------------------------------------------------------------------------------------
# The real loader
# ---------------------------------------------------------------------------------------------


def floodgate_bin() -> Path:
    path = Path(os.environ.get("FLOODGATE_BIN") or REPO / "target" / "debug" / "floodgate")
    if not path.is_file():
        pytest.fail(f"no floodgate binary at {path}: run `cargo build` first (or set FLOODGATE_BIN)")
    return path


@dataclass(frozen=True)
class CheckResult:
    file: str
    code: int
    output: str

    @property
    def loaded(self) -> bool:
        return self.code == 0 and "no errors" in self.output

    @property
    def refused(self) -> bool:
        """Exit 1 with an error naming the file: a refusal, not a crash or a missing binary."""
        return self.code == 1 and f"{self.file}:" in self.output


def check_config(name: str, text: str) -> CheckResult:
    """Runs `floodgate check-config` on a directory holding only this file. Exit 0: loaded;
    1: refused with errors; anything else is a crash."""
    with tempfile.TemporaryDirectory(prefix="floodgate-schema-") as directory:
        (Path(directory) / name).write_text(text, encoding="utf-8")
        done = subprocess.run(
            [str(floodgate_bin()), "check-config", directory],
            capture_output=True,
            text=True,
            timeout=60,
        )
    return CheckResult(name, done.returncode, done.stdout + done.stderr)


def schema_errors(text: str, schema: dict[str, Any] | None = None) -> list[str]:
    """The schema's complaints about a rule file's text, or why it is not YAML at all (an
    editor shows that too). Empty: the schema accepts the file."""
    try:
        document = parse(text)
    except (yaml.YAMLError, RecursionError) as error:
        return [f"not YAML the schema can check: {error}"]
    errors = validator(schema).iter_errors(document)
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}" for e in errors]
