"""Programs against call by call (issue 16): the benchmarks/programs/ package."""
