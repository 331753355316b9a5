"""Text analysis, part of the format (as in tantivy and Lucene): what a text value's terms are, and the
indexes built from them.

``lexical``        analysis: tokens, folding, stemming per language (``analyze``), the terms a value holds
``lexical_index``  the full-text index over the terms (tantivy; FTS5 in products format 1)
``spelling``       a version's vocabulary, for typo tolerance
``decompound``     compound words split into their parts (de, sv, nl, da, no, fi)
``language_id``    the language of a short text (queries, untagged values)
"""
