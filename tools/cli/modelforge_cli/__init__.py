"""The `modelforge` command line: local stack, admin commands, state-log replay, packaging.

Top layer: it may import the deployables (the Chalice app in functions/) and the shared
protocol package; nothing imports it.
"""
