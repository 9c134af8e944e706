"""schemas/rules.schema.json describes exactly the rule files floodgate's loader accepts, as
far as a JSON Schema can: every rule file in the repository validates, and on a table of edge
cases the schema and the real loader (`floodgate check-config`) give the same verdict.

Rule files come from examples/**/rules, benches/rules, the chart's `rules:` in
helm/floodgate/values.yaml, clients/*/test(s)/rules, tests/**/rules and the conformance
examples, which tests/conformance.rs keeps inline as Rust string literals: every literal whose
text starts with `domain:` is one rule file (schema_support.rust_string_literals decodes them).
YAML is read with the YAML 1.2 core schema, as the loader and editors read it.
"""

from __future__ import annotations

import re
from typing import Any, Iterator

import jsonschema
import pytest

from schema_cases import ACCEPTED, LOADER_ONLY, REFUSED
from schema_support import (
    CONFORMANCE_SOURCES,
    REPO,
    SCHEMA_PATH,
    RuleFile,
    check_config,
    conformance_rule_files,
    fuzz_regression_files,
    load_schema,
    repository_rule_files,
    rust_string_literals,
    schema_errors,
)

REPOSITORY_FILES = repository_rule_files()
FUZZ_FILES = fuzz_regression_files()


def by_name(files: list[RuleFile]) -> dict[str, Any]:
    return {"argvalues": files, "ids": [f.name for f in files]}


# ---------------------------------------------------------------------------------------------
# The schema document
# ---------------------------------------------------------------------------------------------


def test_schema_is_a_valid_draft_2020_12_schema() -> None:
    schema = load_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


def test_schema_names_itself() -> None:
    schema = load_schema()
    assert schema["$id"] and schema["title"] and schema["description"]


