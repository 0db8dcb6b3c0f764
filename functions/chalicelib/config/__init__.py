"""The control plane's configuration: settings from the environment and the resource catalogue."""
