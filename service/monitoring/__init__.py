"""Consistency monitoring: probe sets and runs, run history, live traffic, ANN recall, the quality gate."""
