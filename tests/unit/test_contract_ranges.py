"""Ranges are defined once, in `agenttx.contracts`, and every schema file carries exactly
them: each CRD in crds/, the chart's copy of it (charts/agenttx/files/crds/), and the
chart's `values.schema.json` for the service's default policy. The prose that repeats a
range ("(0-16)" in a description or a values.yaml comment) must say the same.

A new resource joins by one row in CONTRACTS: its CRD file and, per field of its `spec`,
the schema keywords the `agenttx.contracts` module defines.
"""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

import pytest
import yaml

from agenttx.contracts.policy import (
    APPROVAL_MAX_APPROVERS,
    APPROVAL_MAX_REQUIREMENTS,
    APPROVAL_TIMEOUT_MAX_S,
    APPROVAL_TIMEOUT_MIN_S,
    DEPTH_MAX,
    DEPTH_MIN,
    FACTOR_MAX,
    FACTOR_MIN,
)
from agenttx.contracts.toolsets import (
    DEFAULT_TIMEOUT_S,
    PREFIX_PATTERN,
    TIMEOUT_MAX_S,
    TIMEOUT_MIN_S,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRD_DIRS = (ROOT / "crds", ROOT / "charts" / "agenttx" / "files" / "crds")
VALUES_SCHEMA = ROOT / "charts" / "agenttx" / "values.schema.json"
VALUES = ROOT / "charts" / "agenttx" / "values.yaml"

DEPTH = {"type": "integer", "minimum": DEPTH_MIN, "maximum": DEPTH_MAX}
FACTOR = {"type": "number", "minimum": FACTOR_MIN, "maximum": FACTOR_MAX}
POLICY_ROLLBACK = {"maxLocalDepth": DEPTH, "maxGlobalResets": DEPTH,
                   "replayBudgetFactor": FACTOR}
POLICY_APPROVAL = {"timeoutSeconds": {"type": "integer", "minimum": APPROVAL_TIMEOUT_MIN_S,
                                      "maximum": APPROVAL_TIMEOUT_MAX_S},
                   "required": {"type": "array", "maxItems": APPROVAL_MAX_REQUIREMENTS},
                   "approvers": {"type": "array", "maxItems": APPROVAL_MAX_APPROVERS}}

# (CRD file name, {dotted path under spec: the schema keywords it must carry}).
CONTRACTS: list[tuple[str, dict[str, dict[str, Any]]]] = [
    ("agenttxpolicies.agenttx.io.yaml",
     {f"rollback.{name}": rule for name, rule in POLICY_ROLLBACK.items()}
     | {f"approval.{name}": rule for name, rule in POLICY_APPROVAL.items()}),
    ("agenttxtoolsets.agenttx.io.yaml",
     {"upstream.timeoutSeconds": {"minimum": TIMEOUT_MIN_S, "maximum": TIMEOUT_MAX_S,
                                  "default": DEFAULT_TIMEOUT_S},
      "prefix": {"type": "string", "pattern": PREFIX_PATTERN}}),
]

RANGE_IN_PROSE = re.compile(r"\((-?[0-9.]+)\s*[-–]\s*(-?[0-9.]+)\)")


def spec_property(crd: dict[str, Any], dotted: str) -> dict[str, Any]:
    (version,) = crd["spec"]["versions"]
    node = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for part in dotted.split("."):
        node = node["properties"][part]
    return node


def prose_ranges(text: str) -> list[tuple[float, float]]:
    return [(float(a), float(b)) for a, b in RANGE_IN_PROSE.findall(text)]


def assert_carries(node: dict[str, Any], rule: dict[str, Any], where: str) -> None:
    assert {k: node.get(k) for k in rule} == rule, where
    if "minimum" in rule and "maximum" in rule:
        for found in prose_ranges(node.get("description", "")):
            assert found == (rule["minimum"], rule["maximum"]), \
                f"{where}: its description says {found}"


@pytest.mark.parametrize("crd_dir", CRD_DIRS, ids=lambda d: str(d.relative_to(ROOT)))
@pytest.mark.parametrize("crd_file, fields", CONTRACTS, ids=[c[0] for c in CONTRACTS])
def test_each_crd_and_the_charts_copy_carry_the_contract_ranges(
        crd_dir: pathlib.Path, crd_file: str, fields: dict[str, dict[str, Any]]) -> None:
    crd = yaml.safe_load((crd_dir / crd_file).read_text())
    for dotted, rule in fields.items():
        assert_carries(spec_property(crd, dotted), rule,
                       f"{crd_dir.relative_to(ROOT)}/{crd_file}: spec.{dotted}")


def test_values_schema_bounds_the_default_policy_by_the_contract_ranges() -> None:
    schema = json.loads(VALUES_SCHEMA.read_text())
    default_policy = schema["properties"]["service"]["properties"]["defaultPolicy"]
    assert set(default_policy["properties"]) == set(POLICY_ROLLBACK) | {"approval"}
    for name, rule in POLICY_ROLLBACK.items():
        assert_carries(default_policy["properties"][name], rule,
                       f"values.schema.json: service.defaultPolicy.{name}")
    approval = default_policy["properties"]["approval"]["properties"]
    for name, rule in POLICY_APPROVAL.items():
        assert_carries(approval[name], rule,
                       f"values.schema.json: service.defaultPolicy.approval.{name}")


def test_values_yaml_comments_state_the_contract_ranges() -> None:
    """The `# -- ... (0-16).` line above each default-policy value (helm-docs style)."""
    lines = VALUES.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "defaultPolicy:")
    seen = {}
    for i in range(start + 1, len(lines)):
        key, _, _ = lines[i].strip().partition(":")
        if key in POLICY_ROLLBACK:
            seen[key] = prose_ranges(lines[i - 1])
        elif lines[i].strip() and not lines[i].startswith("    "):
            break
    assert seen == {name: [(rule["minimum"], rule["maximum"])]
                    for name, rule in POLICY_ROLLBACK.items()}
