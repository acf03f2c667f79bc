"""Published GPU measurements brought into plansight's row schema, one module per source (data/README.md names
each source, what was inferred and what could not be expressed)."""
