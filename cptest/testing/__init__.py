"""Fixtures shared by the tests and the benchmarks: synthetic archives (`archives`) and random valid
scenario texts (`scenarios`). No stage of cptest imports this package."""
