"""The simulated runtime: instances in memory, injectable faults."""
