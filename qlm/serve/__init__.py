"""The live control plane's processes: API, controller and agents, together or apart."""
