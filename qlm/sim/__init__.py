"""The discrete-event simulator: the production policy code on a virtual clock."""
