"""The AgentTxPolicy operator (`agenttx operator`).

`reconcile` holds the decisions as pure functions over plain dicts; `handlers` wires
them to kopf; `kube` and `publishing` are the only modules that talk to the Kubernetes
API and to etcd. Never name a module or package here `operator`: it would shadow the
standard library's.
"""
