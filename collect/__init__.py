"""Measurement: the plan schema, real runs on local gloo ranks or under torchrun, and the store of measured rows."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]  # the checkout: data/, build/ and the embedded stores live under it
