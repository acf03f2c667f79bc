"""Predictions for users: the setup / decode / predict / encode steps (api), the shell command (cli), the HTTP
service (app, guard, schemas, client) and the plan search (search/). Imports collect and gnn."""
