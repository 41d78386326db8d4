"""Fixtures shared by the tests and the benchmarks: synthetic archives (`archives`) and random valid
scenario texts (`scenarios`); and the pytest plugin that collects `.cps` files (`pytest_plugin`,
loaded by pytest through the `pytest11` entry point). No stage of cptest imports this package."""
