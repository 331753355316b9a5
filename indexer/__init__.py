"""Offline batch embedding of image collections into versioned FAISS indexes (see issue 4)."""
