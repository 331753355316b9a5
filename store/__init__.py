"""The on-disk index store: layout and manifest, versions, metadata, the reader (query engine) and the
version writer. Needs numpy, faiss and the standard library only; everyone reads and writes index versions
through it."""
