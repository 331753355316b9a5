"""The ``ccrk`` command: one entry point gathering the sub-commands of every package."""
