"""What the service and the operator agree on, in one place both import: the etcd key
layout, the published policy and toolset records, and the ranges their schemas enforce.

The operator (`agenttx_operator`) imports this package and the store's gateway, nothing
else of the service; import-linter holds that. A test checks that the CRDs, the chart's
copies and `values.schema.json` agree with the ranges defined here.
"""
