"""The CRDs (AgentTxPolicy, AgentTxToolset): well-formed, structural, the same ranges
and patterns as agenttx.contracts, and every example under examples/policies/ and
examples/toolsets/ accepted or rejected as its comment says.

The CRD's openAPIV3Schema is checked with `jsonschema` (OpenAPI v3 structural schemas
are a JSON-Schema subset; the x-kubernetes-* keywords are ignored) plus what the API
server adds that JSON Schema cannot express here: strict field validation (kubectl's
default since 1.27) rejects fields the schema does not declare, `x-kubernetes-list-type:
map` refuses two items with the same keys, and `x-kubernetes-validations` rules (CEL,
evaluated with the `cel` bindings of the reference Rust implementation) must hold.
"""

from __future__ import annotations

import pathlib
from typing import Any

import cel
import jsonschema
import kubernetes_validate
import pytest
import yaml

from agenttx.contracts import policy as engine_policy
from agenttx.contracts import toolsets as contract
from agenttx_operator import conditions, policy_spec, sandboxes, toolset_spec, toolset_status

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


# ---- AgentTxToolset ---------------------------------------------------------------------

TOOLSET_CRD_PATH = ROOT / "crds" / "agenttxtoolsets.agenttx.io.yaml"
TOOLSET_EXAMPLES = sorted((ROOT / "examples" / "toolsets").glob("*.yaml"))
TOOLSETS_VALID = [p for p in TOOLSET_EXAMPLES
                  if [d.get("kind") for d in yaml.safe_load_all(p.read_text())]
                  == ["AgentTxToolset"]]
TOOLSETS_INVALID = sorted((ROOT / "examples" / "toolsets" / "invalid").glob("*.yaml"))


@pytest.fixture(scope="module")
def toolset_crd() -> dict[str, Any]:
    return yaml.safe_load(TOOLSET_CRD_PATH.read_text())


