"""``python -m ccrk_cli``: the ``ccrk`` command where its console script is not installed (a checkout on
PYTHONPATH, as `make gpu-check` runs on a GPU image)."""

from ccrk_cli.main import app

app()
