"""What ``pulumi up`` and the docker provider do, emulated for tests and benchmarks."""
