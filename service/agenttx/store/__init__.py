"""etcd access: the gateway (`client`: typed ops, CAS, the only holder of the raw etcd
client), the one watch loop (`watch`), the one lease keeper and leader leases (`lease`)."""
