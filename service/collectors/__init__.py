"""The node agent: backends that read GPUs, job attribution, the spool and the shipper."""
