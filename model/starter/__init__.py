"""The starter model: zero-shot ConSE over pretrained networks that ship inside PyPI packages."""
