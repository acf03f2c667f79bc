"""Entry points that produce the tables and plots saying how good plansight is. Nothing imports this."""
