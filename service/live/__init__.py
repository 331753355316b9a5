"""The live catalogue in the service: product writes through the API, recorded in each index's change log
(``store.live``) before they are acknowledged, and applied to the served version in every process.

``feed``     one index's log, read into the version it serves (on load, every poll, after a write)
``schemas``  the write routes' request and response models
``writes``   what a write route does: check the product and fields against the served version, append,
             wait until this process shows it
"""
