"""The search path, one shape for text, image and consistency searches (and the catalogue's image files,
which read the served version too).

A route calls ``SearchFacade`` (``facade``), which leases the served index version once, in the worker
thread doing the blocking work, and runs ``SearchPipeline`` (``pipeline``: language, filters, caches,
ranking, match labels) on it; the pipeline ranks through ``Ranker`` (``ranking``) and answers through
``ResponseBuilder`` (``responses``); the facade hands what a search did to ``SearchTelemetry``
(``telemetry``). Below them: the query text and cache digests (``query``) and filters parsed and checked
once (``filters``).
"""
