"""Small rule files on the edges of the format, each named after what it shows.

REFUSED: the loader refuses each for a reason the schema can see, so the schema refuses it too.
ACCEPTED: the loader loads each, though it sits on an edge, so the schema accepts it too.
LOADER_ONLY: the loader refuses each for a reason no JSON Schema can see (the schema's
`$comment` lists them); the schema accepts them, and the tests pin that down so that closing a
gap, or opening a new one, is a visible change.
"""

from __future__ import annotations

import textwrap


def descriptor(body: str) -> str:
    """A file of domain `d` whose one top-level descriptor is `body` (a YAML map, unindented)."""
    return "domain: d\ndescriptors:\n  - " + textwrap.indent(textwrap.dedent(body).strip(), "    ")[4:] + "\n"


def limit(body: str) -> str:
    """A file whose one descriptor `k` has `body` as its rate_limit map."""
    return descriptor("key: k\nrate_limit:\n" + textwrap.indent(textwrap.dedent(body).strip(), "  "))


def listed(body: str) -> str:
    """A file whose one descriptor `k` has `body` as the one element of its rate_limits."""
    element = textwrap.indent(textwrap.dedent(body).strip(), "    ")
    return descriptor("key: k\nrate_limits:\n  - " + element[4:])


PER_SECOND = "unit: second\nrequests_per_unit: 10"

