"""Session-affinity routing: policies, worker pool, HTTP proxy, multi-process cluster.

The files and what each does: server/routing/README.md.
"""
