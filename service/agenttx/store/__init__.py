"""etcd access: the gateway (typed ops, CAS), the key layout, leases, the embedded etcd."""
