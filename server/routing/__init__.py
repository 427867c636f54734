"""Session-affinity routing: policies, worker pool, HTTP proxy, multi-process cluster.

Module map:
  policy.py        RoutingPolicy interface (select_worker), Selection, registry
  rendezvous.py    affinity: rendezvous (HRW) hash of the session key + bounded load
  round_robin.py   round_robin: next healthy worker in turn (comparison baseline)
  least_loaded.py  least_loaded: fewest in-flight requests (comparison baseline)
  workers.py       WorkerPool: worker list, health checks, in-flight counts
  metrics.py       the router's Prometheus metrics (own CollectorRegistry)
  router.py        FastAPI proxy app (create_router_app) and serve_router
  cluster.py       serve_cluster: N worker processes + router on the public port
  fake_worker.py   a simulated worker (tests, benchmarks): no model, same API
"""
