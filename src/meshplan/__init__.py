"""meshplan: plan, predict and run hybrid parallelism for large-model training.

Layers (dependencies point one way): spec -> cost -> sim -> search -> export / runtime / report, cli on top.
Only ``meshplan.runtime`` imports torch.
"""

__version__ = "0.1.0"