REFUSED: dict[str, str] = {
    # The file
    "empty_file": "# only a comment\n",
    "file_is_a_list": "- domain: d\n",
    "unknown_top_level_key": "domain: d\nversion: 2\n",
    "missing_domain": "descriptors: []\n",
    "empty_domain": 'domain: ""\n',
    "null_domain": "domain:\n",
    "domain_is_a_list": "domain: [a]\n",
    "descriptors_is_a_map": "domain: d\ndescriptors:\n  key: k\n",
    # A descriptor
    "descriptor_is_a_string": "domain: d\ndescriptors:\n  - k\n",
    "descriptor_without_key": descriptor("value: v"),
    "empty_key": descriptor('key: ""'),
    "null_key": descriptor("key:\nvalue: v"),
    "key_is_a_map": descriptor("key: {a: b}"),
    "value_is_a_list": descriptor("key: k\nvalue: [a, b]"),
    "unknown_descriptor_key": descriptor("key: k\nlimit: 10"),
    "merge_key_is_an_unknown_key": (
        "domain: d\ndescriptors:\n  - &base\n    key: a\n"
        "    rate_limit: {unit: second, requests_per_unit: 1}\n  - <<: *base\n    key: b\n"
    ),
    "shadow_mode_is_a_number": descriptor("key: k\nshadow_mode: 1\nrate_limit: {unit: second, requests_per_unit: 1}"),
    "shadow_mode_is_a_word": descriptor("key: k\nshadow_mode: maybe"),
    "nested_descriptor_unknown_key": descriptor("key: k\ndescriptors:\n  - key: j\n    rate: 1"),
    "metadata_is_a_list": descriptor("key: k\nmetadata: [a]"),
    "metadata_is_null": descriptor("key: k\nmetadata:"),
    "share_threshold_on_an_exact_value": descriptor(
        "key: k\nvalue: exact\nshare_threshold: true\nrate_limit: {unit: second, requests_per_unit: 1}"
    ),
    "share_threshold_on_a_key_only_default": descriptor(
        "key: k\nshare_threshold: yes\nrate_limit: {unit: second, requests_per_unit: 1}"
    ),
    "on_backend_error_unknown_policy": descriptor(
        "key: k\non_backend_error: retry\nrate_limit: {unit: second, requests_per_unit: 1}"
    ),
    "on_backend_error_in_capitals": descriptor(
        "key: k\non_backend_error: LOCAL\nrate_limit: {unit: second, requests_per_unit: 1}"
    ),
    "on_backend_error_without_a_limit": descriptor("key: k\non_backend_error: fail_open"),
    # rate_limit and rate_limits
    "rate_limit_is_a_list": descriptor("key: k\nrate_limit: [{unit: second, requests_per_unit: 1}]"),
    "rate_limit_is_null": descriptor("key: k\nrate_limit:"),
    "rate_limit_and_rate_limits_together": descriptor(
        "key: k\nrate_limit: {unit: second, requests_per_unit: 1}\n"
        "rate_limits:\n  - {unit: minute, requests_per_unit: 10}"
    ),
    "empty_rate_limits": descriptor("key: k\nrate_limits: []"),
    "null_rate_limits": descriptor("key: k\nrate_limits:"),
    "rate_limits_is_a_map": descriptor("key: k\nrate_limits: {unit: second, requests_per_unit: 1}"),
    "unknown_rate_limit_key": limit(f"{PER_SECOND}\nper: second"),
    "unknown_rate_limits_element_key": listed(f"{PER_SECOND}\nlimit: 3"),
    "unlimited_in_a_rate_limits_element": listed("unlimited: true"),
    "missing_unit": limit("requests_per_unit: 10"),
    "unknown_unit": limit("unit: fortnight\nrequests_per_unit: 10"),
    "unit_is_a_number": limit("unit: 1\nrequests_per_unit: 10"),
    "null_unit": limit("unit:\nrequests_per_unit: 10"),
    "missing_requests_per_unit": limit("unit: second"),
    "negative_requests_per_unit": limit("unit: second\nrequests_per_unit: -1"),
    "requests_per_unit_above_u32": limit("unit: second\nrequests_per_unit: 4294967296"),
    "requests_per_unit_quoted": limit('unit: second\nrequests_per_unit: "10"'),
    "requests_per_unit_a_word": limit("unit: second\nrequests_per_unit: ten"),
    "requests_per_unit_a_fraction": limit("unit: second\nrequests_per_unit: 1.5"),
    "missing_requests_per_unit_in_a_list": listed("unit: second"),
    "unlimited_with_unit": limit("unlimited: true\nunit: second"),
    "unlimited_with_requests_per_unit": limit("unlimited: true\nrequests_per_unit: 10"),
    "unlimited_with_algorithm": limit("unlimited: true\nalgorithm: gcra"),
    "unlimited_with_overshoot": limit("unlimited: on\novershoot: false"),
    "unlimited_is_a_word": limit("unlimited: maybe"),
    "unlimited_false_without_unit": limit("unlimited: false\nrequests_per_unit: 10"),
    "name_is_a_map": limit(f"{PER_SECOND}\nname: {{a: b}}"),
    # floodgate's extensions
    "unknown_algorithm": limit(f"{PER_SECOND}\nalgorithm: leaky_bucket"),
    "algorithm_in_other_case": limit(f"{PER_SECOND}\nalgorithm: Token_Bucket"),
    "burst_zero": limit(f"{PER_SECOND}\nalgorithm: token_bucket\nburst: 0"),
    "burst_without_algorithm": limit(f"{PER_SECOND}\nburst: 20"),
    "burst_with_fixed_window": limit(f"{PER_SECOND}\nalgorithm: fixed_window\nburst: 20"),
    "burst_with_sliding_window": listed(f"{PER_SECOND}\nalgorithm: sliding_window\nburst: 20"),
    "unit_multiplier_zero": limit(f"{PER_SECOND}\nunit_multiplier: 0"),
    "unit_multiplier_quoted": limit(f"{PER_SECOND}\nunit_multiplier: '5'"),
    "window_of_101_years": limit("unit: year\nrequests_per_unit: 1\nunit_multiplier: 101"),
    "window_just_past_100_years_in_seconds": limit("unit: second\nrequests_per_unit: 1\nunit_multiplier: 3153600001"),
    "window_just_past_100_years_in_weeks": limit("unit: WEEK\nrequests_per_unit: 1\nunit_multiplier: 5215"),
    "window_just_past_100_years_in_months": listed("unit: month\nrequests_per_unit: 1\nunit_multiplier: 1217"),
    "timezone_with_sliding_window": limit("unit: day\nrequests_per_unit: 1\ntimezone: UTC\nalgorithm: sliding_window"),
    "timezone_with_unit_hour": limit("unit: hour\nrequests_per_unit: 1\ntimezone: Europe/Paris"),
    "timezone_with_unit_multiplier_2": limit("unit: day\nrequests_per_unit: 1\ntimezone: UTC\nunit_multiplier: 2"),
    "timezone_empty": limit("unit: day\nrequests_per_unit: 1\ntimezone: ''"),
    "timezone_null": listed("unit: day\nrequests_per_unit: 1\ntimezone:"),
    "overshoot_is_a_word": limit(f"{PER_SECOND}\novershoot: always"),
    "lease_is_a_word": limit(f"{PER_SECOND}\nlease: always"),
    "lease_with_sliding_log": limit(f"{PER_SECOND}\nalgorithm: sliding_log\nlease: true"),
    "lease_with_sliding_window": listed(f"{PER_SECOND}\nalgorithm: sliding_window\nlease: yes"),
    "lease_with_gcra": limit(f"{PER_SECOND}\nalgorithm: gcra\nlease: on"),
    "lease_with_overshoot": limit(f"{PER_SECOND}\novershoot: true\nlease: true"),
    "unlimited_with_lease": limit("unlimited: true\nlease: false"),
    # replaces
    "replaces_is_a_map": limit(f"{PER_SECOND}\nreplaces: {{name: other}}"),
    "replaces_entry_without_name": limit(f"{PER_SECOND}\nreplaces:\n  - {{}}"),
    "replaces_entry_with_empty_name": limit(f"{PER_SECOND}\nreplaces:\n  - name: ''"),
    "replaces_entry_with_null_name": limit(f"{PER_SECOND}\nreplaces:\n  - name:"),
    "replaces_entry_unknown_key": listed(f"{PER_SECOND}\nreplaces:\n  - name: other\n    domain: d"),
}

