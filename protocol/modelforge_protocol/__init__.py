"""The ModelForge wire contract shared by the control plane, node agent and runtime worker.

This is the bottom layer: it imports nothing outside the standard library, and the
three deployables (functions/, agent/, worker/) import it, never each other.
"""
