"""Sharded versions: one version in several shards, each an ordinary version.

``sharded``         an opened sharded version (``ShardedIndex``): searches fanned out and merged
``sharded_writer``  staging and publishing a sharded version
``merge``           merging the shards' results
"""