ACCEPTED: dict[str, str] = {
    "domain_alone": "domain: d\n",
    "null_descriptors": "domain: d\ndescriptors:\n",
    "empty_descriptors": "domain: d\ndescriptors: []\n",
    "numeric_domain_key_and_value": (
        "domain: 42\ndescriptors:\n  - key: 1\n    value: 200\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
    ),
    "boolean_and_dotted_values": descriptor("key: k\nvalue: true\ndescriptors:\n  - key: ip\n    value: 10.0.0.1"),
    "date_like_value_is_text": descriptor("key: day\nvalue: 2024-01-01\nrate_limit: {unit: day, requests_per_unit: 1}"),
    "null_value_is_the_key_only_default": descriptor(
        "key: k\nvalue:\nrate_limit: {unit: second, requests_per_unit: 1}"
    ),
    "whitelist": descriptor("key: k\nvalue: trusted"),
    "units_in_any_case": descriptor(
        "key: k\nrate_limits:\n  - {unit: SECOND, requests_per_unit: 1}\n  - {unit: Minute, requests_per_unit: 2}\n"
        "  - {unit: hOuR, requests_per_unit: 3}\n  - {unit: week, requests_per_unit: 4}"
    ),
    "yaml_1_1_booleans": descriptor(
        "key: k\nvalue: a*\nshadow_mode: yes\nquota_mode: Off\ndetailed_metric: ON\nvalue_to_metric: n\n"
        "share_threshold: Y\nrate_limit: {unit: second, requests_per_unit: 1, overshoot: NO}"
    ),
    "requests_per_unit_bounds": descriptor(
        "key: k\nrate_limits:\n  - {unit: second, requests_per_unit: 0}\n  - {unit: day, requests_per_unit: 4294967295}"
    ),
    "leading_zero_integer_is_decimal": limit("unit: second\nrequests_per_unit: 010"),
    "unlimited_with_name_and_replaces": limit("unlimited: true\nname: vip\nreplaces:\n  - name: per_user"),
    "unlimited_false_counts": limit(f"unlimited: false\n{PER_SECOND}"),
    "empty_name_is_unnamed": limit(f"{PER_SECOND}\nname:"),
    "null_replaces": limit(f"{PER_SECOND}\nreplaces:"),
    "token_bucket_and_gcra_with_burst": descriptor(
        "key: k\nrate_limits:\n  - {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 20}\n"
        "  - {unit: minute, requests_per_unit: 100, algorithm: gcra, burst: 1}"
    ),
    "every_algorithm": descriptor(
        "key: k\nrate_limits:\n"
        + "".join(
            f"  - {{unit: second, requests_per_unit: {n}, algorithm: {a}}}\n"
            for n, a in enumerate(["fixed_window", "sliding_window", "sliding_log", "token_bucket", "gcra"], 1)
        ).rstrip()
    ),
    "windows_of_exactly_100_years": descriptor(
        "key: k\nrate_limits:\n"
        "  - {unit: second, requests_per_unit: 1, unit_multiplier: 3153600000}\n"
        "  - {unit: minute, requests_per_unit: 1, unit_multiplier: 52560000}\n"
        "  - {unit: hour, requests_per_unit: 1, unit_multiplier: 876000}\n"
        "  - {unit: day, requests_per_unit: 1, unit_multiplier: 36500}\n"
        "  - {unit: week, requests_per_unit: 1, unit_multiplier: 5214}\n"
        "  - {unit: month, requests_per_unit: 1, unit_multiplier: 1216}\n"
        "  - {unit: Year, requests_per_unit: 1, unit_multiplier: 100}"
    ),
    "timezone_on_calendar_units": descriptor(
        "key: k\nrate_limits:\n"
        "  - {unit: DAY, requests_per_unit: 1, timezone: Europe/Paris, algorithm: fixed_window, unit_multiplier: 1}\n"
        "  - {unit: week, requests_per_unit: 2, timezone: America/New_York}\n"
        "  - {unit: month, requests_per_unit: 3, timezone: Asia/Tokyo}\n"
        "  - {unit: year, requests_per_unit: 4, timezone: UTC}"
    ),
    "overshoot_on_counting_algorithms": descriptor(
        "key: k\nrate_limits:\n"
        "  - {unit: second, requests_per_unit: 1, overshoot: true, algorithm: gcra}\n"
        "  - {unit: minute, requests_per_unit: 2, overshoot: true}\n"
        "  - {unit: hour, requests_per_unit: 3, overshoot: true, algorithm: sliding_log}\n"
        "  - {unit: day, requests_per_unit: 4, overshoot: false, algorithm: sliding_window}"
    ),
    "lease_on_fixed_window_and_token_bucket": descriptor(
        "key: k\nrate_limits:\n"
        "  - {unit: second, requests_per_unit: 1, lease: true}\n"
        "  - {unit: minute, requests_per_unit: 2, lease: yes, algorithm: fixed_window, overshoot: false}\n"
        "  - {unit: hour, requests_per_unit: 3, lease: true, algorithm: token_bucket, burst: 5}\n"
        "  - {unit: day, requests_per_unit: 4, lease: false, algorithm: sliding_log}"
    ),
    "share_threshold_false_anywhere": descriptor("key: k\nshare_threshold: false"),
    "share_threshold_on_a_wildcard": descriptor(
        "key: k\nvalue: '*.example.com'\nshare_threshold: true\nrate_limit: {unit: second, requests_per_unit: 1}"
    ),
    "every_backend_policy": "domain: d\ndescriptors:\n"
    + "".join(
        f"  - key: {p}\n    on_backend_error: {p}\n    rate_limits: [{{unit: second, requests_per_unit: 1}}]\n"
        for p in ["error", "fail_open", "fail_closed", "local"]
    ),
    "metadata_of_any_shape": descriptor(
        "key: k\nmetadata:\n  plan: free\n  3: three\n  weights: [1, 2.5, true, null]\n  nested: {a: {b: c}}\n"
        "rate_limit: {unit: second, requests_per_unit: 1}"
    ),
    "replaces_across_rules": "domain: d\ndescriptors:\n"
    "  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, name: per_a}\n"
    "  - key: b\n    rate_limits:\n"
    "      - {unit: second, requests_per_unit: 5, name: per_b, replaces: [{name: per_a}]}\n",
    "three_levels_deep": descriptor(
        "key: a\ndescriptors:\n  - key: b\n    value: x\n    descriptors:\n      - key: c\n"
        "        rate_limit: {unit: second, requests_per_unit: 1}"
    ),
    "schema_modeline_and_comments": "# yaml-language-server: $schema=../schemas/rules.schema.json\n"
    "domain: d  # the domain\ndescriptors:\n  # a rule\n  - key: k\n",
}

LOADER_ONLY: dict[str, str] = {
    "duplicate_map_key": descriptor("key: k\nkey: j"),
    "duplicate_descriptor": "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
    "two_descriptors_with_one_rule_id": "domain: d\ndescriptors:\n  - key: a\n    value: b\n  - key: a_b\n",
    "replaces_its_own_limit": limit(f"{PER_SECOND}\nname: mine\nreplaces:\n  - name: mine"),
    "quoted_yes_for_a_boolean": descriptor("key: k\nshadow_mode: 'yes'"),
    "integer_written_as_a_float": limit("unit: second\nrequests_per_unit: 10.0"),
    "timezone_not_in_the_database": limit("unit: day\nrequests_per_unit: 1\ntimezone: Mars/Olympus_Mons"),
    "bucket_refilling_for_over_100_years": limit(
        "unit: year\nrequests_per_unit: 1\nalgorithm: token_bucket\nburst: 101"
    ),
}
