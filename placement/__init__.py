"""Metastore-driven replica placement: the placement function, the etcd protocol, the driver."""
