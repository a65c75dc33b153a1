"""The applications on top of the engines: JSONL in and out (`jsonl`), evaluation (`evaluation`),
distillation (`distill`), the decision tools over the Model Context Protocol (`mcp`) and the outbound
HTTP client they share (`outbound`)."""
