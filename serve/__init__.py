"""Predictions as a service: Python predictor, HTTP API and Optuna plan search.

Filled in by the serving issue; imports collect and gnn.
"""
