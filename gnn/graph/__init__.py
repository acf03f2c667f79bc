"""A plan compiled into a distributed execution graph, without running it: its passes as table rows
(passes, step, template), what each stage holds (memory), and where the schedule places them (layout)."""
