"""Programs of calls joined by variables (after Parrot): the graph, per-call deadlines and the
stored state. Pure, but for the store's protocol."""
