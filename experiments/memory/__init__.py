"""Where memory predictions err, and how the fake-tensor tracer (collect.fake) was proved against real peaks."""
