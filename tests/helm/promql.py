"""The metric names a PromQL expression reads, and the metric families a Prometheus text
scrape serves: enough to check that the chart's dashboard and alerts ask for series
floodgate really exposes.

The reader is lexical, not a full parser: it removes what cannot name a metric (strings,
label matchers, ranges, grouping label lists, numbers, Grafana variables) and takes every
remaining identifier that is not a keyword or followed by `(`. A call of anything but a known
PromQL function fails, so a misspelt function is reported rather than taken for a metric.
"""

from __future__ import annotations

import re

FUNCTIONS = frozenset(
    """
    abs absent absent_over_time acos acosh asin asinh atan atanh avg_over_time ceil changes
    clamp clamp_max clamp_min cos cosh count_over_time day_of_month day_of_week day_of_year
    days_in_month deg delta deriv double_exponential_smoothing exp floor histogram_avg
    histogram_count histogram_fraction histogram_quantile histogram_stddev histogram_stdvar
    histogram_sum holt_winters hour idelta increase info irate label_join label_replace
    last_over_time ln log10 log2 mad_over_time max_over_time min_over_time minute month pi
    predict_linear present_over_time quantile_over_time rad rate resets round scalar sgn sin
    sinh sort sort_by_label sort_by_label_desc sort_desc sqrt stddev_over_time
    stdvar_over_time sum_over_time tan tanh time timestamp vector year
    avg bottomk count count_values group limit_ratio limitk max min quantile stddev stdvar sum
    topk
    """.split()
)
KEYWORDS = frozenset("and or unless bool atan2 offset start end inf nan".split())
# Grafana's templating function for variable queries, not PromQL.
GRAFANA_FUNCTIONS = frozenset({"label_values"})

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GRAFANA_VARIABLES = re.compile(r"\$\{[^}]*\}|\$\w+")
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_LABEL_LISTS = re.compile(
    r"\b(?:by|without|on|ignoring)\b\s*\([^()]*\)|\b(?:group_left|group_right)\b(?:\s*\([^()]*\))?"
)
_OFFSETS = re.compile(r"\boffset\s+-?\w+")
_NUMBERS = re.compile(r"(?<![\w:])(?:0x[0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)")
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str, grafana: bool = False) -> set[str]:
    """The metrics `expr` selects; `grafana` also admits Grafana's label_values()."""
    text = _STRINGS.sub(" ", expr)
    text = _GRAFANA_VARIABLES.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _LABEL_LISTS.sub(" ", text)
    text = _OFFSETS.sub(" ", text)
    text = _NUMBERS.sub(" ", text)
    known = FUNCTIONS | (GRAFANA_FUNCTIONS if grafana else frozenset())
    names = set()
    for match in _IDENTIFIER.finditer(text):
        name = match.group()
        if name.lower() in KEYWORDS:
            continue
        if text[match.end():].lstrip().startswith("("):
            if name not in known:
                raise ValueError(f"{name}() is not a PromQL function, in {expr!r}")
        else:
            names.add(name)
    if grafana:
        # label_values(metric, label): the label is no metric.
        names -= set(re.findall(r"label_values\([^)]*,\s*(\w+)\s*\)", _STRINGS.sub(" ", expr)))
    return names


def scraped_families(text: str) -> dict[str, str]:
    """Metric family -> type from a Prometheus text scrape: every name in a HELP or TYPE line
    or on a sample (type "untyped" when no TYPE line names it)."""
    families: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            families[name] = kind.strip()
        elif line.startswith("# HELP "):
            families.setdefault(line.split(maxsplit=3)[2], "untyped")
        elif line and not line.startswith("#"):
            name = _IDENTIFIER.match(line)
            if name:
                families.setdefault(name.group(), "untyped")
    return families


def is_served(name: str, families: dict[str, str]) -> bool:
    """Whether `name` is a series of one of `families`: the family itself, or a histogram's
    _bucket/_sum/_count (a summary's _sum/_count)."""
    if name in families:
        return True
    for suffix, kinds in (("_bucket", {"histogram"}), ("_sum", {"histogram", "summary"}), ("_count", {"histogram", "summary"})):
        if name.endswith(suffix) and families.get(name[: -len(suffix)]) in kinds:
            return True
    return False
