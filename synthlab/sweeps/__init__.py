"""Sweeps of experiment points: definitions, the runner protocol and the lab's runner, work units and executors, GPU scheduling, the driver, dry-run plan, cost, the results table."""
