"""Everything that talks to something: the API server (calls, watch-fed caches, the Lease), the
work queue, the workers' `/progress` over HTTP, Prometheus. May import `api` and `decide`.
"""
