"""Entry points that produce the tables and plots saying how good and how fast plansight is (results/ and
LOG.md). Nothing in collect, gnn or serve imports this."""
