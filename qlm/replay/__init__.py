"""`qlm replay`: a scenario's requests sent to a running QLM (or an embedded one on emulated
engines) through the public API at their arrival times, the outcomes written in the
simulator's schema and compared with `qlm simulate` on the same requests (qlm/replay/README.md)."""
