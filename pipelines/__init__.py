"""Orchestration: Definitions, jobs, schedules, sensors, resources and the `k3` command line."""
