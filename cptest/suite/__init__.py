"""`cptest suite`: many scenarios on one machine, concurrently where their servers fit together.

Shaped like the pipeline it drives:
    demand.py     what one planned scenario needs of the machine (GPUs and GPU memory, CPUs, ports,
                  whether it must run alone)
    machine.py    what the machine has (GPUs with their memory, CPUs, a port range)
    schedule.py   the packing: which scenario may start now and where (pure, no processes)
    runner.py     plans every scenario first (bad input: exit 2, nothing launched), then starts each
                  as its own `cptest run` process with the placement it was given, shows progress,
                  writes the suite record and the summary matrix, exits with the worst verdict

Each scenario's archive is exactly what a lone `cptest run` would have written, except that its
plan records the ports, GPUs and CPUs it ran on. docs/architecture.md §9 explains the whole.
"""
