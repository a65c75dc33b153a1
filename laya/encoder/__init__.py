"""The encoder engine and everything it runs on: checkpoint loading, the tokenizer, the rows it reads
and how rows are batched, the Model, tournaments, and the runtimes (one adapter each)."""
