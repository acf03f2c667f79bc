"""The 80% intervals: their limits (bounds) and their calibration (conformal)."""
