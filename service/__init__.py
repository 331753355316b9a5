"""The FastAPI search service (see issue 5)."""
