"""Synthetic multilingual product catalogue: attributes, hand-written lexicons, rendering, generation."""
