"""Replica agents: host partition replicas and execute Rebalance/CancelRebalance idempotently."""
