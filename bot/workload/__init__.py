"""Workload shapes: what the traffic on an engine looks like, captured from the engine's own
/metrics (``capture``), stored as a small versioned file (``shape``), and compared (``diff``) to
say when production drifted from the shape a decision was measured under (docs/workload.md)."""
