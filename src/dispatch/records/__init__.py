"""Records: the durable job records dispatch keeps, whatever the cluster garbage-collects."""

from dispatch.records.store import Store

__all__ = ["Store"]
