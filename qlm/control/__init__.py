"""The control loop: snapshot, group, estimate, plan, publish (pure step in controller.py)."""

from qlm.control.controller import Controller, InstanceView, ReplanReason

__all__ = ["Controller", "InstanceView", "ReplanReason"]
