"""Autoscaling: how many instances each pool needs (need.py, from demand.py's recent arrivals
and the queued backlog), when a pool's size changes (replicas.py), and the two ways the
decision leaves the controller (gauges.py, kubernetes.py). README.md says more."""