def declared_properties(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every property an object schema declares (a map of `properties` beside `type:
    object`), with its path; conditions' `properties` only constrain, and are left out."""
    if isinstance(node, dict):
        if node.get("type") == "object" and isinstance(node.get("properties"), dict):
            for name, subschema in node["properties"].items():
                yield f"{path}/properties/{name}", subschema
        for key, value in node.items():
            yield from declared_properties(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from declared_properties(value, f"{path}/{i}")


def test_every_property_has_a_one_line_description() -> None:
    schema = load_schema()
    properties = list(declared_properties(schema))
    assert len(properties) > 20
    for path, subschema in properties:
        description = subschema.get("description")
        if description is None and "$ref" in subschema:
            description = schema["$defs"][subschema["$ref"].removeprefix("#/$defs/")].get("description")
        assert description, f"{path} has no description"
        assert "\n" not in description, f"{path}: the description is more than one line"


def test_the_loader_keys_are_the_schema_keys() -> None:
    """The key lists the loader checks maps against (src/rules) are the schema's properties."""
    schema = load_schema()
    defs = schema["$defs"]

    def rust_keys(source: str, const: str) -> set[str]:
        code = (REPO / source).read_text(encoding="utf-8")
        body = re.search(rf"const {const}: \[&str; \d+\] = \[(.*?)\];", code, re.S)
        assert body, f"{const} not found in {source}"
        return set(re.findall(r'"(\w+)"', body.group(1)))

    assert rust_keys("src/rules/load.rs", "FILE_KEYS") == set(schema["properties"])
    assert rust_keys("src/rules/descriptor.rs", "DESCRIPTOR_KEYS") == set(defs["descriptor"]["properties"])
    limit_keys = rust_keys("src/rules/limits.rs", "RATE_LIMIT_KEYS")
    assert limit_keys == set(defs["rateLimit"]["properties"])
    assert limit_keys - {"unlimited"} == set(defs["listedLimit"]["properties"])


# ---------------------------------------------------------------------------------------------
# The repository's rule files
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["examples", "benches", "helm", "clients", "conformance"])
def test_every_kind_of_place_holds_rule_files(source: str) -> None:
    """A moved directory or a renamed constant must not quietly shrink what is checked."""
    assert any(f.source == source for f in REPOSITORY_FILES), f"no rule files found for {source}"


def test_every_conformance_example_is_extracted() -> None:
    """Each `const NAME: &str` that a conformance test starts a server with is one of the
    extracted rule files."""
    extracted = {f.name for f in conformance_rule_files()}
    for source in CONFORMANCE_SOURCES:
        code = (REPO / source).read_text(encoding="utf-8")
        used = set(re.findall(r'\("[\w.-]+\.ya?ml",\s*([A-Z][A-Z0-9_]*)\)', code))
        assert used, f"{source}: no rule constants found"
        for name in used:
            at = re.search(rf"^const {name}: &str = ", code, re.M)
            assert at, f"{source}: const {name} not found"
            line = code.count("\n", 0, at.start()) + 1
            assert f"{source}:{line}" in extracted, f"{source}: {name} (line {line}) was not extracted"


def test_rust_literals_are_decoded_as_rustc_does() -> None:
    code = (
        'let a = \'"\'; // "not a literal"\n'
        '/* "nor this" */ const A: &str = "domain: a\\n  \\"q\\" \\x41\\u{263A}\\\n     next";\n'
        'fn f<\'a>(x: &\'a str) {} const B: &str = r#"domain: "b"\n"#;\n'
    )
    assert rust_string_literals(code) == [(2, 'domain: a\n  "q" A\u263anext'), (4, 'domain: "b"\n')]


MODELINE = re.compile(r"^# yaml-language-server: \$schema=(\S+)$", re.M)


@pytest.mark.parametrize("rule_file", **by_name([f for f in REPOSITORY_FILES if (REPO / f.name).is_file()]))
def test_a_modeline_points_at_the_schema(rule_file: RuleFile) -> None:
    """The example rule files name the schema for editors (docs/rules.md, "Editor
    validation"); any rule file that names it names the published file."""
    modelines = MODELINE.findall(rule_file.text)
    if rule_file.source == "examples":
        assert modelines, f"{rule_file.name} has no `# yaml-language-server: $schema=` line"
    for target in modelines:
        assert ((REPO / rule_file.name).parent / target).resolve() == SCHEMA_PATH, target


@pytest.mark.parametrize("rule_file", **by_name(REPOSITORY_FILES))
def test_repository_rule_file_validates(rule_file: RuleFile) -> None:
    assert schema_errors(rule_file.text) == []


@pytest.mark.parametrize("rule_file", **by_name(REPOSITORY_FILES))
def test_repository_rule_file_loads(rule_file: RuleFile) -> None:
    result = check_config("rules.yaml", rule_file.text)
    assert result.loaded, result.output


@pytest.mark.parametrize("rule_file", **by_name(FUZZ_FILES))
def test_fuzz_regression_is_refused_by_both(rule_file: RuleFile) -> None:
    assert schema_errors(rule_file.text) != []
    result = check_config("rules.yaml", rule_file.text)
    assert result.refused, result.output


# ---------------------------------------------------------------------------------------------
# The schema and the loader agree
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", REFUSED)
def test_schema_refuses_what_the_loader_refuses(name: str) -> None:
    text = REFUSED[name]
    assert schema_errors(text) != [], f"the schema accepts:\n{text}"
    result = check_config(f"{name}.yaml", text)
    assert result.refused, f"check-config exit {result.code}, a refusal expected:\n{result.output}\n{text}"


@pytest.mark.parametrize("name", ACCEPTED)
def test_schema_accepts_what_the_loader_accepts(name: str) -> None:
    text = ACCEPTED[name]
    assert schema_errors(text) == [], text
    result = check_config(f"{name}.yaml", text)
    assert result.loaded, f"{result.output}\n{text}"


@pytest.mark.parametrize("name", LOADER_ONLY)
def test_what_only_the_loader_can_refuse(name: str) -> None:
    """Cross-field and cross-file checks no JSON Schema can make: the schema lets these pass
    (its `$comment` says so) and check-config refuses them."""
    text = LOADER_ONLY[name]
    assert schema_errors(text) == [], text
    result = check_config(f"{name}.yaml", text)
    assert result.refused, f"check-config exit {result.code}, a refusal expected:\n{result.output}\n{text}"
