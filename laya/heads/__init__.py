"""The decision head: tensor layout, and decoding its logits into System One answers."""
