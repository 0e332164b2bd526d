"""The experiments app: teams, sweeps of runs, their metrics and example completions."""
