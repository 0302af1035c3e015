"""The bench harness: what the benches share (server processes, readiness probes, workloads,
statistics, the memory roofline). A bench imports from here, never from another bench."""
