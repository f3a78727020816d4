"""What the chapters measure without a GPU: the cache's size (chapter 1), published model
configurations and workloads, and the simulations and cost models behind each chapter's
charts. Each prints its figures with ``python -m course.experiments.<name>`` where it has a
command."""
