"""Consistency monitoring: probe sets and runs, run history, live traffic, ANN recall, the quality gate,
the dashboard's figures and report, and `ccrk probe`.

A layer of its own between the indexer and the service: it may use model and indexer (the index format),
never service (the indexer's quality gate runs here without the HTTP stack); the service's live monitor
(service/monitor.py) and its routes use it.
"""
