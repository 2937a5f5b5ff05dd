"""The AgentTxPolicy CRD: well-formed, structural, same ranges as the API, and every
example under examples/policies/ accepted or rejected as its comment says.

The CRD's openAPIV3Schema is checked with `jsonschema` (OpenAPI v3 structural schemas
are a JSON-Schema subset; the x-kubernetes-* keywords are ignored) plus the one
API-server behaviour JSON Schema cannot express here: strict field validation (kubectl's
default since 1.27) rejects fields the schema does not declare.
"""

from __future__ import annotations

import pathlib
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from agenttx.contracts import policy as engine_policy
from agenttx_operator import conditions, policy_spec, sandboxes

ROOT = pathlib.Path(__file__).resolve().parents[3]
CRD_PATH = ROOT / "crds" / "agenttxpolicies.agenttx.io.yaml"
EXAMPLES = sorted((ROOT / "examples" / "policies").glob("*.yaml"))
VALID = [p for p in EXAMPLES if not p.name.startswith("invalid-")]
INVALID = [p for p in EXAMPLES if p.name.startswith("invalid-")]


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_PATH.read_text())


@pytest.fixture(scope="module")
def schema(crd: dict[str, Any]) -> dict[str, Any]:
    (version,) = crd["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


def unknown_fields(instance: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields the structural schema does not declare (strict field validation)."""
    if isinstance(instance, dict) and schema.get("type") == "object":
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        if props is None:
            if isinstance(extra, dict):
                return [e for k, v in instance.items()
                        for e in unknown_fields(v, extra, f"{path}.{k}")]
            return []  # free-form (e.g. metadata, validated by the API server itself)
        out = [f"{path}.{k}" for k in instance if k not in props]
        for k, v in instance.items():
            if k in props:
                out += unknown_fields(v, props[k], f"{path}.{k}")
        return out
    if isinstance(instance, list) and isinstance(schema.get("items"), dict):
        return [e for i, v in enumerate(instance)
                for e in unknown_fields(v, schema["items"], f"{path}[{i}]")]
    return []


def schema_errors(doc: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(schema)
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in validator.iter_errors(doc)]
    errors += [f"{p}: unknown field" for p in unknown_fields(doc, schema)]
    return errors


def test_crd_is_a_valid_apiextensions_v1_object(crd: dict[str, Any]) -> None:
    kubernetes_validate.validate(crd, kubernetes_validate.latest_version(), strict=True)


def test_crd_identity(crd: dict[str, Any]) -> None:
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "agenttxpolicies.agenttx.io"
    assert spec["group"] == policy_spec.GROUP and spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == "AgentTxPolicy"
    assert spec["names"]["plural"] == policy_spec.PLURAL
    assert "atp" in spec["names"]["shortNames"]
    (version,) = spec["versions"]
    assert version["name"] == policy_spec.VERSION
    assert version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}


def _walk(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, schema)]
    for k, v in (schema.get("properties") or {}).items():
        out += _walk(v, f"{path}.{k}")
    if isinstance(schema.get("items"), dict):
        out += _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        out += _walk(schema["additionalProperties"], f"{path}{{}}")
    return out


def test_schema_is_structural(schema: dict[str, Any]) -> None:
    for path, node in _walk(schema):
        assert "type" in node, f"{path or '<root>'} has no type"
        assert not ("properties" in node and "additionalProperties" in node), path


def test_schema_ranges_are_the_api_ranges(schema: dict[str, Any]) -> None:
    rb = schema["properties"]["spec"]["properties"]["rollback"]["properties"]
    for field in ("maxLocalDepth", "maxGlobalResets"):
        assert rb[field]["type"] == "integer"
        assert (rb[field]["minimum"], rb[field]["maximum"]) == (
            engine_policy.DEPTH_MIN, engine_policy.DEPTH_MAX)
    f = rb["replayBudgetFactor"]
    assert (f["minimum"], f["maximum"]) == (engine_policy.FACTOR_MIN, engine_policy.FACTOR_MAX)
    sel = schema["properties"]["spec"]["properties"]["selector"]["properties"]
    assert sel["agentIdPrefix"]["maxLength"] == policy_spec.AGENT_ID_PREFIX_MAX_BYTES
    assert sel["matchMetadata"]["maxProperties"] == policy_spec.MATCH_METADATA_MAX
    sandbox = schema["properties"]["spec"]["properties"]["sandbox"]["properties"]
    assert sandbox["reclaimPolicy"]["enum"] == list(sandboxes.RECLAIM_POLICIES)
    assert sandbox["reclaimPolicy"]["default"] == "Delete"
    assert sandbox["accessModes"]["items"]["enum"] == list(sandboxes.ACCESS_MODES)
    assert sandbox["size"]["pattern"] == sandboxes.QUANTITY_RE.pattern
    approval = schema["properties"]["spec"]["properties"]["approval"]["properties"]
    assert (approval["timeoutSeconds"]["minimum"], approval["timeoutSeconds"]["maximum"]) == (
        engine_policy.APPROVAL_TIMEOUT_MIN_S, engine_policy.APPROVAL_TIMEOUT_MAX_S)
    assert approval["required"]["maxItems"] == engine_policy.APPROVAL_MAX_REQUIREMENTS
    requirement = approval["required"]["items"]
    assert set(requirement["properties"]) == set(engine_policy.REQUIREMENT_KINDS)
    assert requirement["minProperties"] == requirement["maxProperties"] == 1
    for kind in engine_policy.REQUIREMENT_KINDS:
        assert requirement["properties"][kind]["maxLength"] == \
            engine_policy.APPROVAL_PATTERN_MAX_CHARS
    assert approval["approvers"]["maxItems"] == engine_policy.APPROVAL_MAX_APPROVERS
    assert approval["approvers"]["items"]["maxLength"] == \
        engine_policy.APPROVAL_PRINCIPAL_MAX_CHARS
    assert approval["notifyChannel"]["maxLength"] == engine_policy.APPROVAL_PATTERN_MAX_CHARS
    # no CRD default: an unset timeout shows the default policy's through
    assert "default" not in approval["timeoutSeconds"]


def test_status_declares_what_the_operator_writes(schema: dict[str, Any]) -> None:
    status = conditions.build_status(None, generation=1, reason=conditions.REASON_PUBLISHED,
                                    message="ok", sandbox_claim="ns/c",
                                    now="2030-01-01T00:00:00Z",
                                    claim_sync=conditions.ClaimSync(
                                        False, conditions.REASON_RESIZE_REFUSED, "refused"))
    assert len(status["conditions"]) == 2
    doc = {"apiVersion": "agenttx.io/v1alpha1", "kind": "AgentTxPolicy",
           "metadata": {"name": "x"}, "spec": {}, "status": status}
    assert schema_errors(doc, schema) == []


def test_printer_columns(crd: dict[str, Any], schema: dict[str, Any]) -> None:
    (version,) = crd["spec"]["versions"]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert list(columns)[:8] == ["Priority", "Selector", "Depth", "Resets", "Budget",
                                 "Approval Tools", "Approval Channels", "Ready"]
    assert "Age" in columns
    assert columns["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Approval Tools"]["jsonPath"] == ".spec.approval.required[*].tool"
    assert columns["Approval Channels"]["jsonPath"] == ".spec.approval.required[*].channel"
    for c in columns.values():
        if c["name"] in ("Ready", "Reason", "Age"):
            continue
        node = schema
        for part in c["jsonPath"].lstrip(".").split("."):
            name, _, wildcard = part.partition("[*]")
            node = node["properties"][name]
            if part.endswith("[*]"):
                node = node["items"]
        assert node["type"] == c["type"], c


def test_there_are_valid_and_invalid_examples() -> None:
    assert len(VALID) >= 3 and len(INVALID) >= 5
    for path in EXAMPLES:
        first = path.read_text().splitlines()[0]
        assert first.startswith("# "), f"{path.name} must start with a comment saying why"
        if path in INVALID:
            assert first.startswith("# INVALID"), path.name


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_valid_example_is_accepted(path: pathlib.Path, schema: dict[str, Any]) -> None:
    doc = yaml.safe_load(path.read_text())
    assert schema_errors(doc, schema) == []
    assert policy_spec.validate_spec(doc["spec"]) == []


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_example_is_rejected_by_the_schema(path: pathlib.Path,
                                                   schema: dict[str, Any]) -> None:
    doc = yaml.safe_load(path.read_text())
    assert schema_errors(doc, schema), f"{path.name} passed the CRD schema"
    # ...and by the operator, for clusters where the schema was bypassed.
    assert policy_spec.validate_spec(doc["spec"]), f"{path.name} passed the operator"


def test_max_local_depth_17_is_rejected_at_the_field(schema: dict[str, Any]) -> None:
    doc = yaml.safe_load((ROOT / "examples/policies/invalid-max-local-depth.yaml").read_text())
    errors = schema_errors(doc, schema)
    assert errors == ["spec.rollback.maxLocalDepth: 17 is greater than the maximum of 16"]
