"""The local stack: the control plane on this machine (``modelforge local up``, the AWS emulator),
``modelforge log replay`` and ``modelforge infra package``, added to the ``modelforge`` command of
modelforge-cli through the ``modelforge.commands`` entry-point group (commands.py).

Top layer: it may import the deployables (the control plane's chalicelib, the node agent) and the
shared protocol package; nothing imports it but the tests, the benches and ``modelforge`` itself
(only when one of its commands runs).
"""
