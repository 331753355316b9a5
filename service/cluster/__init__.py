"""Sharded serving on Ray Serve (``ccrk serve --engine ray``, issue 17): one deployment per shard of a
sharded version (``shard.ShardServer``), and the service's own FastAPI app as the ingress, searching the
shards through ``remote_index.RemoteShardedIndex`` (one parallel fan-out per search, merged by
``store.shards.merge.merge_topk``). ``deployments`` builds the Serve application. Nothing here imports Ray at
module level except ``deployments``; the rest of the service never imports this package."""