@pytest.fixture(scope="module")
def toolset_schema(toolset_crd: dict[str, Any]) -> dict[str, Any]:
    (version,) = toolset_crd["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


def api_server_errors(instance: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """What the API server checks beyond the JSON Schema: list-map keys unique, and the
    CEL rules of every node the instance reaches (a rule sees the node's value as
    `self`)."""
    errors: list[str] = []
    for rule in schema.get("x-kubernetes-validations") or []:
        if cel.evaluate(rule["rule"], {"self": instance}) is not True:
            errors.append(f"{path or '<root>'}: {rule['message']}")
    if isinstance(instance, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in instance:
                errors += api_server_errors(instance[key], sub, f"{path}.{key}".lstrip("."))
    if isinstance(instance, list) and isinstance(schema.get("items"), dict):
        if schema.get("x-kubernetes-list-type") == "map":
            keys = [tuple(i.get(k) for k in schema["x-kubernetes-list-map-keys"])
                    for i in instance if isinstance(i, dict)]
            errors += [f"{path}: duplicate entry {k}" for k in sorted(set(keys))
                       if keys.count(k) > 1]
        for i, item in enumerate(instance):
            errors += api_server_errors(item, schema["items"], f"{path}[{i}]")
    return errors


def rejections(doc: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    errors = schema_errors(doc, schema)
    return errors or api_server_errors(doc, schema)


def test_toolset_crd_is_a_valid_apiextensions_v1_object(toolset_crd: dict[str, Any]) -> None:
    kubernetes_validate.validate(toolset_crd, kubernetes_validate.latest_version(), strict=True)


def test_toolset_crd_identity(toolset_crd: dict[str, Any]) -> None:
    spec = toolset_crd["spec"]
    assert toolset_crd["metadata"]["name"] == "agenttxtoolsets.agenttx.io"
    assert spec["group"] == toolset_spec.GROUP and spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == toolset_spec.KIND == "AgentTxToolset"
    assert spec["names"]["plural"] == toolset_spec.PLURAL
    assert spec["names"]["shortNames"] == ["attool"]
    (version,) = spec["versions"]
    assert version["name"] == toolset_spec.VERSION
    assert version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}


def test_toolset_schema_is_structural(toolset_schema: dict[str, Any]) -> None:
    for path, node in _walk(toolset_schema):
        assert "type" in node, f"{path or '<root>'} has no type"
        assert not ("properties" in node and "additionalProperties" in node), path


def test_every_cel_rule_compiles(toolset_schema: dict[str, Any]) -> None:
    rules = [r for _, node in _walk(toolset_schema)
             for r in node.get("x-kubernetes-validations") or []]
    assert len(rules) == 3
    for rule in rules:
        cel.compile(rule["rule"])
        assert rule["message"]


def _node(schema: dict[str, Any], dotted: str) -> dict[str, Any]:
    node = schema
    for part in dotted.split("."):
        node = node["items"] if part == "[]" else node["properties"][part]
    return node


def test_toolset_schema_ranges_and_patterns_are_the_contract(
        toolset_schema: dict[str, Any]) -> None:
    spec = _node(toolset_schema, "spec")
    timeout = _node(spec, "upstream.timeoutSeconds")
    assert (timeout["minimum"], timeout["maximum"], timeout["default"]) == (
        contract.TIMEOUT_MIN_S, contract.TIMEOUT_MAX_S, contract.DEFAULT_TIMEOUT_S)
    assert _node(spec, "prefix")["pattern"] == contract.PREFIX_PATTERN
    tools = _node(spec, "tools")
    assert (tools["minItems"], tools["maxItems"]) == (1, contract.MAX_TOOLS)
    assert _node(spec, "tools.[].kind")["enum"] == list(contract.KINDS)
    assert _node(spec, "tools.[].name")["pattern"] == contract.TOOL_NAME_PATTERN
    assert _node(spec, "tools.[].compensate.tool")["pattern"] == contract.TOOL_NAME_PATTERN
    headers = _node(spec, "upstream.headers")
    assert headers["maxItems"] == contract.MAX_HEADERS
    assert _node(spec, "upstream.headers.[].name")["pattern"] == contract.HEADER_NAME_PATTERN
    # The file form's `file` / `value` are not for the CRD: a Secret or nothing.
    assert sorted(headers["items"]["properties"]) == ["name", "secretKeyRef"]
    assert headers["items"]["required"] == ["name", "secretKeyRef"]

    prefix_rule = _node(spec, "prefix")["x-kubernetes-validations"][0]["rule"]
    for reserved in contract.RESERVED_PREFIXES:
        assert cel.evaluate(prefix_rule, {"self": reserved}) is False, reserved
    assert cel.evaluate(prefix_rule, {"self": "tickets"}) is True

    (length_rule,) = spec["x-kubernetes-validations"]
    fits = {"prefix": "p", "tools": [{"name": "t" * (contract.MAX_TOOL_NAME_BYTES - 2)}]}
    too_long = {"prefix": "p", "tools": [{"name": "t" * (contract.MAX_TOOL_NAME_BYTES - 1)}]}
    assert cel.evaluate(length_rule["rule"], {"self": fits}) is True
    assert cel.evaluate(length_rule["rule"], {"self": too_long}) is False


def test_toolset_status_declares_what_the_operator_writes(
        toolset_schema: dict[str, Any]) -> None:
    for published in ((3, 5), None):
        status = toolset_status.build_status(
            {"publishedGeneration": 2, "tools": 4}, generation=3,
            reason=toolset_status.REASON_UPSTREAM_UNREACHABLE, message="down",
            now="2030-01-01T00:00:00Z", published=published, header_secret="ns/x")
        doc = {"apiVersion": "agenttx.io/v1alpha1", "kind": "AgentTxToolset",
               "metadata": {"name": "x"},
               "spec": {"upstream": {"url": "http://u/mcp"}, "prefix": "p",
                        "tools": [{"name": "t", "kind": "read"}]},
               "status": status}
        assert rejections(doc, toolset_schema) == []


def test_toolset_printer_columns(toolset_crd: dict[str, Any],
                                 toolset_schema: dict[str, Any]) -> None:
    (version,) = toolset_crd["spec"]["versions"]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    default = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert default == ["Upstream", "Tools", "Ready", "Age"]
    assert columns["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Reason"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].reason'
    for c in columns.values():
        if c["name"] in ("Ready", "Reason", "Age"):
            continue
        node = toolset_schema
        for part in c["jsonPath"].lstrip(".").split("."):
            node = node["properties"][part]
        assert node["type"] == c["type"], c


def test_there_are_valid_and_invalid_toolset_examples() -> None:
    assert [p.name for p in TOOLSETS_VALID] == ["mail.yaml", "tickets.yaml"]
    assert len(TOOLSETS_INVALID) >= 8
    for path in TOOLSETS_INVALID:
        assert path.read_text().startswith("# INVALID: "), path.name


@pytest.mark.parametrize("path", TOOLSETS_VALID, ids=lambda p: p.name)
def test_valid_toolset_example_is_accepted(path: pathlib.Path,
                                           toolset_schema: dict[str, Any]) -> None:
    doc = yaml.safe_load(path.read_text())
    assert rejections(doc, toolset_schema) == []
    toolset_spec.parse("team-a", doc["metadata"]["name"], 1, doc["spec"])


@pytest.mark.parametrize("path", TOOLSETS_INVALID, ids=lambda p: p.name)
def test_invalid_toolset_example_is_rejected_by_the_schema_and_the_operator(
        path: pathlib.Path, toolset_schema: dict[str, Any]) -> None:
    doc = yaml.safe_load(path.read_text())
    assert rejections(doc, toolset_schema), f"{path.name} passed the CRD schema"
    # ...and by the operator, for clusters where the schema was bypassed.
    with pytest.raises(contract.ToolsetError):
        toolset_spec.parse("team-a", doc["metadata"]["name"], 1, doc["spec"])


@pytest.mark.parametrize(("name", "message"), [
    ("invalid-saga-without-compensate.yaml",
     "spec.tools[0]: compensate is required for kind saga and allowed for no other kind"),
    ("invalid-compensate-on-read.yaml",
     "spec.tools[0]: compensate is required for kind saga and allowed for no other kind"),
    ("invalid-reserved-prefix.yaml",
     "spec.prefix: the prefixes agenttx, effect, fs, kv and record are AgentTx's own tools"),
    ("invalid-name-too-long.yaml",
     "spec: every <prefix>.<tool name> must fit in 128 bytes (AgentTx's tool_name limit)"),
    ("invalid-duplicate-tool.yaml", "spec.tools: duplicate entry ('search_tickets',)"),
])
def test_rules_beyond_json_schema_name_the_field(name: str, message: str,
                                                 toolset_schema: dict[str, Any]) -> None:
    doc = yaml.safe_load((ROOT / "examples/toolsets/invalid" / name).read_text())
    assert schema_errors(doc, toolset_schema) == []
    assert api_server_errors(doc, toolset_schema) == [message]
