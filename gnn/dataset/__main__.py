"""python -m gnn.dataset: build (or find cached) the graph dataset of every run under data/runs."""

from gnn.dataset.graphs import main

main()
