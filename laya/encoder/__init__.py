"""The encoder side of a checkpoint: its tokenizer, the rows it reads and how rows are batched."""
