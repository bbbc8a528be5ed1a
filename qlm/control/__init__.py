"""Control: when and what to plan. controller.py is the pure step (snapshot -> plan),
plan.py the published plan agents read. Import from the modules (this package stays light:
the queue imports plan.py)."""
