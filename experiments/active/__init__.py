"""Measuring less: how active collection compares with random sampling, replayed over measured pools and for real."""
