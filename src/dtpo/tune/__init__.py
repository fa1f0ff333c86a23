"""Tuning: the knobs a run can turn, the cost metrics that judge a setting, and the tuners that search.

Sits between ``session`` (which calls tuners between optimizer steps) and ``plan`` (whose models a tuner may
consult). Empty for now: later issues fill it.
"""
