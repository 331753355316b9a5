"""The on-disk index store: layout and manifest, versions, metadata, the reader (query engine) and the
version writer, and sharded versions (``sharding``: the hash rule and manifest block; ``sharded``: the
reader over shards; ``merge``: merging per-shard results; ``sharded_writer``; ``opening``: one opener for
either kind). Needs numpy, faiss and the standard library only; everyone reads and writes index versions
through it."""
