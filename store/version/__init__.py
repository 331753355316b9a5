"""The version format: one published, immutable version of an index and the files it holds.

``manifest``  what a version is (``manifest.json``) and the model it was built with
``versions``  the versions of an index: CURRENT, publishing, pruning, the quality gate's records
``metadata``  ``metadata.sqlite``: ids, paths, fields, deletions, and the filters over them
``writer``    staging and publishing a version (``VersionWriter``)
``reader``    an opened version (``IndexVersion``), its searches
``exact``     the exact reference searches
``reuse``     what a rebuild reuses rows by (content digests)
``sharding``  the hash rule of a sharded version's shards
"""
