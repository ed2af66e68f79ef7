"""Code that the benches (bench/) and the tests (tests/) share: harnesses either may run,
such as simulated generations on measured costs (simulated). No test code and no bench
script lives here; both import it from the repository root, as they import bench.
"""
