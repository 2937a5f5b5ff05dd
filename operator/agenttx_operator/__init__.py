"""The AgentTxPolicy operator (`agenttx operator`).

The decisions are pure functions over plain dicts, one module per idea: `policy_spec`
(validate a spec, normalise it into the published record), `sandboxes` (where a sandbox
is mounted, its claim), `mounts` (the service Deployment patch and its rollout),
`conditions` (the status), `lifecycle` (deletion, orphans, retry delays). `handlers`
wires them to kopf; `kube` and `publishing` are the only modules that talk to the
Kubernetes API and to etcd. Never name a module or package here `operator`: it would
shadow the standard library's.
"""
