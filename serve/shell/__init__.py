"""What the shell commands print for a person: tables of plans (scripts take `--json`)."""
