"""The `modelforge` command line an admin installs (modelforge-cli): the admin API commands
(enrollments, nodes, work), the release bundle and admin-token helpers.

Top layer: it imports the shared protocol package and requests, never the control plane's code
or the local stack. Other distributions add commands through the ``modelforge.commands``
entry-point group (plugins.py); the local stack (modelforge_local_stack) adds local, log and infra.
"""
