"""The AgentTx operator (`agenttx operator`): AgentTxPolicy and AgentTxToolset.

The decisions are pure functions over plain dicts, one module per idea: `policy_spec`
(validate a spec, normalise it into the published record), `sandboxes` (where a sandbox
is mounted, its claim), `mounts` (the service Deployment patch and its rollout),
`conditions` (the status), `lifecycle` (deletion, orphans, retry delays), `naming`
(objects in the service namespace); for toolsets `toolset_spec` (the published record,
the Secret keys, the prefix and tool checks), `projection` (the copy of the header
values and its read-only volume) and `toolset_status`. `handlers` and
`toolset_handlers` wire them to kopf; `kube`, `publishing` and `upstream` (MCP
tools/list) are the only modules that talk to the Kubernetes API, etcd and upstreams.
Never name a module or package here `operator`: it would shadow the standard library's.
"""
