"""What several benchmark scripts share: nearest-rank statistics (stats), Markdown tables and
target verdict rows (tables), and the control plane run as real `qlm` processes (plane)."""
